package analyzer

import (
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodectl/nodectl/rundir"
)

const heartbeatCg = runCg + "/system"

func heartbeatWorkload() rundir.Workload {
	return rundir.Workload{Name: "heartbeat", Kind: rundir.KindHeartbeat, Cgroup: heartbeatCg, Period: rundir.Duration(time.Second)}
}

// heartbeatRun has the heartbeat wake up at most baseLate and stressLate seconds late, and its
// waits after preemptions by each preemptor (seconds in the baseline, in the stress phase).
func heartbeatRun(baseLate, stressLate float64, preempted map[string][2]float64) *builder {
	b := newRun(victimWorkload(), heartbeatWorkload(), hogWorkload("cpu", 0), hogWorkload("cpu", 1)).
		gauge(rundir.MetricHeartbeatLateness, heartbeatCg, []float64{0.0002, baseLate}, []float64{0.001, stressLate})
	for p, w := range preempted {
		b.counter(rundir.MetricRunqPreemptWait, heartbeatCg, w[0], w[1], rundir.LabelPreemptor, p)
		b.counter(rundir.MetricRunqPreemptions, heartbeatCg, w[0]*100, w[1]*100, rundir.LabelPreemptor, p)
	}
	return b
}

func TestSystemDaemonStarvation(t *testing.T) {
	rep := heartbeatRun(0.002, 1.5, map[string][2]float64{
		cpuHog0:           {0, 0.8},
		cpuHog1:           {0, 0.7},
		"/":               {0.01, 0.02}, // as in the baseline: not named
		heartbeatCg:       {0.001, 0.001},
		rundir.CgroupIdle: {0.001, 0.001},
	}).analyze(t)
	f := finding(t, rep, IDSystemDaemonStarvation)
	if want := []string{"cpu-hog-0", "cpu-hog-1"}; !reflect.DeepEqual(f.Culprits, want) {
		t.Errorf("culprits = %v, want %v", f.Culprits, want)
	}
	if f.Victim != "heartbeat" || f.Severity != SeverityCritical {
		t.Errorf("victim %q severity %q, want heartbeat and critical (a 1.5 s late beat missed a 1 s period)", f.Victim, f.Severity)
	}
	if e := evidence(t, f, "heartbeat_gap_max", ""); e.Value != 2.5 {
		t.Errorf("gap evidence = %+v, want period 1 s + 1.5 s late", e)
	}
	if e := evidence(t, f, "heartbeat_gap_grace_share", ""); e.Value != 2.5/40 {
		t.Errorf("grace share evidence = %+v, want 2.5 s of 40 s", e)
	}
	if !strings.Contains(f.Summary, "40s node-monitor grace period") {
		t.Errorf("summary %q does not compare with the grace period", f.Summary)
	}
}

func TestNoSystemDaemonStarvation(t *testing.T) {
	for name, b := range map[string]*builder{
		"quiet":         heartbeatRun(0.002, 0.003, map[string][2]float64{"/": {0.01, 0.01}}),
		"late_but_tiny": heartbeatRun(0.0005, 0.004, map[string][2]float64{cpuHog0: {0, 0.5}}),
		"late_but_nobody_preempted_it": heartbeatRun(0.002, 0.5, map[string][2]float64{
			heartbeatCg: {0.001, 0.4}, rundir.CgroupThrottled: {0, 0.3}}),
		"no_rise": heartbeatRun(0.2, 0.25, map[string][2]float64{cpuHog0: {0, 0.5}}),
	} {
		t.Run(name, func(t *testing.T) {
			for _, f := range b.analyze(t).Findings {
				if f.ID == IDSystemDaemonStarvation {
					t.Errorf("found %+v", f)
				}
			}
		})
	}
}

