package analyzer

import (
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

// capRun is a 250m victim throttled alone (10 s), then kept under its quota by a CPU hog that
// outweighs it (20 s), shaped like the cap-vs-guarantee runs on the development machine: in the
// baseline many short waits and the long waits of its throttled periods, which set its p99; in
// stress no throttling and the hog's waits. stressRunq is its run-queue latency in stress.
func capRun(stressRunq hist.Log2) *builder {
	v := victimWorkload()
	v.CPU = "250m"
	return newRun(v, hogWorkload("cpu", 0)).
		counter(rundir.MetricCPUPeriods, victim, 50, 60).
		counter(rundir.MetricCPUThrottled, victim, 33, 0).
		counter(rundir.MetricCPUThrottledTime, victim, 1.9, 0).
		counter(rundir.MetricCPUUsage, victim, 0.9, 1.2).
		histogram(rundir.MetricRunqLatency, victim, lat(1800, 0.2e-3).Add(lat(30, 60e-3)), stressRunq).
		gauge(rundir.MetricProbeCPUWork, victim, []float64{0.14}, []float64{0.54}).
		preempted(rundir.CgroupThrottled, 1.9, 0).
		preempted(cpuHog0, 0, 8)
}

func TestCapNotGuarantee(t *testing.T) {
	// Wait a second 0.216 s → 0.51 s (2.4x) while the mean rises 1.4x and p99 stays in its bucket.
	rep := capRun(lat(6000, 0.2e-3).Add(lat(150, 60e-3))).analyze(t)
	if got := ids(rep); !reflect.DeepEqual(got, []string{IDCPUThrottling, IDCPUContention}) {
		t.Fatalf("findings = %v, want cpu-throttling (baseline) and cpu-contention (stress)", got)
	}
	c := finding(t, rep, IDCPUContention)
	if !reflect.DeepEqual(c.Culprits, []string{"cpu-hog-0"}) {
		t.Errorf("contention culprits = %v, want cpu-hog-0", c.Culprits)
	}
	if e := evidence(t, c, "runq_wait_per_second", ""); math.Abs(e.Baseline-0.216) > 1e-9 || math.Abs(e.Value-0.51) > 1e-9 || e.Unit != UnitRatio {
		t.Errorf("wait per second evidence = %+v, want 0.216 → 0.51", e)
	}
	// The throttling finding quotes the baseline, where the quota held the victim back, and says
	// that in stress it did not.
	f := finding(t, rep, IDCPUThrottling)
	for _, want := range []string{"66% of its CFS periods in baseline", "1.90s throttled against 900ms of CPU used in baseline",
		"In stress it was throttled in only 0% of its periods"} {
		if !strings.Contains(f.Summary, want) {
			t.Errorf("summary %q lacks %q", f.Summary, want)
		}
	}
	if e := evidence(t, f, "cpu_throttled_period_ratio", ""); e.Phase != "stress" || e.Baseline != 0.66 || e.Value != 0 {
		t.Errorf("period ratio evidence = %+v, want stress 0 against baseline 0.66", e)
	}
}

func TestCapNotGuaranteeWaitsThatDoNotAccountForTheLoss(t *testing.T) {
	// The probe lost 8 s (0.4 s in each of 20 iterations) but the hog added 1 s of its waits:
	// something other than the CPU did most of it, so no contention.
	b := capRun(lat(4000, 0.2e-3).Add(lat(100, 60e-3)))
	b.recs = slices.DeleteFunc(b.recs, func(r rundir.Record) bool {
		return r.Labels[rundir.LabelPreemptor] == cpuHog0
	})
	rep := b.preempted(cpuHog0, 0, 1).analyze(t)
	if got := ids(rep); !reflect.DeepEqual(got, []string{IDCPUThrottling}) {
		t.Fatalf("findings = %v, want only cpu-throttling", got)
	}
	if len(rep.Notes) == 0 || !strings.Contains(rep.Notes[0], "is not half the") {
		t.Errorf("notes %q do not say the hog's waits do not account for the loss", rep.Notes)
	}
}
