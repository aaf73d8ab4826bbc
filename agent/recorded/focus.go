package recorded

import (
	"cmp"
	"maps"
	"slices"
	"time"

	"github.com/nodectl/nodectl/rundir"
)

// focusEach is how many cgroups each of focus's rankings adds to an incident's analysis.
const focusEach = 16

// focusFrom: on a node of fewer cgroups than this an incident's analysis reads them all.
const focusFrom = 64

// focusMetrics are the series focus ranks cgroups by, in the window: CPU used (who ran),
// run-queue waits (who waited), memory grown, major faults and refaults (who paged), and the
// preemptors of the incident's cgroup.
var focusMetrics = map[string]bool{
	rundir.MetricCPUUsage: true, rundir.MetricRunqLatency: true, rundir.MetricMemoryUsage: true,
	rundir.MetricMemoryMajorFaults: true, rundir.MetricMemoryRefaults: true,
	rundir.MetricRunqPreemptWait: true, rundir.MetricRunqWakeupWait: true,
}

// pairMetrics are the focusMetrics of a victim's wait per preemptor.
var pairMetrics = map[string]bool{rundir.MetricRunqPreemptWait: true, rundir.MetricRunqWakeupWait: true}

// focus returns the cgroups an incident's analysis reads in full on a node of many: the
// incident's own, the daemons', the preemptors of the incident's cgroup, and the cgroups that
// rank among the focusEach first by each of focusMetrics' rises in the window. It reads the
// window's edges of those series only, into a few numbers per cgroup, so that the analysis
// holds the records of tens of cgroups rather than of every cgroup of the node: at 1,000
// cgroups reading them all cost the agent seconds of CPU and its RSS budget
// (BenchmarkIncidentAnalysis). It returns nil, for all, on a node of fewer than focusFrom.
func (w Window) focus(src Source, agent rundir.Meta) (map[string]bool, error) {
	type span struct{ first, last float64 }
	type ranking struct{ metric, kind string }
	rises := map[ranking]map[string]*span{} // -> cgroup (the preemptor, for pairs) -> its span
	all := map[string]bool{}
	inWindow := false
	// Only the rankings' series are read, and of the pairs only the incident cgroup's.
	keep := func(cgroup, metric string) bool {
		return focusMetrics[metric] && (!pairMetrics[metric] || cgroup == w.Cgroup)
	}
	err := w.read(src, time.Duration(agent.Interval), 2, keep, func(r rundir.Record) error {
		if r.Type == rundir.TypePhase {
			inWindow = r.Name == rundir.PhaseWindow && r.Event == rundir.EventStart
			return nil
		}
		if r.Type != rundir.TypeSample || r.Cgroup == "" {
			return nil
		}
		all[r.Cgroup] = true
		if !inWindow || !focusMetrics[r.Metric] {
			return nil
		}
		var v float64
		switch {
		case r.Hist != nil:
			v = float64(r.Hist.SumNs)
		case r.Value != nil:
			v = *r.Value
		default:
			return nil
		}
		metric, cg := ranking{r.Metric, r.Labels[rundir.LabelKind]}, r.Cgroup
		if p := r.Labels[rundir.LabelPreemptor]; p != "" {
			if cg != w.Cgroup {
				return nil
			}
			cg = p // the incident cgroup's preemptors, ranked by its wait
		}
		byCg := rises[metric]
		if byCg == nil {
			byCg = map[string]*span{}
			rises[metric] = byCg
		}
		if s := byCg[cg]; s != nil {
			s.last = v // a series' samples come in time order
		} else {
			byCg[cg] = &span{first: v, last: v}
		}
		return nil
	}, func(time.Time) {})
	if err != nil || len(all) < focusFrom {
		return nil, err
	}
	kept := map[string]bool{w.Cgroup: true}
	for _, d := range agent.Workloads {
		kept[d.Cgroup] = true
	}
	for _, byCg := range rises {
		ranked := slices.SortedFunc(maps.Keys(byCg), func(a, b string) int {
			return cmp.Or(cmp.Compare(byCg[b].last-byCg[b].first, byCg[a].last-byCg[a].first), cmp.Compare(a, b))
		})
		for _, cg := range ranked[:min(focusEach, len(ranked))] {
			if byCg[cg].last > byCg[cg].first {
				kept[cg] = true
			}
		}
	}
	return kept, nil
}
