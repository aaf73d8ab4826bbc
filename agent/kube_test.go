package agent

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodectl/nodectl/agent/kube/kubefake"
	"github.com/nodectl/nodectl/rundir"
)

func testPod(name string, uid types.UID, cpu, mem string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop", UID: uid},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "app", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, QOSClass: corev1.PodQOSBurstable},
	}
}

// TestKubeSide checks the glue between the API server's view and the agent's records: the
// booking, the pods' names, and the Lease's and the Node's events for the next batch.
func TestKubeSide(t *testing.T) {
	const uid = "0a1b2c3d-4e5f-6789-abcd-ef0123456789"
	dur := int32(40)
	holder := "n1"
	renew := metav1.NewMicroTime(time.Now().Add(-time.Second))
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "n1", Namespace: corev1.NamespaceNodeLease},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &dur, RenewTime: &renew}}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{
		Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("4Gi"),
			corev1.ResourcePods: resource.MustParse("110")},
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"}}}}
	cs := kubefake.New(node, lease, testPod("web-0", uid, "500m", "1Gi"), testPod("web-1", "uid-2", "250m", "256Mi"))
	k := startKube(Kube{Client: cs, Node: "n1"}, slog.New(slog.DiscardHandler), func() string { return "/system.slice/kubelet.service" }, time.Hour)
	defer k.close()

	events := map[string]rundir.Record{}
	deadline := time.Now().Add(10 * time.Second)
	for (len(events) < 2 || k.booking() == nil) && time.Now().Before(deadline) {
		recs, _ := k.Sample(time.Now())
		for _, r := range recs {
			events[r.Name] = r
		}
		time.Sleep(10 * time.Millisecond)
	}
	if r, ok := events[rundir.EventNodeReady]; !ok {
		t.Error("no node_ready event")
	} else if n, _ := rundir.ParseNodeReady(r); n.Status != "True" || n.Reason != "KubeletReady" {
		t.Errorf("node_ready %+v", n)
	}
	if r, ok := events[rundir.EventLeaseRenewal]; !ok {
		t.Error("no lease_renewal event")
	} else if l, _ := rundir.ParseLeaseRenewal(r); r.Cgroup != "/system.slice/kubelet.service" || l.LeaseDuration != 40*time.Second || l.Holder != "n1" {
		t.Errorf("lease_renewal %+v in %s", l, r.Cgroup)
	}
	b := k.booking()
	if b == nil || b.Pods != 2 || b.RequestedCPUMilli != 750 || b.AllocatableCPUMilli != 2000 || b.MaxPods != 110 || b.SmallestCPURequest != 250 {
		t.Fatalf("booking %+v", b)
	}

	// A renewal 12 s later is an event with its gap.
	renew2 := metav1.NewMicroTime(renew.Add(12 * time.Second))
	lease.Spec.RenewTime = &renew2
	if _, err := cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Update(context.Background(), lease, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var gap time.Duration
	for deadline := time.Now().Add(10 * time.Second); gap == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		recs, _ := k.Sample(time.Now())
		for _, r := range recs {
			if l, ok := rundir.ParseLeaseRenewal(r); ok {
				gap = l.Gap
			}
		}
	}
	if gap != 12*time.Second {
		t.Errorf("the second renewal's gap is %v, want 12s", gap)
	}

	// The pod's cgroup is named from the informer (no CRI here).
	id, ok := k.ids.Identify("/kubepods/burstable/pod" + uid)
	if !ok || id.Name != "shop/web-0" || id.QoS != "burstable" {
		t.Errorf("Identify = %+v, %v", id, ok)
	}
	pods := k.windowPods(nil)
	if len(pods) != 1 || pods[0].CPURequest != "500m" || pods[0].MemoryRequest != "1Gi" {
		t.Errorf("windowPods = %+v", pods)
	}

	// The named cgroup is recorded as a pod_info sample once, again only when refresh old, and
	// no more once forgotten.
	podInfos := func(at time.Time) []rundir.Pod {
		recs, _ := k.Sample(at)
		var out []rundir.Pod
		for _, r := range recs {
			if p, ok := rundir.ParsePodInfo(r); ok {
				if !r.Time.Equal(at) {
					t.Errorf("pod_info at %v, sampled at %v", r.Time, at)
				}
				out = append(out, p)
			}
		}
		return out
	}
	now := time.Now()
	if got := podInfos(now); len(got) != 1 || got[0] != pods[0] {
		t.Errorf("first pod_info samples %+v, want %+v", got, pods)
	}
	if got := podInfos(now.Add(time.Minute)); len(got) != 0 {
		t.Errorf("pod_info recorded again a minute later: %+v", got)
	}
	if got := podInfos(now.Add(time.Hour)); len(got) != 1 {
		t.Errorf("pod_info not recorded again after its refresh: %+v", got)
	}
	k.forget([]string{pods[0].Cgroup})
	if got := podInfos(now.Add(3 * time.Hour)); len(got) != 0 || len(k.recorded) != 0 {
		t.Errorf("a forgotten cgroup recorded again (%+v) or remembered (%d)", got, len(k.recorded))
	}
}

// BenchmarkPodInfoSample is the Kubernetes side's cost per interval at 1,000 named pods when
// none changed: what the agent pays every interval to keep their pod_info samples current.
func BenchmarkPodInfoSample(b *testing.B) {
	const n = 1000
	objs := []runtime.Object{}
	for i := range n {
		objs = append(objs, testPod(fmt.Sprint("web-", i), types.UID(fmt.Sprintf("%08d-0000-0000-0000-000000000000", i)), "100m", "64Mi"))
	}
	k := startKube(Kube{Client: kubefake.New(objs...), Node: "n1"}, slog.New(slog.DiscardHandler), func() string { return "" }, time.Hour)
	defer k.close()
	for deadline := time.Now().Add(10 * time.Second); !k.pods.Synced() && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	for i := range n {
		if _, ok := k.ids.Identify(fmt.Sprintf("/kubepods/burstable/pod%08d-0000-0000-0000-000000000000", i)); !ok {
			b.Fatalf("pod %d not named", i)
		}
	}
	now := time.Now()
	if recs, _ := k.Sample(now); len(recs) < n {
		b.Fatalf("%d records at the first interval, want a pod_info for each of %d pods", len(recs), n)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if recs, _ := k.Sample(now.Add(time.Duration(i+1) * time.Second)); len(recs) > 0 {
			b.Fatalf("%d records when no pod changed", len(recs))
		}
	}
}
