package analyzer

import (
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/nodectl/nodectl/rundir"
)

// boot is what one synthetic start measured.
type boot struct {
	cpu                                     string
	wake, usage, throttled, periods, thrPer float64
	runq                                    float64 // seconds in the tracer's histogram and in schedstat
	answered                                bool
}

// wakeRun builds a wake run of the boots, one after the other, each in its own cgroup and boot
// phase, with counters that keep growing after the phase ends (the sandbox's exit) as a real
// sandbox's do.
func wakeRun(traced bool, boots ...boot) *builder {
	b := &builder{meta: rundir.Meta{ID: "w1", Scenario: rundir.ScenarioWake, Node: "node-a", Kernel: "6.18.0", Start: at(-1)}}
	if traced {
		b.meta.Tracer = map[string]string{rundir.ProgramRunq: rundir.TracerAttached}
	}
	start := 0.0
	seen := map[string]int{}
	for _, bt := range boots {
		name := fmt.Sprintf("wake-%s-%d", bt.cpu, seen[bt.cpu])
		seen[bt.cpu]++
		cg := runCg + "/" + name
		b.meta.Workloads = append(b.meta.Workloads, rundir.Workload{Name: name, Kind: rundir.KindWake, Cgroup: cg, CPU: bt.cpu})
		answer, end := start+bt.wake, start+bt.wake+0.01
		b.recs = append(b.recs, rundir.Record{Type: rundir.TypePhase, Time: at(start), Name: name, Event: rundir.EventStart})
		if bt.answered {
			v := func(x float64) *float64 { return &x }
			b.recs = append(b.recs,
				rundir.Record{Type: rundir.TypeSample, Time: at(answer), Metric: rundir.MetricWake, Cgroup: cg, Value: v(bt.wake)},
				rundir.Record{Type: rundir.TypeSample, Time: at(answer), Metric: rundir.MetricWakeBoot, Cgroup: cg, Value: v(bt.wake - 0.005)},
			)
		}
		for _, s := range []struct{ t, share float64 }{{start + bt.wake/2, 0.5}, {end, 1}, {end + 0.2, 1.5}} {
			for metric, total := range map[string]float64{
				rundir.MetricCPUUsage: bt.usage, rundir.MetricCPUThrottledTime: bt.throttled,
				rundir.MetricCPUPeriods: bt.periods, rundir.MetricCPUThrottled: bt.thrPer,
				rundir.MetricSchedRunDelay: bt.runq,
			} {
				v := total * s.share
				b.recs = append(b.recs, rundir.Record{Type: rundir.TypeSample, Time: at(s.t), Metric: metric, Cgroup: cg, Value: &v})
			}
			if traced {
				h := lat(uint64(100*s.share), bt.runq/100)
				b.recs = append(b.recs, rundir.Record{Type: rundir.TypeSample, Time: at(s.t), Metric: rundir.MetricRunqLatency, Cgroup: cg, Hist: &h})
			}
		}
		b.recs = append(b.recs, rundir.Record{Type: rundir.TypePhase, Time: at(end), Name: name, Event: rundir.EventEnd})
		start = end + 0.5
	}
	return b
}

// throttledBoot is a 150 ms boot at 50m: 30 periods, throttled in 29 of them for 95 ms each.
func throttledBoot(wake float64) boot {
	return boot{cpu: "50m", wake: wake, usage: 0.15, throttled: 2.75, periods: 30, thrPer: 29, runq: 0.004, answered: true}
}

// fastBoot is the same boot at 1 CPU.
func fastBoot(wake float64) boot {
	return boot{cpu: "1", wake: wake, usage: 0.15, periods: 2, runq: 0.001, answered: true}
}

func wakeLimitOf(t *testing.T, rep *Report, cpu string) WakeLimit {
	t.Helper()
	for _, l := range rep.Limits {
		if l.CPU == cpu {
			return l
		}
	}
	t.Fatalf("no limit %s in %+v", cpu, rep.Limits)
	return WakeLimit{}
}

