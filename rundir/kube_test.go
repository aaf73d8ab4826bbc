package rundir_test

import (
	"testing"
	"time"

	"github.com/nodectl/nodectl/rundir"
)

// A pod_info sample reads back as the pod it was made of, whichever fields it has.
func TestPodInfoRoundTrip(t *testing.T) {
	at := time.Date(2026, 12, 5, 3, 0, 0, 0, time.UTC)
	for _, p := range []rundir.Pod{
		{Cgroup: "/kubepods/burstable/poda/c1", Name: "shop/web-0/app", Kind: "container", Namespace: "shop", Pod: "web-0",
			Container: "app", UID: "uid-a", QoS: "burstable", RuntimeClass: "runc", Handler: "runc", Owner: "StatefulSet/web",
			CPURequest: "500m", MemoryRequest: "1Gi"},
		{Cgroup: "/kubepods/besteffort/podb", Name: "sbx/agent-7", Kind: "pod", Namespace: "sbx", Pod: "agent-7", Sandbox: true},
	} {
		r := p.Record(at)
		if r.Type != rundir.TypeSample || r.Metric != rundir.MetricPodInfo || r.Value == nil || *r.Value != 1 || !r.Time.Equal(at) {
			t.Errorf("%s: record %+v, want a pod_info sample of 1 at %v", p.Name, r, at)
		}
		if got, ok := rundir.ParsePodInfo(r); !ok || got != p {
			t.Errorf("%s: read back as %+v (%v)", p.Name, got, ok)
		}
	}
	if _, ok := rundir.ParsePodInfo(rundir.Record{Type: rundir.TypeSample, Metric: rundir.MetricPodInfo, Cgroup: "/x"}); ok {
		t.Error("a pod_info sample without a pod was read as one")
	}
}
