package analyzer

import (
	"cmp"
	"slices"

	"github.com/nodectl/nodectl/rundir"
)

// rankingSize is how many cgroups each ranking lists.
const rankingSize = 10

// Summary tabulates the run: each workload in each phase, and the cgroups that waited, synced
// and wrote the most.
type Summary struct {
	Phases    []rundir.Window `json:"phases"`
	Workloads []WorkloadPhase `json:"workloads"`
	Ranking   Ranking         `json:"ranking"`
}

// WorkloadPhase is one workload in one phase.
type WorkloadPhase struct {
	Workload         string      `json:"workload"`
	Kind             string      `json:"kind"`
	Phase            string      `json:"phase"`
	Seconds          float64     `json:"seconds"`           // the phase's length
	CPUCores         float64     `json:"cpu_cores"`         // CPU time used per second
	ThrottledRatio   float64     `json:"throttled_ratio"`   // throttled CFS periods over periods
	ThrottledSeconds float64     `json:"throttled_seconds"` // time its quota held it throttled
	RunqP99          float64     `json:"runq_p99_seconds"`
	RunqWait         float64     `json:"runq_wait_seconds"` // total run-queue wait of its tasks
	IOBytes          float64     `json:"io_bytes"`          // block I/O it issued, all devices
	FsyncP95         float64     `json:"fsync_p95_seconds"` // traced fsync latency, all devices
	Probe            *ProbeStats `json:"probe,omitempty"`   // a victim's own measurements
	// A heartbeat probe's lateness, p99 and worst, over its beats in the phase; absent
	// for other workloads.
	HeartbeatLatenessP99 float64 `json:"heartbeat_lateness_p99_seconds,omitempty"`
	HeartbeatLatenessMax float64 `json:"heartbeat_lateness_max_seconds,omitempty"`
}

// ProbeStats are a victim probe's per-iteration timings in one phase.
type ProbeStats struct {
	Iterations    int     `json:"iterations"`
	CPUWorkP50    float64 `json:"cpu_work_p50_seconds"`
	CPUWorkP95    float64 `json:"cpu_work_p95_seconds"`
	WriteFsyncP50 float64 `json:"write_fsync_p50_seconds"`
	WriteFsyncP95 float64 `json:"write_fsync_p95_seconds"`
	FsyncP95      float64 `json:"fsync_p95_seconds"`
}

// Ranking lists the cgroups that stood out in one window: the stress phase, or the whole run
// when it has none.
type Ranking struct {
	Window   string   `json:"window"`
	RunqWait []Ranked `json:"runq_wait"` // by total run-queue wait, seconds
	Fsync    []Ranked `json:"fsync"`     // by fsync p95, seconds; Count is the fsyncs
	IOBytes  []Ranked `json:"io_bytes"`  // by block I/O issued, bytes
}

// Ranked is one cgroup in a ranking.
type Ranked struct {
	Cgroup   string  `json:"cgroup"`
	Workload string  `json:"workload,omitempty"`
	Value    float64 `json:"value"`
	Count    uint64  `json:"count,omitempty"`
}

func (a *analysis) summary() Summary {
	s := Summary{Phases: a.windows, Workloads: []WorkloadPhase{}}
	for _, wl := range a.run.Meta.Workloads {
		for _, w := range a.windows {
			if wl.Kind == rundir.KindWake && w.Name != wl.Name {
				continue // a wake start is summarised over its own boot only
			}
			s.Workloads = append(s.Workloads, a.workloadPhase(wl, w))
		}
	}
	s.Ranking = a.ranking(a.focus())
	return s
}

// focus is the window a run is ranked and diffed by: the stress phase, else the whole run.
func (a *analysis) focus() rundir.Window {
	if a.stress.Name != "" {
		return a.stress
	}
	return a.run.Span()
}

