package analyzer

import (
	"slices"
	"strings"
	"testing"

	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

// agentWindow is cpuBusy's victim and hogs as an agent window: no workloads, no probe, the
// phases baseline and window; the victim used 4 s of CPU in each phase.
func agentWindow(observed ...rundir.Workload) *builder {
	return emptyWindow(observed...).histogram(rundir.MetricRunqLatency, victim, lat(1000, 100e-6), lat(2000, 2e-3)).
		counter(rundir.MetricCPUUsage, victim, 4, 4).
		preempted(cpuHog0, 0, 1.9).
		preempted(cpuHog1, 0, 1.8).
		preempted(rundir.CgroupIdle, 0.01, 0.1)
}

// emptyWindow is an agent window with nothing recorded yet: the phases baseline and window.
func emptyWindow(observed ...rundir.Workload) *builder {
	b := newRun(observed...)
	b.meta.Scenario = rundir.ScenarioAgent
	for i := range b.recs {
		if b.recs[i].Name == rundir.PhaseStress {
			b.recs[i].Name = rundir.PhaseWindow
		}
	}
	return b
}

func TestObservedContentionNamesCulpritsByCgroup(t *testing.T) {
	for name, b := range map[string]*builder{
		"incident names the cgroup":    agentWindow(rundir.Workload{Name: victim, Kind: rundir.KindObserved, Cgroup: victim}),
		"window examines every cgroup": agentWindow(),
	} {
		t.Run(name, func(t *testing.T) {
			rep := b.analyze(t)
			f := finding(t, rep, IDCPUContention)
			if f.Victim != victim {
				t.Errorf("victim %q, want the cgroup's path %q", f.Victim, victim)
			}
			if !slices.Equal(f.Culprits, []string{cpuHog0, cpuHog1}) {
				t.Errorf("culprits %v, want both hogs by path", f.Culprits)
			}
			// 0.1 s → 4 s of wait for 4 s of CPU: stretch 1.025 → 2.0.
			if e := evidence(t, f, "runq_wait_per_cpu_second", ""); e.Phase != rundir.PhaseWindow || e.Value < 0.9 || e.Value > 1.1 {
				t.Errorf("wait per CPU second %+v, want ~1 in the window", e)
			}
			if f.Severity != SeverityWarning {
				t.Errorf("severity %s for a stretch just under 2, want warning", f.Severity)
			}
		})
	}
}

func TestObservedContentionQuiet(t *testing.T) {
	b := newRun()
	b.meta.Scenario = rundir.ScenarioAgent
	b.histogram(rundir.MetricRunqLatency, victim, lat(1000, 100e-6), lat(2000, 100e-6)).
		counter(rundir.MetricCPUUsage, victim, 4, 8).
		preempted(cpuHog0, 0.05, 0.1)
	if rep := b.analyze(t); len(rep.Findings) != 0 {
		t.Errorf("a quiet window gave %v", ids(rep))
	}
}

// diskWindow is an agent window in which the victim's cgroup, which nothing preempted, did I/O
// on disk while a neighbour started writing 2 GiB there: the victim's own histograms are
// fsyncs (fsync) or block queue times (queue), each a baseline and a window.
func diskWindow(fsync, queue [2]hist.Log2) *builder {
	b := emptyWindow()
	dev := []string{rundir.LabelDevice, disk, rundir.LabelOp, "write"}
	b.counter(rundir.MetricBlkBytes, victim, 64<<20, 128<<20, dev...).
		counter(rundir.MetricBlkBytes, diskHog+"0", 0, 2<<30, dev...).
		counter(rundir.MetricBlkBytes, "/quiet", 1<<20, 2<<20, dev...).
		histogram(rundir.MetricBlkService, diskHog+"0", lat(10, 1e-3), lat(4000, 4e-3), dev...)
	if fsync[0].Count > 0 {
		b.histogram(rundir.MetricFsyncLatency, victim, fsync[0], fsync[1], rundir.LabelSyscall, "fsync", rundir.LabelDevice, disk)
	}
	if queue[0].Count > 0 {
		b.histogram(rundir.MetricBlkQueue, victim, queue[0], queue[1], dev...)
		b.histogram(rundir.MetricBlkService, victim, lat(uint64(queue[0].Count), 1e-3), lat(uint64(queue[1].Count), 1e-3), dev...)
	}
	return b
}

// spread is n events around d: 70 % at d, 25 % at 2d, 5 % at 4d.
func spread(n uint64, d float64) hist.Log2 {
	return lat(n*70/100, d).Add(lat(n*25/100, 2*d)).Add(lat(n-n*70/100-n*25/100, 4*d))
}

func TestObservedDiskContention(t *testing.T) {
	for name, tc := range map[string]struct {
		fsync, queue [2]hist.Log2
		affects      string
		metric       string
	}{
		"traced fsyncs slowed":       {fsync: [2]hist.Log2{spread(200, 40e-3), spread(150, 300e-3)}, affects: "fsync", metric: "fsync_latency_p95"},
		"no fsync, requests queued":  {queue: [2]hist.Log2{spread(500, 1e-3), spread(500, 40e-3)}, affects: "blk_requests", metric: "blk_queue_p95"},
		"fsyncs flat, requests slow": {fsync: [2]hist.Log2{spread(200, 40e-3), spread(200, 40e-3)}, queue: [2]hist.Log2{spread(500, 1e-3), spread(500, 40e-3)}, affects: "blk_requests", metric: "blk_queue_p95"},
	} {
		t.Run(name, func(t *testing.T) {
			rep := diskWindow(tc.fsync, tc.queue).analyze(t)
			if got := ids(rep); !slices.Equal(got, []string{IDDiskContention}) {
				t.Fatalf("findings %v, want disk-contention alone", got)
			}
			f := rep.Findings[0]
			t.Log(f.Summary)
			if f.Victim != victim || !slices.Equal(f.Culprits, []string{diskHog + "0"}) || !slices.Equal(f.Affects, []string{tc.affects}) {
				t.Errorf("victim %q culprits %v affects %v, want %s, the hog, %s", f.Victim, f.Culprits, f.Affects, victim, tc.affects)
			}
			if e := evidence(t, f, tc.metric, ""); e.Phase != rundir.PhaseWindow || e.Value < 2*e.Baseline {
				t.Errorf("%s %+v, want the window's p95 well above the baseline's", tc.metric, e)
			}
			if e := evidence(t, f, strings.TrimSuffix(tc.metric, "_p95")+"_rise_chance", ""); e.Value > probeAlpha {
				t.Errorf("rise chance %v past %v", e.Value, probeAlpha)
			}
		})
	}
}

func TestObservedDiskQuiet(t *testing.T) {
	for name, fsync := range map[string][2]hist.Log2{
		"same distribution": {spread(200, 40e-3), spread(400, 40e-3)},
		// Two fsyncs past every one of three baseline ones: a 20 % chance, whatever the p95 did.
		"too few fsyncs": {lat(3, 40e-3), lat(2, 400e-3)},
		// 5 of 300 past the baseline's slowest move the p95 little.
		"a few outliers": {spread(300, 40e-3), spread(295, 40e-3).Add(lat(5, 1))},
	} {
		t.Run(name, func(t *testing.T) {
			if rep := diskWindow(fsync, [2]hist.Log2{}).analyze(t); len(rep.Findings) != 0 {
				t.Errorf("findings %v, want none", ids(rep))
			}
		})
	}
}

func TestMannWhitneyOnBuckets(t *testing.T) {
	same := spread(400, 1e-3).Buckets
	if p := mannWhitneyGreater(same, same); p < 0.4 {
		t.Errorf("identical buckets: p %v, want about one half", p)
	}
	if p := mannWhitneyGreater(spread(400, 1e-3).Buckets, spread(400, 8e-3).Buckets); p > 1e-6 {
		t.Errorf("every event 8x larger: p %v", p)
	}
	if p := mannWhitneyGreater(spread(400, 8e-3).Buckets, spread(400, 1e-3).Buckets); p < 0.99 {
		t.Errorf("every event smaller: p %v, want about 1", p)
	}
	if p := mannWhitneyGreater(lat(5, 1e-3).Buckets, lat(5, 1e-3).Buckets); p != 1 {
		t.Errorf("every event tied: p %v, want 1", p)
	}
}
