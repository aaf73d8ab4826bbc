package podrun

import (
	"testing"

	"github.com/nodectl/nodectl/rundir"
)

// A gVisor pod's cgroups are named after the pod alone: its containers are not the host's.
func TestCgroupOfFallsBackToThePod(t *testing.T) {
	run := &Run{Namespace: "ns"}
	agent := rundir.Meta{Pods: []rundir.Pod{{Name: "ns/victim/victim", Cgroup: "/kubepods/pod1/c1"}, {Name: "ns/hog", Cgroup: "/kubepods/pod2"}}}
	if cg, ok := run.CgroupOf(agent, "victim"); !ok || cg != "/kubepods/pod1/c1" {
		t.Errorf("runc pod: %q %v", cg, ok)
	}
	if cg, ok := run.CgroupOf(agent, "hog"); !ok || cg != "/kubepods/pod2" {
		t.Errorf("gVisor pod: %q %v", cg, ok)
	}
	if _, ok := run.CgroupOf(agent, "gone"); ok {
		t.Error("an unknown pod was found")
	}
}
