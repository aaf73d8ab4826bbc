package kube

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func testNode(ready corev1.ConditionStatus, since time.Time, reason string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node1"},
		Status: corev1.NodeStatus{
			Allocatable: corev1.ResourceList{
				corev1.ResourceCPU:           resource.MustParse("3920m"),
				corev1.ResourceMemory:        resource.MustParse("14Gi"),
				corev1.ResourcePods:          resource.MustParse("58"),
				"attachable-volumes-aws-ebs": resource.MustParse("31"),
			},
			Conditions: []corev1.NodeCondition{
				{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse},
				{Type: corev1.NodeReady, Status: ready, LastTransitionTime: metav1.NewTime(since), Reason: reason},
			},
			VolumesAttached: []corev1.AttachedVolume{{Name: "kubernetes.io/csi/ebs^vol-1"}, {Name: "kubernetes.io/csi/ebs^vol-2"}},
		},
	}
}

func TestFromNode(t *testing.T) {
	n := FromNode(testNode(corev1.ConditionTrue, t0, "KubeletReady"))
	want := Node{Name: "node1", AllocatableCPUMilli: 3920, AllocatableMemory: 14 << 30, MaxPods: 58, AttachableVolumes: 31,
		AttachedVolumes: 2, Ready: "True", ReadySince: t0, ReadyReason: "KubeletReady"}
	if n != want {
		t.Errorf("FromNode = %+v, want %+v", n, want)
	}
	bare := FromNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "new"}})
	if bare.Ready != "Unknown" || bare.AttachableVolumes != 0 {
		t.Errorf("a node without status = %+v, want Ready Unknown and no attach limit", bare)
	}
}

// The Node as the agent keeps it, at start and at each change, from one Get and a watch.
func TestWatchNodeReportsChanges(t *testing.T) {
	cs := newFake(testNode(corev1.ConditionTrue, t0, "KubeletReady"))
	type change struct{ old, new Node }
	got := make(chan change, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		WatchNode(ctx, cs, "node1", func(o, n Node) { got <- change{o, n} }, nil)
	}()
	defer func() { cancel(); <-done }()
	next := func(oldReady, newReady string, since time.Time) Node {
		t.Helper()
		select {
		case c := <-got:
			if c.old.Ready != oldReady || c.new.Ready != newReady || !c.new.ReadySince.Equal(since) {
				t.Fatalf("transition %q -> %q since %v, want %q -> %q since %v", c.old.Ready, c.new.Ready, c.new.ReadySince, oldReady, newReady, since)
			}
			return c.new
		case <-time.After(10 * time.Second):
			t.Fatalf("no transition to %s reported", newReady)
		}
		return Node{}
	}
	set := func(n *corev1.Node) {
		t.Helper()
		if _, err := cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	next("", "True", t0) // once at start, from the zero Node
	t1, t2, t3 := t0.Add(time.Minute), t0.Add(2*time.Minute), t0.Add(3*time.Minute)
	set(testNode(corev1.ConditionUnknown, t1, "NodeStatusUnknown"))
	next("True", "Unknown", t1)
	set(testNode(corev1.ConditionTrue, t2, "KubeletReady"))
	next("Unknown", "True", t2)
	// Allocatable changed, Ready did not: reported, with Ready as it was.
	n := testNode(corev1.ConditionTrue, t2, "KubeletReady")
	n.Status.Allocatable[corev1.ResourcePods] = resource.MustParse("110")
	set(n)
	if got := next("True", "True", t2); got.MaxPods != 110 {
		t.Errorf("max pods %d after the change, want 110", got.MaxPods)
	}
	// The same Node written again (a heartbeat that changed nothing the agent keeps): nothing.
	n.Status.Conditions[0].LastHeartbeatTime = metav1.NewTime(t3)
	set(n)
	time.Sleep(50 * time.Millisecond)
	// Ready again but since later: it flapped between two versions.
	set(testNode(corev1.ConditionTrue, t3, "KubeletReady"))
	next("True", "True", t3)
	select {
	case c := <-got:
		t.Errorf("unexpected transition %+v", c)
	default:
	}
}
