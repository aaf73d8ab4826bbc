package analyzer

import (
	"reflect"
	"testing"
)

// Churned sandboxes each live in a cgroup of their own below their hog's: their waits, each
// small, add up to the hog, which is named once as the culprit.
func TestSubCgroupsAreTheirWorkload(t *testing.T) {
	churn := hogWorkload("churn", 0)
	b := newRun(victimWorkload(), churn).
		histogram("runq_latency_seconds", victim, lat(1000, 20e-6), lat(2000, 2e-3)).
		gauge("probe_cpu_work_seconds", victim, []float64{0.41, 0.40, 0.42}, []float64{0.70, 0.72, 0.74})
	for _, s := range []string{"/sandbox-0", "/sandbox-1", "/sandbox-2", "/sandbox-3"} {
		b.preempted(churn.Cgroup+s, 0, 1)
	}
	rep := b.analyze(t)
	f := finding(t, rep, IDCPUContention)
	if want := []string{"churn-hog-0"}; !reflect.DeepEqual(f.Culprits, want) {
		t.Errorf("culprits = %v, want %v", f.Culprits, want)
	}
	if e := evidence(t, f, "runq_preempt_wait_seconds", "churn-hog-0"); e.Value != 4 {
		t.Errorf("the hog's wait evidence = %v, want the sum of its sandboxes' 4s", e.Value)
	}
}
