package analyzer

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/aclements/go-moremath/mathx"
	"github.com/aclements/go-moremath/stats"

	"github.com/nodectl/nodectl/internal/human"
)

// Whether a victim's probe got slower is judged from the run's own iterations: how far the
// stress phase's readings sit above the baseline's, given how many there are and how widely the
// baseline's spread. docs/findings.md ("Did the victim get slower?") explains the tests.
const (
	// probeRiseFactor: the p50 of the stress iterations over the baseline's, for a slower body.
	probeRiseFactor = 1.2
	// tailRiseFactor: the p95 of the stress iterations over the baseline's, for a slower tail.
	tailRiseFactor = 1.5
	// probeMinRiseSeconds: a smaller rise of a p50 or a p95 is noise, whatever its factor.
	probeMinRiseSeconds = 0.005
	// probeAlpha: a rise counts only when the chance of one at least as large, were the stress
	// iterations drawn from the baseline's distribution, is at most this (one-sided). Each of the
	// victim's three measures is tested twice (body and tail), so each test's p-value is
	// multiplied by six (Bonferroni) before it is held against probeAlpha: a victim none of whose
	// measures changed is called slower at most 5 % of the time. Per measure alone it was 5 %
	// each, nearly 15 % a victim: CI runs of harmless neighbours (TestHarmlessRunsHaveNoFinding)
	// found "fsync p50 1.3x: a 3% chance" twice in a few runs.
	probeAlpha = 0.05
	// probeTests is how many tests a victim's measures get together.
	probeTests = 2 * 3
)

// probeMeasure is one of the victim probe's timed operations.
type probeMeasure struct {
	key   string // its name in a finding's affects and, as probe_<key>_*, in evidence
	label string // for a person
}

// The probe's measures, in the order a finding lists them.
var (
	measureCPUWork    = probeMeasure{"cpu_work", "CPU work"}
	measureWriteFsync = probeMeasure{"write_fsync", "write+fsync"}
	measureFsync      = probeMeasure{"fsync", "fsync"} //rundir:other: a findings value
)

// affectsBlkRequests is what a disk-contention finding affects when a cgroup without a probe
// or a traced fsync that rose has slower block requests of its own (tracedRequests).
const affectsBlkRequests = "blk_requests"

// rise is how a distribution of times changed from the baseline to the stress phase, and the
// chance of each part's rise: a probe measure's iterations (probeChange) or a tracer's
// histogram (histChange) alike.
type rise struct {
	p50B, p50S, p95B, p95S float64
	// bodyP is the one-sided Mann-Whitney U test's p-value that the stress phase's times tend
	// to be longer than the baseline's, tailP the exceedance test's; both are adjusted for the
	// two tests.
	bodyP, tailP float64
}

// bodyRose: the typical time got longer.
func (r rise) bodyRose() bool {
	return ratio(r.p50S, r.p50B) >= probeRiseFactor && r.p50S-r.p50B >= probeMinRiseSeconds && r.bodyP <= probeAlpha
}

// tailRose: the long times got longer.
func (r rise) tailRose() bool {
	return ratio(r.p95S, r.p95B) >= tailRiseFactor && r.p95S-r.p95B >= probeMinRiseSeconds && r.tailP <= probeAlpha
}

// slowed: the body or the tail got slower.
func (r rise) slowed() bool { return r.bodyRose() || r.tailRose() }

// slowdown is the factor that sets a finding's severity: the larger of the rises that count.
func (r rise) slowdown() float64 {
	s := 0.0
	if r.bodyRose() {
		s = ratio(r.p50S, r.p50B)
	}
	if r.tailRose() {
		s = max(s, ratio(r.p95S, r.p95B))
	}
	return s
}

// chance is the p-value of the rise that counts (the smaller when both do).
func (r rise) chance() float64 {
	p := 1.0
	if r.bodyRose() {
		p = r.bodyP
	}
	if r.tailRose() {
		p = min(p, r.tailP)
	}
	return p
}

// probeChange compares one measure's iterations in the stress phase with the baseline's.
type probeChange struct {
	measure probeMeasure
	nB, nS  int
	// rise's bodyP weighs every iteration and the overlap of the two phases.
	rise
	// above counts the stress iterations slower than every baseline one by more than
	// probeMinRiseSeconds, and tailP is the chance of at least that many were both phases alike
	// (Rosenbaum's exceedance test, of which counting past the slowest plus a margin is a
	// stricter version: its chance is an upper bound): a tail that grew puts iterations beyond
	// anything the baseline did. Without the margin, a body shifted by a millisecond put 6 of 8
	// past the slowest while one outlier made the p95 1.6x: a shift and an outlier, not a tail.
	above int
	// excessB and excessS sum how far each iteration of the phase lay above the baseline's
	// median: the time the measure lost, which a cause must account for.
	excessB, excessS float64
}

// compareProbe compares a measure's baseline and stress iterations; ok is false when a phase
// has none.
func compareProbe(m probeMeasure, base, stress []float64) (probeChange, bool) {
	if len(base) == 0 || len(stress) == 0 {
		return probeChange{}, false
	}
	c := probeChange{
		measure: m, nB: len(base), nS: len(stress),
		rise: rise{p50B: quantile(base, 0.5), p50S: quantile(stress, 0.5),
			p95B: quantile(base, 0.95), p95S: quantile(stress, 0.95), bodyP: 1},
	}
	// The test fails only when every reading is the same: no rise at all.
	if u, err := stats.MannWhitneyUTest(stress, base, stats.LocationGreater); err == nil {
		c.bodyP = min(1, probeTests*u.P)
	}
	slowest := slices.Max(base)
	for _, v := range stress {
		if v > slowest+probeMinRiseSeconds {
			c.above++
		}
	}
	c.tailP = min(1, probeTests*exceedanceChance(c.nB, c.nS, c.above))
	c.excessB, c.excessS = excess(base, c.p50B), excess(stress, c.p50B)
	return c, true
}

