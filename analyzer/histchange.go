package analyzer

import (
	"fmt"
	"math"

	"github.com/nodectl/nodectl/internal/human"
	"github.com/nodectl/nodectl/rundir/hist"
)

// A cgroup without a probe has only the tracers' histograms: its fsyncs' or block requests'
// latencies, in log2 buckets, summed over each phase. Whether they got slower is judged as a
// probe's iterations are (change.go), from the window's own events: a rise of the p50 or the
// p95 by the probe's factors that the events make unlikely by chance, the body by a
// Mann-Whitney U test on the buckets (events in one bucket are ties), the tail by counting the
// window's events in buckets above the baseline's highest (each larger than every baseline
// event). Bucket bounds replace the probe's 5 ms margin past the slowest baseline event: an
// event one bucket up is larger, by up to twice, and the p95's own rise must pass 5 ms too.
// Each histogram gets the two tests (histTests).
const histTests = 2

// histChange compares one histogram's events in the stress phase with the baseline's.
type histChange struct {
	nB, nS uint64
	rise
	above uint64 // stress events in buckets above the baseline's highest
}

// compareHist compares the phases' histograms; ok is false when a phase has no event.
func compareHist(base, stress hist.Log2) (histChange, bool) {
	nB, nS := bucketTotal(base), bucketTotal(stress)
	if nB == 0 || nS == 0 {
		return histChange{}, false
	}
	c := histChange{nB: nB, nS: nS, rise: rise{
		p50B: base.Quantile(0.5), p50S: stress.Quantile(0.5),
		p95B: base.Quantile(0.95), p95S: stress.Quantile(0.95),
		bodyP: min(1, histTests*mannWhitneyGreater(base.Buckets, stress.Buckets)),
	}}
	for i := len(base.Buckets); i < len(stress.Buckets); i++ {
		c.above += stress.Buckets[i]
	}
	c.tailP = min(1, histTests*exceedanceChance(int(nB), int(nS), int(c.above)))
	return c, true
}

func bucketTotal(h hist.Log2) uint64 {
	var n uint64
	for _, c := range h.Buckets {
		n += c
	}
	return n
}

// mannWhitneyGreater is the one-sided p-value that the events counted in stress tend to be
// larger than those in base, by the U test's normal approximation with the correction for ties
// (every event of a bucket ties with the others there) and for continuity. All events in one
// bucket give 1.
func mannWhitneyGreater(base, stress []uint64) float64 {
	n := max(len(base), len(stress))
	at := func(b []uint64, i int) float64 {
		if i < len(b) {
			return float64(b[i])
		}
		return 0
	}
	var nB, nS, u, ties, below float64
	for i := range n {
		b, s := at(base, i), at(stress, i)
		u += s * (below + b/2)
		below += b
		nB += b
		nS += s
		t := b + s
		ties += t*t*t - t
	}
	total := nB + nS
	variance := nB * nS / 12 * ((total + 1) - ties/(total*(total-1)))
	if variance <= 0 {
		return 1
	}
	z := (u - nB*nS/2 - 0.5) / math.Sqrt(variance)
	return 0.5 * math.Erfc(z/math.Sqrt2)
}

// describe says how the events changed: e.g. "its traced fsync p50 70ms → 90ms (1.3x), p95
// 79ms → 401ms (5.1x) (412 fsyncs in the window phase against 388 in the baseline, 61 of them past
// every baseline one: a 0.01% chance if nothing had changed)".
func (c histChange) describe(what, events, phase string) string {
	return fmt.Sprintf("%s p50 %s → %s (%s), p95 %s → %s (%s) (%d %s in the %s phase against %d in the baseline, "+
		"%d of them past every baseline one: a %s chance if nothing had changed)",
		what, human.Seconds(c.p50B), human.Seconds(c.p50S), human.Factor(ratio(c.p50S, c.p50B)),
		human.Seconds(c.p95B), human.Seconds(c.p95S), human.Factor(ratio(c.p95S, c.p95B)),
		c.nS, events, phase, c.nB, c.above, human.Percent(c.chance()))
}

// evidence lists the histogram's p50, p95, event counts and the chance of its rise, as
// <prefix>_p50 and so on.
func (c histChange) evidence(a *analysis, prefix, workload string) []Evidence {
	return []Evidence{
		a.evidence(prefix+"_p50", workload, c.p50B, c.p50S, UnitSeconds),
		a.evidence(prefix+"_p95", workload, c.p95B, c.p95S, UnitSeconds),
		a.evidence(prefix+"_events", workload, float64(c.nB), float64(c.nS), UnitCount),
		a.evidence(prefix+"_rise_chance", workload, 0, c.chance(), UnitRatio),
	}
}
