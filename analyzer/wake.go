package analyzer

import (
	"fmt"
	"path"

	"github.com/nodectl/nodectl/internal/human"
	"github.com/nodectl/nodectl/rundir"
)

// A wake run (`nodectl stress wake`) starts the same sandbox at several CPU limits, several
// times each. Each start is a workload of kind wake in its own fresh cgroup, and its boot is a
// phase named after it: from just before the launch to the driver's snapshot right after the
// sandbox answered. Starts at one limit form the limit's group, wake-<cpu>.
const (
	// PhaseWake is the Phase of wake evidence; its Baseline is the fastest limit's value.
	PhaseWake = "wake" //rundir:other: a findings value
)

// wakeThrottledMinShare: a limit's starts spent at least this share of their wake throttled
// (docs/findings.md, cpu-throttling in a wake run).
const wakeThrottledMinShare = 0.25

// Where the run-queue wait of a wake comes from.
const (
	runqSourceTracer    = rundir.ProgramRunq
	runqSourceSchedstat = "schedstat"
)

// WakeLimit is one CPU limit of a wake run: how long its starts took to answer and what held
// them up. Seconds and counts of one start are medians over the limit's starts.
type WakeLimit struct {
	CPU      string  `json:"cpu"`      // the limit, Kubernetes notation
	Workload string  `json:"workload"` // the limit's group: wake-<cpu>
	Starts   int     `json:"starts"`   // starts that answered
	WakeP50  float64 `json:"wake_p50_seconds"`
	WakeP95  float64 `json:"wake_p95_seconds"`
	// ThrottledShare is throttled time over wake time, all its starts together, at most 1: the
	// kernel sums throttled time over the CPUs the cgroup was throttled on, so a boot held on
	// two CPUs at once would count twice (throttled_p50_seconds keeps that raw sum).
	ThrottledShare      float64 `json:"throttled_share"`
	BootP50             float64 `json:"boot_p50_seconds"`      // the sandbox's own time from its go to its answer
	CPUUsageP50         float64 `json:"cpu_usage_p50_seconds"` // CPU time a boot used
	ThrottledP50        float64 `json:"throttled_p50_seconds"` // time a boot's cgroup was throttled (summed over CPUs)
	ThrottledPeriodsP50 float64 `json:"throttled_periods_p50"`
	PeriodsP50          float64 `json:"periods_p50"`
	RunqWaitP50         float64 `json:"runq_wait_p50_seconds"` // run-queue wait of a boot's tasks
	RunqWaitSource      string  `json:"runq_wait_source"`      // runq (the tracer) or schedstat
}

// wakeStart is what one start measured.
type wakeStart struct {
	wake, boot, usage, throttled, periods, throttledPeriods, runq float64
}

// WakeReport is what `nodectl stress wake -o json` prints: the limits and the findings.
type WakeReport struct {
	Limits   []WakeLimit `json:"limits"`
	Findings []Finding   `json:"findings"`
}

// wake tabulates a wake run by CPU limit, explains the slow limits, and notes the starts that
// never answered.
func (a *analysis) wake() ([]WakeLimit, []Finding, []string) {
	boots := map[string]rundir.Window{}
	for _, w := range a.windows {
		boots[w.Name] = w
	}
	source := runqSourceSchedstat
	if a.run.Meta.Tracer[rundir.ProgramRunq] == rundir.TracerAttached {
		source = runqSourceTracer
	}
	var order []string
	byLimit := map[string][]wakeStart{}
	planned, answered := 0, 0
	for _, w := range a.run.Meta.Workloads {
		if w.Kind != rundir.KindWake {
			continue
		}
		planned++
		if _, ok := byLimit[w.CPU]; !ok {
			order = append(order, w.CPU)
			byLimit[w.CPU] = nil
		}
		if b, ok := boots[w.Name]; ok {
			if s, ok := a.wakeStart(w.Cgroup, b, source); ok {
				byLimit[w.CPU] = append(byLimit[w.CPU], s)
				answered++
			}
		}
	}
	limits := make([]WakeLimit, 0, len(order))
	for _, cpu := range order {
		limits = append(limits, wakeLimit(cpu, byLimit[cpu], source))
	}
	var fastest *WakeLimit
	for i := range limits {
		if l := &limits[i]; l.Starts > 0 && (fastest == nil || l.WakeP50 < fastest.WakeP50) {
			fastest = l
		}
	}
	var findings []Finding
	for _, l := range limits {
		if f := wakeThrottling(l, fastest, len(limits)); f != nil {
			findings = append(findings, *f)
		}
	}
	var notes []string
	if answered < planned {
		notes = append(notes, fmt.Sprintf("%d of %d starts never answered (the run was interrupted or a start failed): "+
			"the limits count only the starts that did", planned-answered, planned))
	}
	return limits, findings, notes
}