func TestWakeupWaitsBlameWhatRanAndKernelThreadsAreNotNeighbours(t *testing.T) {
	// The heartbeat sleeps between beats, so it is rarely preempted: it waits after waking up,
	// behind whatever runs on its CPU.
	b := heartbeatRun(0.002, 0.3, map[string][2]float64{rundir.CgroupKernel: {0.001, 0.5}})
	for _, w := range []struct {
		cg       string
		b, s, nb float64
	}{{cpuHog0, 0, 0.9, 900}, {cpuHog1, 0, 0.6, 600}, {rundir.CgroupKernel, 0, 0.4, 400}} {
		b.counter(rundir.MetricRunqWakeupWait, heartbeatCg, w.b, w.s, rundir.LabelPreemptor, w.cg)
		b.counter(rundir.MetricRunqWakeupWaits, heartbeatCg, 0, w.nb, rundir.LabelPreemptor, w.cg)
	}
	f := finding(t, b.analyze(t), IDSystemDaemonStarvation)
	if want := []string{"cpu-hog-0", "cpu-hog-1"}; !reflect.DeepEqual(f.Culprits, want) {
		t.Errorf("culprits = %v, want %v (kernel threads are system work, not neighbours)", f.Culprits, want)
	}
	if e := evidence(t, f, "runq_wakeup_wait_seconds", "cpu-hog-0"); e.Value != 0.9 {
		t.Errorf("wakeup wait evidence = %+v", e)
	}
}

// One late beat in the baseline (42 ms) hides a stress phase whose worst is only 2.8x that,
// but whose latest beats are all in the stress phase: the tail test sees it.
func TestHeartbeatLateTailDespiteABaselineOutlier(t *testing.T) {
	b := heartbeatRun(0.002, 0.002, map[string][2]float64{cpuHog0: {0, 0.8}})
	b.recs = slices.DeleteFunc(b.recs, func(r rundir.Record) bool { return r.Metric == rundir.MetricHeartbeatLateness })
	beat := func(sec, late float64) {
		b.recs = append(b.recs, rundir.Record{Type: rundir.TypeSample, Time: at(sec), Metric: rundir.MetricHeartbeatLateness,
			Cgroup: heartbeatCg, Value: &late})
	}
	for i := range 80 {
		late := 0.001 + 0.002*float64(i%3)/2
		if i == 40 {
			late = 0.042
		}
		beat(0.1+float64(i)*0.12, late)
	}
	for i := range 160 {
		late := 0.002 + 0.018*float64(i%5)/4
		if i%13 == 0 {
			late = 0.05 + 0.068*float64(i)/160
		}
		beat(10.1+float64(i)*0.12, late)
	}
	f := finding(t, b.analyze(t), IDSystemDaemonStarvation)
	if e := evidence(t, f, "heartbeat_lateness_max", ""); e.Value/e.Baseline >= heartbeatRiseFactor {
		t.Fatalf("worst beats %v → %v: the worst alone would do, the test shows nothing", e.Baseline, e.Value)
	}
	if e := evidence(t, f, "heartbeat_late_tail_chance", ""); e.Value > probeAlpha {
		t.Errorf("tail chance %v, want at most %v", e.Value, probeAlpha)
	}
}

// A stress phase whose latest beats are all its own but one, a late baseline beat among them
// (measured on this machine): the narrow tail alone leaves it to chance, the wider one does not.
func TestHeartbeatLateTailWiderThanOneBaselineBeat(t *testing.T) {
	base, stress := make([]float64, 80), make([]float64, 80)
	for i := range 80 {
		base[i] = 0.0010 + 0.0002*float64(i%7)/6
		stress[i] = 0.0011 + 0.0010*float64(i%9)/8
	}
	base[40] = 0.0069
	copy(stress[70:], []float64{0.0038, 0.0038, 0.0047, 0.0063, 0.0072, 0.0075, 0.0114, 0.0117, 0.0142, 0.0156})
	if _, p := topTailChance(base, stress, lateTailShares[0]); p <= probeAlpha {
		t.Fatalf("the latest 5%% alone gives a %v chance: the case shows nothing", p)
	}
	if rose, p := lateTail(base, stress); !rose || p > probeAlpha {
		t.Errorf("p95 rose %v, tail chance %v: want a rise at most a %v chance", rose, p, probeAlpha)
	}
}

func TestTopTailChance(t *testing.T) {
	if x, p := topTailChance([]float64{1, 2, 3, 4}, []float64{5, 6, 7, 8}, 0.25); x != 1 || math.Abs(p-0.5) > 1e-9 {
		t.Errorf("x %d p %v, want 1 of the 1 value above the 2nd largest, a 0.5 chance", x, p)
	}
	if x, p := topTailChance([]float64{5, 6, 7, 8}, []float64{1, 2, 3, 4}, 0.25); x != 0 || p != 1 {
		t.Errorf("x %d p %v, want none", x, p)
	}
}