func (a *analysis) workloadPhase(wl rundir.Workload, w rundir.Window) WorkloadPhase {
	of := func(metric string) rundir.SeriesSet { return a.run.Series(metric).Cgroup(wl.Cgroup) }
	runq := of(rundir.MetricRunqLatency).HistDelta(w)
	wp := WorkloadPhase{
		Workload: wl.Name, Kind: wl.Kind, Phase: w.Name, Seconds: w.Seconds(),
		CPUCores:         ratio(of(rundir.MetricCPUUsage).Delta(w), w.Seconds()),
		ThrottledRatio:   ratio(of(rundir.MetricCPUThrottled).Delta(w), of(rundir.MetricCPUPeriods).Delta(w)),
		ThrottledSeconds: of(rundir.MetricCPUThrottledTime).Delta(w),
		RunqP99:          runq.Quantile(0.99),
		RunqWait:         secs(runq.SumNs),
		IOBytes:          of(rundir.MetricBlkBytes).LabelIn(rundir.LabelOp, dataOps...).Delta(w),
		FsyncP95:         of(rundir.MetricFsyncLatency).HistDelta(w).Quantile(0.95),
	}
	if late := of(rundir.MetricHeartbeatLateness).Values(w); len(late) > 0 {
		wp.HeartbeatLatenessP99, wp.HeartbeatLatenessMax = quantile(late, 0.99), slices.Max(late)
	}
	work := a.probeReadings(wl.Cgroup, measureCPUWork, w)
	fsyncs := a.probeReadings(wl.Cgroup, measureFsync, w)
	if len(work) == 0 && len(fsyncs) == 0 {
		return wp
	}
	iterations := a.probeReadings(wl.Cgroup, measureWriteFsync, w)
	wp.Probe = &ProbeStats{
		Iterations:    max(len(work), len(fsyncs)),
		CPUWorkP50:    quantile(work, 0.5),
		CPUWorkP95:    quantile(work, 0.95),
		WriteFsyncP50: quantile(iterations, 0.5),
		WriteFsyncP95: quantile(iterations, 0.95),
		FsyncP95:      quantile(fsyncs, 0.95),
	}
	return wp
}

// writeFsync sums each fsync reading with the latest unpaired write reading at or before it (the
// probe writes, then syncs): the write+fsync time of each probe iteration.
func writeFsync(writes, fsyncs []rundir.Record) []float64 {
	var out []float64
	var pending *float64
	i := 0
	for _, f := range fsyncs {
		for ; i < len(writes) && !writes[i].Time.After(f.Time); i++ {
			pending = writes[i].Value
		}
		if pending != nil {
			out = append(out, *pending+*f.Value)
			pending = nil
		}
	}
	return out
}

func (a *analysis) ranking(w rundir.Window) Ranking {
	r := Ranking{Window: w.Name}
	for cg, ss := range a.run.Series(rundir.MetricRunqLatency).ByCgroup() {
		if h := ss.HistDelta(w); h.SumNs > 0 {
			r.RunqWait = append(r.RunqWait, Ranked{Cgroup: cg, Value: secs(h.SumNs), Count: h.Count})
		}
	}
	for cg, ss := range a.run.Series(rundir.MetricFsyncLatency).ByCgroup() {
		if h := ss.HistDelta(w); h.Count > 0 {
			r.Fsync = append(r.Fsync, Ranked{Cgroup: cg, Value: h.Quantile(0.95), Count: h.Count})
		}
	}
	for cg, ss := range dataBytes(a.run).ByCgroup() {
		if b := ss.Delta(w); b > 0 {
			r.IOBytes = append(r.IOBytes, Ranked{Cgroup: cg, Value: b})
		}
	}
	for _, list := range []*[]Ranked{&r.RunqWait, &r.Fsync, &r.IOBytes} {
		*list = a.top(*list)
	}
	return r
}

// top orders a ranking by value, then count, then cgroup, names its workloads and keeps the
// first rankingSize; an empty ranking is an empty list, not null.
func (a *analysis) top(list []Ranked) []Ranked {
	slices.SortFunc(list, func(x, y Ranked) int {
		return cmp.Or(cmp.Compare(y.Value, x.Value), cmp.Compare(y.Count, x.Count), cmp.Compare(x.Cgroup, y.Cgroup))
	})
	list = list[:min(len(list), rankingSize)]
	for i := range list {
		if n := a.name(list[i].Cgroup); n != list[i].Cgroup {
			list[i].Workload = n
		}
	}
	if list == nil {
		return []Ranked{}
	}
	return list
}

// dataOps are the block operations that move data. Discards (a truncated file's blocks given
// back) and flushes carry a size but transfer nothing, so they are not I/O bytes.
var dataOps = []string{rundir.OpRead, rundir.OpWrite}

// dataBytes is every block-bytes series of data operations.
func dataBytes(run *rundir.Run) rundir.SeriesSet {
	return run.Series(rundir.MetricBlkBytes).LabelIn(rundir.LabelOp, dataOps...)
}
