package analyzer

import (
	"slices"
	"testing"

	"github.com/nodectl/nodectl/rundir"
)

// agentWindow is cpuBusy's victim and hogs as an agent window: no workloads, no probe, the
// phases baseline and window; the victim used 4 s of CPU in each phase.
func agentWindow(observed ...rundir.Workload) *builder {
	b := newRun(observed...)
	b.meta.Scenario = rundir.ScenarioAgent
	for i := range b.recs {
		if b.recs[i].Name == rundir.PhaseStress {
			b.recs[i].Name = rundir.PhaseWindow
		}
	}
	return b.histogram(rundir.MetricRunqLatency, victim, lat(1000, 100e-6), lat(2000, 2e-3)).
		counter(rundir.MetricCPUUsage, victim, 4, 4).
		preempted(cpuHog0, 0, 1.9).
		preempted(cpuHog1, 0, 1.8).
		preempted(rundir.CgroupIdle, 0.01, 0.1)
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
