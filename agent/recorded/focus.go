package recorded

import (
	"cmp"
	"maps"
	"slices"
	"time"

	"github.com/nodectl/nodectl/rundir"
)

// focusEach is how many cgroups each of focus's rankings adds to an incident's analysis;
// focusIOEach, fewer, each of its I/O rankings (three of them, whose cgroups the others often
// hold already): 16 each took the analysis at 1,000 cgroups from 82 cgroups in focus to 111
// and its RSS up by 3 MiB, to the agent's memory limit (BenchmarkIncidentAnalysis).
const (
	focusEach   = 16
	focusIOEach = 8
)

// focusFrom: on a node of fewer cgroups than this an incident's analysis reads them all.
const focusFrom = 64

// focusMetrics are the series focus ranks cgroups by, in the window: CPU used (who ran),
// run-queue waits (who waited), memory grown, major faults and refaults (who paged), time in
// fsync and in the block queue (whose I/O waited), block bytes (who loaded a disk), and the
// preemptors of the incident's cgroup.
var focusMetrics = map[string]bool{
	rundir.MetricCPUUsage: true, rundir.MetricRunqLatency: true, rundir.MetricMemoryUsage: true,
	rundir.MetricMemoryMajorFaults: true, rundir.MetricMemoryRefaults: true,
	rundir.MetricFsyncLatency: true, rundir.MetricBlkQueue: true, rundir.MetricBlkBytes: true,
	rundir.MetricRunqPreemptWait: true, rundir.MetricRunqWakeupWait: true,
}

// ioMetrics are the focusMetrics of I/O, ranked to focusIOEach.
var ioMetrics = map[string]bool{rundir.MetricFsyncLatency: true, rundir.MetricBlkQueue: true, rundir.MetricBlkBytes: true}

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
	// A cgroup's series of one ranking (one per device and op or syscall) each have their span;
	// the cgroup ranks by their rises' sum. The kind label is the ranking's; a preemptor is
	// the cgroup's. Keyed without building a string at every record.
	type series struct{ cgroup, device, op string }
	rises := map[ranking]map[series]*span{} // -> cgroup (the preemptor, for pairs), labels -> its span
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
		bySeries := rises[metric]
		if bySeries == nil {
			bySeries = map[series]*span{}
			rises[metric] = bySeries
		}
		key := series{cg, r.Labels[rundir.LabelDevice], r.Labels[rundir.LabelOp] + r.Labels[rundir.LabelSyscall]}
		if s := bySeries[key]; s != nil {
			s.last = v // a series' samples come in time order
		} else {
			bySeries[key] = &span{first: v, last: v}
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
	for metric, bySeries := range rises {
		rise := map[string]float64{}
		for k, s := range bySeries {
			rise[k.cgroup] += s.last - s.first
		}
		ranked := slices.SortedFunc(maps.Keys(rise), func(a, b string) int {
			return cmp.Or(cmp.Compare(rise[b], rise[a]), cmp.Compare(a, b))
		})
		each := focusEach
		if ioMetrics[metric.metric] {
			each = focusIOEach
		}
		for _, cg := range ranked[:min(each, len(ranked))] {
			if rise[cg] > 0 {
				kept[cg] = true
			}
		}
	}
	return kept, nil
}
