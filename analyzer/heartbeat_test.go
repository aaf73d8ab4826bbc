package analyzer

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nodectl/nodectl/agent/record"
)

const heartbeatCg = runCg + "/system"

func heartbeatWorkload() record.Workload {
	return record.Workload{Name: "heartbeat", Kind: kindHeartbeat, Cgroup: heartbeatCg, Period: record.Duration(time.Second)}
}

// heartbeatRun has the heartbeat wake up at most baseLate and stressLate seconds late, and its
// waits after preemptions by each preemptor (seconds in the baseline, in the stress phase).
func heartbeatRun(baseLate, stressLate float64, preempted map[string][2]float64) *builder {
	b := newRun(victimWorkload(), heartbeatWorkload(), hogWorkload("cpu", 0), hogWorkload("cpu", 1)).
		gauge(record.MetricHeartbeatLateness, heartbeatCg, []float64{0.0002, baseLate}, []float64{0.001, stressLate})
	for p, w := range preempted {
		b.counter(record.MetricRunqPreemptWait, heartbeatCg, w[0], w[1], record.LabelPreemptor, p)
		b.counter(record.MetricRunqPreemptions, heartbeatCg, w[0]*100, w[1]*100, record.LabelPreemptor, p)
	}
	return b
}

func TestSystemDaemonStarvation(t *testing.T) {
	rep := heartbeatRun(0.002, 1.5, map[string][2]float64{
		cpuHog0:           {0, 0.8},
		cpuHog1:           {0, 0.7},
		"/":               {0.01, 0.02}, // as in the baseline: not named
		heartbeatCg:       {0.001, 0.001},
		record.CgroupIdle: {0.001, 0.001},
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
			heartbeatCg: {0.001, 0.4}, record.CgroupThrottled: {0, 0.3}}),
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
	b := heartbeatRun(0.002, 0.3, map[string][2]float64{record.CgroupKernel: {0.001, 0.5}})
	for _, w := range []struct {
		cg       string
		b, s, nb float64
	}{{cpuHog0, 0, 0.9, 900}, {cpuHog1, 0, 0.6, 600}, {record.CgroupKernel, 0, 0.4, 400}} {
		b.counter(record.MetricRunqWakeupWait, heartbeatCg, w.b, w.s, record.LabelPreemptor, w.cg)
		b.counter(record.MetricRunqWakeupWaits, heartbeatCg, 0, w.nb, record.LabelPreemptor, w.cg)
	}
	f := finding(t, b.analyze(t), IDSystemDaemonStarvation)
	if want := []string{"cpu-hog-0", "cpu-hog-1"}; !reflect.DeepEqual(f.Culprits, want) {
		t.Errorf("culprits = %v, want %v (kernel threads are system work, not neighbours)", f.Culprits, want)
	}
	if e := evidence(t, f, "runq_wakeup_wait_seconds", "cpu-hog-0"); e.Value != 0.9 {
		t.Errorf("wakeup wait evidence = %+v", e)
	}
}
