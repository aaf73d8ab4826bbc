package analyzer

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/nodectl/nodectl/internal/human"
	"github.com/nodectl/nodectl/rundir"
)

// An agent window has no probe: a cgroup's slowdown is read from the kernel alone. Its tasks
// need wall time for each second of CPU they get: 1 + (run-queue wait / CPU time). The
// stretch is that figure in the window over the baseline's; a task bound by CPU is slowed by
// that factor.
const (
	// observedMinStretch: a smaller stretch is no slowdown worth a finding.
	observedMinStretch = 1.2
	// observedMaxStretch bounds the stretch of a cgroup that got almost no CPU in the window:
	// past it the figure says "stalled", not how much.
	observedMaxStretch = 1000
	// observedMaxCandidates bounds how many cgroups a window without an observed one examines,
	// the ones whose run-queue waits rose most.
	observedMaxCandidates = 8
)

// observedContention is cpu-contention for a cgroup with no probe (an agent window, docs/
// findings.md): its tasks waited longer for a CPU for each second of CPU they got, and its
// neighbours added most of that wait.
func (a *analysis) observedContention(v rundir.Workload) *Finding {
	if !a.compare {
		return nil
	}
	cw := a.cpuWaits(v.Cgroup)
	if !cw.byNeighbours() || !accountsFor(cw.pw.added, cw.added) {
		return nil
	}
	usage := a.run.Series(rundir.MetricCPUUsage).Cgroup(v.Cgroup)
	uB, uS := usage.Delta(a.baseline), usage.Delta(a.stress)
	wB, wS := secs(cw.rb.SumNs), secs(cw.rs.SumNs)
	stretchB, stretchS := stretch(wB, uB), stretch(wS, uS)
	if uB == 0 && uS == 0 {
		// No CPU usage sampled (a v1 cgroup outside the cpuacct hierarchy): the stretch of a
		// task that would run all the time, 1 + its wait a second.
		stretchB, stretchS = 1+cw.perSecB, 1+cw.perSecS
	}
	slowdown := min(ratio(stretchS, stretchB), observedMaxStretch)
	if slowdown < observedMinStretch {
		return nil
	}
	rb, rs, pw := cw.rb, cw.rs, cw.pw
	f := &Finding{
		ID: IDCPUContention, Severity: severity(slowdown), Victim: v.Name,
		Evidence: []Evidence{
			a.evidence("runq_wait_per_cpu_second", v.Name, stretchB-1, stretchS-1, UnitRatio),
			a.evidence("cpu_usage_seconds", v.Name, uB, uS, UnitSeconds),
			a.evidence("runq_wait_seconds", v.Name, wB, wS, UnitSeconds),
			a.evidence("runq_wait_per_second", v.Name, cw.perSecB, cw.perSecS, UnitRatio),
			a.evidence("runq_latency_p99", v.Name, rb.Quantile(0.99), rs.Quantile(0.99), UnitSeconds),
			a.evidence("runq_latency_max_at_least", v.Name, rb.LongestAtLeast(), rs.LongestAtLeast(), UnitSeconds),
			a.evidence("runq_neighbour_wait_share", v.Name, ratio(pw.neighbourB, pw.attributedB), cw.share, UnitRatio),
		},
	}
	a.blame(f, v.Name, pw)
	f.Summary = fmt.Sprintf("%s got slower because %s held its CPU: each second of CPU its tasks got cost %s of "+
		"run-queue wait in the window against %s before it (×%.1f wall time for the same work, if CPU-bound). "+
		"Neighbours account for %s of its waits after a preemption and its run-queue p99 went %s → %s.",
		v.Name, joinNames(f.Culprits), human.Seconds(stretchS-1), human.Seconds(stretchB-1), slowdown,
		human.Percent(cw.share), human.Seconds(rb.Quantile(0.99)), human.Seconds(rs.Quantile(0.99)))
	if longest := rs.LongestAtLeast(); longest >= stallMinSeconds {
		f.Summary += fmt.Sprintf(" One wait lasted at least %s: a stall no fair share explains at any weight but a tiny one.", human.Seconds(longest))
	}
	f.Summary += " Give it a larger CPU request (weight) or dedicated cores, or move or limit the culprits."
	return f
}

// stretch is the wall time a second of CPU work needed: 1 + wait/cpu (no CPU at all but a
// wait: the bound).
func stretch(wait, cpu float64) float64 {
	if cpu <= 0 {
		if wait > 0 {
			return observedMaxStretch
		}
		return 1
	}
	return 1 + wait/cpu
}

// observedCandidates are the cgroups an agent window without an observed workload examines:
// those whose run-queue wait rose over the baseline's rate (most added first), then those whose
// traced I/O got slower (largest rise first), at most observedMaxCandidates of each, as
// workloads named by their pod, else their path.
func (a *analysis) observedCandidates() []rundir.Workload {
	if !a.compare {
		return nil
	}
	var rises []share
	for cg, ss := range a.run.Series(rundir.MetricRunqLatency).ByCgroup() {
		if !observable(cg) {
			continue
		}
		h := ss.HistDelta(a.stress)
		if more := a.added(secs(ss.HistDelta(a.baseline).SumNs), secs(h.SumNs)); more >= neighbourWaitMinSeconds {
			rises = append(rises, share{cgroup: cg, value: more})
		}
	}
	var out []rundir.Workload
	seen := map[string]bool{}
	for _, list := range [][]share{rises, a.ioRises()} {
		slices.SortFunc(list, func(x, y share) int {
			return cmp.Or(cmp.Compare(y.value, x.value), cmp.Compare(x.cgroup, y.cgroup))
		})
		for _, r := range list[:min(len(list), observedMaxCandidates)] {
			if !seen[r.cgroup] {
				seen[r.cgroup] = true
				out = append(out, rundir.Workload{Name: a.name(r.cgroup), Kind: rundir.KindObserved, Cgroup: r.cgroup})
			}
		}
	}
	return out
}

// observable: a cgroup's own path, not the root's or an aggregate's (<idle>, <other>).
func observable(cg string) bool { return cg != "" && cg[0] != '<' }

// ioRises are the cgroups whose own traced I/O on their busiest device got slower, by how much
// (ioChange's test on each cgroup's own series: one pass, however many cgroups).
func (a *analysis) ioRises() []share {
	var out []share
	seen := map[string]bool{}
	for _, th := range tracedHists {
		for cg, ss := range a.run.Series(th.metric).ByCgroup() {
			if !observable(cg) || seen[cg] {
				continue
			}
			device := busiestDevice(ss, a.stress)
			if device == "" {
				continue
			}
			own := ss.Label(rundir.LabelDevice, device)
			if c, ok := compareHist(own.HistDelta(a.baseline), own.HistDelta(a.stress)); ok && c.slowed() {
				seen[cg] = true
				out = append(out, share{cgroup: cg, value: c.slowdown()})
			}
		}
	}
	return out
}

// observedRules explain a cgroup with no probe.
var observedRules = []workloadRule{(*analysis).cpuThrottling, (*analysis).observedContention, (*analysis).diskContention}

// observedRule examines an agent window's cgroups when it names none: each one whose waits
// rose or whose I/O got slower, by the observed cgroup's rules.
func (a *analysis) observedRule(rep *Report) {
	for _, w := range a.run.Meta.Workloads {
		if w.Kind == rundir.KindObserved {
			return
		}
	}
	for _, w := range a.observedCandidates() {
		a.names[w.Cgroup] = w.Name
		for _, rule := range observedRules {
			if f := rule(a, w); f != nil {
				rep.Findings = append(rep.Findings, *f)
			}
		}
	}
}
