package analyzer

import (
	"reflect"
	"strings"
	"testing"

	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

const containerdCg = "/system.slice/containerd.service"

func daemonWorkload() rundir.Workload {
	return rundir.Workload{Name: "containerd", Kind: rundir.KindDaemon, Cgroup: containerdCg}
}

// daemonRun has the followed containerd wait base and stress on the run queue (the baseline is
// 10 s, the stress phase 20 s), and its waits after preemptions by each preemptor (seconds in
// the baseline, in the stress phase).
func daemonRun(base, stress hist.Log2, preempted map[string][2]float64) *builder {
	b := newRun(victimWorkload(), hogWorkload("cpu", 0), hogWorkload("cpu", 1), daemonWorkload()).
		histogram(rundir.MetricRunqLatency, containerdCg, base, stress)
	for p, w := range preempted {
		b.counter(rundir.MetricRunqPreemptWait, containerdCg, w[0], w[1], rundir.LabelPreemptor, p)
		b.counter(rundir.MetricRunqPreemptions, containerdCg, w[0]*100, w[1]*100, rundir.LabelPreemptor, p)
	}
	return b
}

func TestDaemonStarvation(t *testing.T) {
	hogs := map[string][2]float64{
		cpuHog0:             {0, 0.8},
		cpuHog1:             {0, 0.6},
		"/":                 {0.01, 0.02}, // as in the baseline: not named
		containerdCg:        {0.001, 0.002},
		rundir.CgroupKernel: {0.001, 0.3}, // system work, not a neighbour
	}
	tests := map[string]struct {
		base, stress hist.Log2
		severity     string
	}{
		// 1000 waits of 30 ms in 20 s: p99 and wait per second both rose.
		"p99_rose":            {lat(1000, 50e-6), lat(1000, 30e-3), SeverityWarning},
		"p99_rose_past_100ms": {lat(1000, 50e-6), lat(1000, 150e-3), SeverityCritical},
		// 30 waits of 12 ms: the p99 rose, though the wait per second stayed under 20 ms.
		"p99_rose_alone": {lat(30, 50e-6), lat(30, 12e-3), SeverityWarning},
		// Ten waits are too few for a p99, but 10 x 60 ms is 30 ms of wait per second.
		"wait_per_second_rose": {lat(10, 50e-6), lat(10, 60e-3), SeverityWarning},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := finding(t, daemonRun(tc.base, tc.stress, hogs).analyze(t), IDSystemDaemonStarvation)
			if want := []string{"cpu-hog-0", "cpu-hog-1"}; !reflect.DeepEqual(f.Culprits, want) {
				t.Errorf("culprits = %v, want %v", f.Culprits, want)
			}
			if f.Victim != "containerd" || f.Severity != tc.severity {
				t.Errorf("victim %q severity %q, want containerd and %s", f.Victim, f.Severity, tc.severity)
			}
			perSec := evidence(t, f, "runq_wait_per_second", "")
			if want := tc.stress.Mean() * float64(tc.stress.Count) / 20; perSec.Workload != "containerd" || !near(perSec.Value, want) {
				t.Errorf("wait per second evidence = %+v, want %g for containerd", perSec, want)
			}
			if e := evidence(t, f, "runq_preempt_wait_seconds", "cpu-hog-0"); e.Value != 0.8 || e.Workload != "containerd" {
				t.Errorf("culprit evidence = %+v", e)
			}
			if !strings.Contains(f.Summary, "containerd daemon (cgroup "+containerdCg+")") {
				t.Errorf("summary %q does not name the daemon and its cgroup", f.Summary)
			}
		})
	}
}

func near(a, b float64) bool { return a > b*0.999 && a < b*1.001 }

func TestNoDaemonStarvation(t *testing.T) {
	hogs := map[string][2]float64{cpuHog0: {0, 0.5}, cpuHog1: {0, 0.4}}
	for name, b := range map[string]*builder{
		"quiet": daemonRun(lat(1000, 50e-6), lat(2000, 60e-6), map[string][2]float64{"/": {0.01, 0.02}}),
		// 40 waits of 8 ms: a p99 under 10 ms and 16 ms of wait per second, noise for a daemon.
		"rose_but_tiny": daemonRun(lat(40, 50e-6), lat(40, 8e-3), hogs),
		// Waits of 30 ms, but only 5: no p99, and 7.5 ms of wait per second.
		"few_waits": daemonRun(lat(5, 50e-6), lat(5, 30e-3), hogs),
		"no_rise":   daemonRun(lat(1000, 30e-3), lat(2000, 30e-3), hogs),
		"its_own_tasks_and_quota": daemonRun(lat(1000, 50e-6), lat(1000, 30e-3), map[string][2]float64{
			containerdCg: {0.001, 0.4}, rundir.CgroupThrottled: {0, 0.3}, rundir.CgroupKernel: {0, 0.2}}),
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

func TestAFollowedDaemonIsNamedAsACulprit(t *testing.T) {
	rep := cpuBusy(1).preempted(cpuHog0, 0, 2.0).preempted(containerdCg, 0, 1.8)
	rep.meta.Workloads = append(rep.meta.Workloads, daemonWorkload())
	f := finding(t, rep.analyze(t), IDCPUContention)
	if want := []string{"cpu-hog-0", "containerd"}; !reflect.DeepEqual(f.Culprits, want) {
		t.Errorf("culprits = %v, want %v (the daemon by its name)", f.Culprits, want)
	}
}