func TestWakeThrottlingExplainsTheSlowLimit(t *testing.T) {
	rep := wakeRun(true,
		throttledBoot(2.9), fastBoot(0.16),
		throttledBoot(3.0), fastBoot(0.15),
		throttledBoot(3.2), fastBoot(0.17),
	).analyze(t)
	if got := []string{rep.Limits[0].CPU, rep.Limits[1].CPU}; len(rep.Limits) != 2 || !reflect.DeepEqual(got, []string{"50m", "1"}) {
		t.Fatalf("limits %+v, want 50m then 1 as given", rep.Limits)
	}
	slow, fast := wakeLimitOf(t, rep, "50m"), wakeLimitOf(t, rep, "1")
	if slow.Starts != 3 || slow.WakeP50 != 3.0 || slow.WakeP95 != 3.2 || slow.Workload != "wake-50m" {
		t.Errorf("50m limit %+v, want 3 starts, p50 3.0 s, p95 3.2 s", slow)
	}
	// The counters are read at each boot's end: what the sandbox did after it is left out.
	if want := 3 * 2.75 / (2.9 + 3.0 + 3.2); !approx(slow.ThrottledShare, want) || slow.ThrottledP50 != 2.75 || slow.ThrottledPeriodsP50 != 29 {
		t.Errorf("50m throttling %+v, want share %.3f, 2.75 s and 29 periods per boot", slow, want)
	}
	if slow.RunqWaitSource != runqSourceTracer || !approx(slow.RunqWaitP50, 0.004) || !approx(slow.BootP50, 2.995) {
		t.Errorf("50m run-queue wait %v from %q, boot %v; want 4 ms from the tracer and 2.995 s", slow.RunqWaitP50, slow.RunqWaitSource, slow.BootP50)
	}
	if fast.ThrottledShare != 0 || fast.WakeP50 != 0.16 {
		t.Errorf("1-CPU limit %+v, want unthrottled, p50 0.16 s", fast)
	}

	if len(rep.Findings) != 1 {
		t.Fatalf("findings %v, want one cpu-throttling for wake-50m", ids(rep))
	}
	f := rep.Findings[0]
	if f.ID != IDCPUThrottling || f.Victim != "wake-50m" || f.Severity != SeverityCritical || len(f.Culprits) != 0 {
		t.Errorf("finding %s of %s (%s, culprits %v), want critical cpu-throttling of wake-50m without culprits", f.ID, f.Victim, f.Severity, f.Culprits)
	}
	if e := evidence(t, f, "wake_p50", ""); e.Value != 3.0 || e.Baseline != 0.16 || e.Phase != PhaseWake || e.Workload != "wake-50m" {
		t.Errorf("wake_p50 evidence %+v, want 3.0 s against the fastest limit's 0.16 s", e)
	}
	if e := evidence(t, f, "wake_throttled_share", ""); !approx(e.Value, slow.ThrottledShare) || e.Unit != UnitRatio {
		t.Errorf("share evidence %+v", e)
	}
	for _, m := range []string{"wake_p95", "cpu_throttled_seconds", "cpu_throttled_periods", "cpu_periods", "cpu_usage_seconds", "runq_wait_seconds"} {
		evidence(t, f, m, "")
	}
	for _, want := range []string{"50m", "19x", "160ms with a limit of 1", "throttled"} {
		if !strings.Contains(f.Summary, want) {
			t.Errorf("summary %q lacks %q", f.Summary, want)
		}
	}
}