// exceedanceChance is the chance that at least k of m draws exceed all of n earlier draws of
// the same distribution: that the k largest of all n+m are all among the m, C(m,k)/C(n+m,k).
func exceedanceChance(n, m, k int) float64 {
	if k <= 0 {
		return 1
	}
	return math.Exp(mathx.Lchoose(m, k) - mathx.Lchoose(n+m, k))
}

// describe says how the measure changed, which part of it rose, and how sure that is: e.g.
// "CPU work p95 72ms → 529ms (7.3x) while its p50 went 69.8ms → 83.6ms (1.2x): the tail slowed
// (p95 of 11 iterations against 6 in the baseline, 11 of them over 5ms slower than every baseline one: a
// 0.0081% chance if nothing had changed)".
func (c probeChange) describe() string {
	p50 := fmt.Sprintf("p50 %s → %s (%s)", human.Seconds(c.p50B), human.Seconds(c.p50S), human.Factor(ratio(c.p50S, c.p50B)))
	p95 := fmt.Sprintf("p95 %s → %s (%s)", human.Seconds(c.p95B), human.Seconds(c.p95S), human.Factor(ratio(c.p95S, c.p95B)))
	var what, how string
	switch {
	case c.bodyRose() && c.tailRose():
		what = fmt.Sprintf("%s %s, %s", c.measure.label, p50, p95)
		how = fmt.Sprintf("%d stress iterations against %d in the baseline", c.nS, c.nB)
	case c.tailRose():
		what = fmt.Sprintf("%s %s while its %s: the tail slowed", c.measure.label, p95, strings.Replace(p50, "p50", "p50 went", 1))
		how = fmt.Sprintf("p95 of %d iterations against %d in the baseline", c.nS, c.nB)
	default:
		what = fmt.Sprintf("%s %s", c.measure.label, p50)
		how = fmt.Sprintf("p50 of %d iterations against %d in the baseline", c.nS, c.nB)
	}
	if c.tailRose() {
		how += fmt.Sprintf(", %d of them over %s slower than every baseline one", c.above, human.Seconds(probeMinRiseSeconds))
	}
	return fmt.Sprintf("%s (%s: a %s chance if nothing had changed)", what, how, human.Percent(c.chance()))
}

// evidence lists the measure's p50, p95, iterations and the chance of its rise.
func (c probeChange) evidence(a *analysis, workload string) []Evidence {
	prefix := "probe_" + c.measure.key
	return []Evidence{
		a.evidence(prefix+"_p50", workload, c.p50B, c.p50S, UnitSeconds),
		a.evidence(prefix+"_p95", workload, c.p95B, c.p95S, UnitSeconds),
		a.evidence(prefix+"_iterations", workload, float64(c.nB), float64(c.nS), UnitCount),
		a.evidence(prefix+"_rise_chance", workload, 0, c.chance(), UnitRatio),
	}
}

// minChance is the smallest p-value any rise of a measure can reach with nB and nS iterations:
// every stress iteration slower than every baseline one, 1/C(nB+nS, nS), adjusted for the
// measure's two tests. Above probeAlpha, no slowdown of that measure can count.
func minChance(nB, nS int) float64 { return min(1, probeTests*exceedanceChance(nB, nS, nS)) }

// lost is the time the measure lost in the stress phase: how far its iterations lay above the
// baseline's median, less what the baseline's own iterations lay above it, scaled by the
// iterations each phase had (an overrunning iteration delays the next, so a slowed phase has
// fewer). It is what a cause must account for.
func (c probeChange) lost() float64 {
	return max(0, c.excessS-c.excessB*float64(c.nS)/float64(c.nB))
}

// onPath keeps the measures whose times add up without overlap: fsync lies inside write+fsync,
// so it counts only without it.
func onPath(changes []probeChange) []probeChange {
	whole := slices.ContainsFunc(changes, func(c probeChange) bool { return c.measure == measureWriteFsync })
	return slices.DeleteFunc(slices.Clone(changes), func(c probeChange) bool { return whole && c.measure == measureFsync })
}

// topTailChance tests whether the stress values crowd the top of the pooled values: of the
// pooled values above the one at rank ceil(share * all) from the top, x are stress values, and
// p is the chance of at least that many were both phases alike (hypergeometric; ties at the
// boundary count against the stress phase). One outlier in the baseline moves the boundary by
// one value, not to the outlier, as it would Rosenbaum's count.
func topTailChance(base, stress []float64, share float64) (x int, p float64) {
	pooled := append(slices.Clone(base), stress...)
	slices.Sort(pooled)
	t := max(1, int(math.Ceil(share*float64(len(pooled)))))
	bound := pooled[len(pooled)-t]
	above := 0
	for _, v := range pooled {
		if v > bound {
			above++
		}
	}
	for _, v := range stress {
		if v > bound {
			x++
		}
	}
	if x == 0 {
		return 0, 1
	}
	d := stats.HypergeometicDist{N: len(pooled), K: len(stress), Draws: above}
	return x, 1 - d.CDF(float64(x-1))
}