// wakeStart reads one start's boot window; false when the sandbox never answered.
func (a *analysis) wakeStart(cgroup string, boot rundir.Window, source string) (wakeStart, bool) {
	of := func(metric string) rundir.SeriesSet { return a.run.Series(metric).Cgroup(cgroup) }
	wake := of(rundir.MetricWake).Values(boot)
	if len(wake) == 0 {
		return wakeStart{}, false
	}
	s := wakeStart{
		wake:             wake[0],
		usage:            of(rundir.MetricCPUUsage).Delta(boot),
		throttled:        of(rundir.MetricCPUThrottledTime).Delta(boot),
		periods:          of(rundir.MetricCPUPeriods).Delta(boot),
		throttledPeriods: of(rundir.MetricCPUThrottled).Delta(boot),
	}
	// A pod's quota is set twice, on its container's cgroup and on the pod's above it, both
	// charged the same CPU time, and the kernel counts a throttling where a quota ran out: at
	// one level, the other or both at once (docs/findings.md: the two counts overlap). The
	// larger is the time it could not run. (A local start's parent, the run's cgroup, has no
	// quota.)
	if parent := path.Dir(cgroup); parent != "/" && parent != "." {
		up := func(metric string) rundir.SeriesSet { return a.run.Series(metric).Cgroup(parent) }
		s.throttled = max(s.throttled, up(rundir.MetricCPUThrottledTime).Delta(boot))
		s.throttledPeriods = max(s.throttledPeriods, up(rundir.MetricCPUThrottled).Delta(boot))
	}
	if b := of(rundir.MetricWakeBoot).Values(boot); len(b) > 0 {
		s.boot = b[0]
	}
	if source == runqSourceTracer {
		s.runq = secs(of(rundir.MetricRunqLatency).HistDelta(boot).SumNs)
	} else {
		s.runq = of(rundir.MetricSchedRunDelay).Delta(boot)
	}
	return s, true
}

func wakeLimit(cpu string, starts []wakeStart, source string) WakeLimit {
	p50 := func(get func(wakeStart) float64) float64 {
		vs := make([]float64, len(starts))
		for i, s := range starts {
			vs[i] = get(s)
		}
		return quantile(vs, 0.5)
	}
	var wakes []float64
	var wakeSum, throttledSum float64
	for _, s := range starts {
		wakes = append(wakes, s.wake)
		wakeSum += s.wake
		throttledSum += s.throttled
	}
	return WakeLimit{
		CPU: cpu, Workload: rundir.WakeGroup(cpu), Starts: len(starts),
		WakeP50: quantile(wakes, 0.5), WakeP95: quantile(wakes, 0.95),
		ThrottledShare:      min(1, ratio(throttledSum, wakeSum)),
		BootP50:             p50(func(s wakeStart) float64 { return s.boot }),
		CPUUsageP50:         p50(func(s wakeStart) float64 { return s.usage }),
		ThrottledP50:        p50(func(s wakeStart) float64 { return s.throttled }),
		ThrottledPeriodsP50: p50(func(s wakeStart) float64 { return s.throttledPeriods }),
		PeriodsP50:          p50(func(s wakeStart) float64 { return s.periods }),
		RunqWaitP50:         p50(func(s wakeStart) float64 { return s.runq }),
		RunqWaitSource:      source,
	}
}

// wakeThrottling: a limit's own CPU quota held its sandbox's boot throttled for a material
// share of the wake (docs/findings.md). Its slowdown is against the fastest limit of the run;
// with no faster limit to compare, it is estimated as for cpu-throttling: (used + throttled) /
// used. fastest is nil when no start answered; n is how many limits the run has.
func wakeThrottling(l WakeLimit, fastest *WakeLimit, n int) *Finding {
	if l.Starts == 0 || l.ThrottledShare < wakeThrottledMinShare || l.ThrottledPeriodsP50 < throttledPeriodsMin {
		return nil
	}
	ref := WakeLimit{} // compared with nothing when the run has no other limit
	if n > 1 {
		ref = *fastest
	}
	slowdown := ratio(l.CPUUsageP50+l.ThrottledP50, l.CPUUsageP50)
	than := ""
	if ref.CPU != "" && ref.CPU != l.CPU {
		slowdown = ratio(l.WakeP50, ref.WakeP50)
		than = fmt.Sprintf(", %s the %s with a limit of %s", human.Factor(slowdown), human.Seconds(ref.WakeP50), ref.CPU)
	}
	ev := func(metric string, b, v float64, unit string) Evidence {
		return Evidence{Metric: metric, Workload: l.Workload, Phase: PhaseWake, Baseline: b, Value: v, Unit: unit}
	}
	runqMetric := "runq_wait_seconds"
	if l.RunqWaitSource == runqSourceSchedstat {
		runqMetric = "sched_run_delay_seconds"
	}
	return &Finding{
		ID: IDCPUThrottling, Severity: severity(slowdown), Victim: l.Workload, Culprits: []string{},
		Summary: fmt.Sprintf("with a CPU limit of %s the sandbox took %s to answer its first request (p50 of %d starts%s): "+
			"its own quota throttled the boot in %.0f of its %.0f CFS periods, for %s (summed over CPUs: %s of the wake time), "+
			"though a boot needs only about %s of CPU at any limit. Raise or remove the CPU limit of sandboxes that must wake fast.",
			l.CPU, human.Seconds(l.WakeP50), l.Starts, than, l.ThrottledPeriodsP50, l.PeriodsP50, human.Seconds(l.ThrottledP50),
			human.Percent(l.ThrottledShare), human.Seconds(l.CPUUsageP50)),
		Evidence: []Evidence{
			ev("wake_p50", ref.WakeP50, l.WakeP50, UnitSeconds),
			ev("wake_p95", ref.WakeP95, l.WakeP95, UnitSeconds),
			ev("wake_throttled_share", ref.ThrottledShare, l.ThrottledShare, UnitRatio),
			ev("cpu_throttled_seconds", ref.ThrottledP50, l.ThrottledP50, UnitSeconds),
			ev("cpu_throttled_periods", ref.ThrottledPeriodsP50, l.ThrottledPeriodsP50, UnitCount),
			ev("cpu_periods", ref.PeriodsP50, l.PeriodsP50, UnitCount),
			ev("cpu_usage_seconds", ref.CPUUsageP50, l.CPUUsageP50, UnitSeconds),
			ev(runqMetric, ref.RunqWaitP50, l.RunqWaitP50, UnitSeconds),
		},
	}
}