// approx compares sums of float seconds.
func approx(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestWakeWithoutTracerUsesSchedstat(t *testing.T) {
	rep := wakeRun(false, throttledBoot(3), fastBoot(0.16)).analyze(t)
	l := wakeLimitOf(t, rep, "50m")
	if l.RunqWaitSource != runqSourceSchedstat || !approx(l.RunqWaitP50, 0.004) {
		t.Errorf("untraced run-queue wait %v from %q, want 4 ms from schedstat", l.RunqWaitP50, l.RunqWaitSource)
	}
	f := finding(t, rep, IDCPUThrottling)
	evidence(t, f, "sched_run_delay_seconds", "")
}

func TestWakeSingleLimit(t *testing.T) {
	rep := wakeRun(false, throttledBoot(3), throttledBoot(3.1)).analyze(t)
	f := finding(t, rep, IDCPUThrottling)
	if e := evidence(t, f, "wake_p50", ""); e.Baseline != 0 || e.Value != 3.0 {
		t.Errorf("single-limit wake_p50 %+v, want no baseline", e)
	}
	// (0.15 + 2.75) / 0.15: what it would have taken had it run instead of waiting.
	if f.Severity != SeverityCritical {
		t.Errorf("severity %s, want critical", f.Severity)
	}
}

func TestNoWakeThrottling(t *testing.T) {
	mild := boot{cpu: "500m", wake: 0.2, usage: 0.15, throttled: 0.03, periods: 3, thrPer: 1, answered: true}
	for name, b := range map[string]*builder{
		"fast_limits":      wakeRun(true, mild, fastBoot(0.16), mild, fastBoot(0.15)),
		"never_answered":   wakeRun(true, boot{cpu: "50m", wake: 3, usage: 0.15, throttled: 2.8, periods: 30, thrPer: 29}, fastBoot(0.16)),
		"few_periods":      wakeRun(true, boot{cpu: "50m", wake: 0.3, usage: 0.01, throttled: 0.2, periods: 2, thrPer: 2, answered: true}),
		"not_a_wake_run":   newRun(victimWorkload()),
		"no_starts_at_all": wakeRun(true),
	} {
		t.Run(name, func(t *testing.T) {
			rep := b.analyze(t)
			if len(rep.Findings) != 0 {
				t.Errorf("findings %v, want none", ids(rep))
			}
		})
	}
	rep := wakeRun(true, boot{cpu: "50m", wake: 3}, fastBoot(0.16)).analyze(t)
	if l := wakeLimitOf(t, rep, "50m"); l.Starts != 0 {
		t.Errorf("a start that never answered was counted: %+v", l)
	}
	if len(rep.Notes) != 1 || !strings.Contains(rep.Notes[0], "1 of 2 starts never answered") {
		t.Errorf("notes %q, want one saying a start never answered", rep.Notes)
	}
}

func TestWakeSummaryHasEachStartOnce(t *testing.T) {
	rep := wakeRun(true, throttledBoot(3), fastBoot(0.16)).analyze(t)
	if len(rep.Summary.Workloads) != 2 {
		t.Fatalf("summary rows %+v, want one per start", rep.Summary.Workloads)
	}
	for _, wp := range rep.Summary.Workloads {
		if wp.Phase != wp.Workload {
			t.Errorf("start %s summarised over %s, want its own boot", wp.Workload, wp.Phase)
		}
	}
	if r := rep.Summary.Workloads[0]; !approx(r.ThrottledSeconds, 2.75) {
		t.Errorf("wake-50m-0 row %+v, want 2.75 s throttled", r)
	}
}

// A start in a pod: its quota is the container's and the pod's, and the kernel counted most of
// the throttling on the pod's cgroup, the container's parent.
func TestWakeCountsThePodsThrottling(t *testing.T) {
	small := throttledBoot(2.9)
	small.throttled, small.thrPer = 0.5, 5 // the container's own share
	b := wakeRun(true, small, fastBoot(0.16))
	pod := runCg // the parent of wake-50m-0's cgroup
	for _, s := range []struct{ t, thr, per float64 }{{0, 0, 0}, {1.45, 1.1, 12}, {2.9, 2.25, 24}} {
		thr, per := s.thr, s.per
		b.recs = append(b.recs,
			rundir.Record{Type: rundir.TypeSample, Time: at(s.t), Metric: rundir.MetricCPUThrottledTime, Cgroup: pod, Value: &thr},
			rundir.Record{Type: rundir.TypeSample, Time: at(s.t), Metric: rundir.MetricCPUThrottled, Cgroup: pod, Value: &per})
	}
	rep := b.analyze(t)
	l := wakeLimitOf(t, rep, "50m")
	if l.ThrottledP50 != 2.25 || l.ThrottledPeriodsP50 != 24 {
		t.Errorf("50m %+v: want the pod's throttling, the larger, 2.25 s in 24 periods", l)
	}
	finding(t, rep, IDCPUThrottling)
}
