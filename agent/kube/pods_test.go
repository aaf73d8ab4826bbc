package kube

import (
	"context"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// res is a container's resources from "cpu=100m,memory=64Mi"-like pairs.
func res(req, lim map[corev1.ResourceName]string) corev1.ResourceRequirements {
	r := corev1.ResourceRequirements{}
	if req != nil {
		r.Requests = corev1.ResourceList{}
		for k, v := range req {
			r.Requests[k] = resource.MustParse(v)
		}
	}
	if lim != nil {
		r.Limits = corev1.ResourceList{}
		for k, v := range lim {
			r.Limits[k] = resource.MustParse(v)
		}
	}
	return r
}

type rl = map[corev1.ResourceName]string

const (
	cpu = corev1.ResourceCPU
	mem = corev1.ResourceMemory
)

func ctr(name string, r corev1.ResourceRequirements) corev1.Container {
	return corev1.Container{Name: name, Resources: r}
}

func sidecar(name string, r corev1.ResourceRequirements) corev1.Container {
	always := corev1.ContainerRestartPolicyAlways
	return corev1.Container{Name: name, Resources: r, RestartPolicy: &always}
}

func TestFromPodQoSAndTotals(t *testing.T) {
	type want struct {
		qos                            string
		cpuReq, cpuLim, memReq, memLim int64
	}
	for name, tc := range map[string]struct {
		spec corev1.PodSpec
		want want
	}{
		"best_effort": {
			spec: corev1.PodSpec{Containers: []corev1.Container{ctr("a", res(nil, nil)), ctr("b", res(nil, nil))}},
			want: want{qos: BestEffort},
		},
		"guaranteed_limits_only": { // requests default to limits
			spec: corev1.PodSpec{Containers: []corev1.Container{ctr("a", res(nil, rl{cpu: "500m", mem: "128Mi"}))}},
			want: want{Guaranteed, 500, 500, 128 << 20, 128 << 20},
		},
		"guaranteed_two_containers": {
			spec: corev1.PodSpec{Containers: []corev1.Container{
				ctr("a", res(rl{cpu: "1", mem: "1Gi"}, rl{cpu: "1", mem: "1Gi"})),
				ctr("b", res(rl{cpu: "250m", mem: "64Mi"}, rl{cpu: "250m", mem: "64Mi"})),
			}},
			want: want{Guaranteed, 1250, 1250, 1<<30 + 64<<20, 1<<30 + 64<<20},
		},
		"burstable_request_below_limit": {
			spec: corev1.PodSpec{Containers: []corev1.Container{ctr("a", res(rl{cpu: "100m", mem: "64Mi"}, rl{cpu: "200m", mem: "64Mi"}))}},
			want: want{Burstable, 100, 200, 64 << 20, 64 << 20},
		},
		"burstable_one_unbounded_container": { // no CPU limit on b: the pod has none
			spec: corev1.PodSpec{Containers: []corev1.Container{
				ctr("a", res(nil, rl{cpu: "1", mem: "1Gi"})),
				ctr("b", res(rl{cpu: "50m"}, rl{mem: "32Mi"})),
			}},
			want: want{Burstable, 1050, 0, 1<<30 + 32<<20, 1<<30 + 32<<20},
		},
		"burstable_memory_only": {
			spec: corev1.PodSpec{Containers: []corev1.Container{ctr("a", res(rl{mem: "10Mi"}, nil))}},
			want: want{Burstable, 0, 0, 10 << 20, 0},
		},
		"init_container_larger": { // max(sum of containers, any init container)
			spec: corev1.PodSpec{
				InitContainers: []corev1.Container{
					ctr("init1", res(rl{cpu: "2", mem: "16Mi"}, rl{cpu: "2", mem: "16Mi"})),
					ctr("init2", res(rl{cpu: "100m", mem: "512Mi"}, rl{cpu: "100m", mem: "512Mi"})),
				},
				Containers: []corev1.Container{
					ctr("a", res(rl{cpu: "500m", mem: "100Mi"}, rl{cpu: "500m", mem: "100Mi"})),
					ctr("b", res(rl{cpu: "500m", mem: "100Mi"}, rl{cpu: "500m", mem: "100Mi"})),
				},
			},
			want: want{Guaranteed, 2000, 2000, 512 << 20, 512 << 20},
		},
		"init_container_smaller": {
			spec: corev1.PodSpec{
				InitContainers: []corev1.Container{ctr("init", res(rl{cpu: "100m"}, nil))},
				Containers:     []corev1.Container{ctr("a", res(rl{cpu: "300m"}, nil))},
			},
			want: want{Burstable, 300, 0, 0, 0},
		},
		"init_container_decides_qos": { // an unbounded init container makes the pod Burstable
			spec: corev1.PodSpec{
				InitContainers: []corev1.Container{ctr("init", res(rl{cpu: "100m"}, nil))},
				Containers:     []corev1.Container{ctr("a", res(nil, rl{cpu: "1", mem: "1Gi"}))},
			},
			want: want{Burstable, 1000, 0, 1 << 30, 0}, // nor a memory limit
		},
		"sidecar_runs_with_the_containers": { // a restartable init container adds to the sum
			spec: corev1.PodSpec{
				InitContainers: []corev1.Container{
					sidecar("proxy", res(rl{cpu: "100m", mem: "50Mi"}, rl{cpu: "100m", mem: "50Mi"})),
					ctr("migrate", res(rl{cpu: "1", mem: "10Mi"}, rl{cpu: "1", mem: "10Mi"})),
				},
				Containers: []corev1.Container{ctr("a", res(rl{cpu: "200m", mem: "100Mi"}, rl{cpu: "200m", mem: "100Mi"}))},
			},
			// CPU: max(200+100, 100+1000); memory: max(100+50, 50+10).
			want: want{Guaranteed, 1100, 1100, 150 << 20, 150 << 20},
		},
		"overhead_added": { // a RuntimeClass's overhead (gVisor's Sentry) on top
			spec: corev1.PodSpec{
				Overhead:   corev1.ResourceList{cpu: resource.MustParse("250m"), mem: resource.MustParse("120Mi")},
				Containers: []corev1.Container{ctr("a", res(nil, rl{cpu: "1", mem: "256Mi"}))},
			},
			want: want{Guaranteed, 1250, 1250, 376 << 20, 376 << 20},
		},
		"overhead_on_unbounded": {
			spec: corev1.PodSpec{
				Overhead:   corev1.ResourceList{cpu: resource.MustParse("250m")},
				Containers: []corev1.Container{ctr("a", res(rl{cpu: "50m"}, nil))},
			},
			want: want{Burstable, 300, 0, 0, 0},
		},
		"pod_level_resources": {
			spec: corev1.PodSpec{
				Resources:  &corev1.ResourceRequirements{Requests: corev1.ResourceList{cpu: resource.MustParse("2")}, Limits: corev1.ResourceList{cpu: resource.MustParse("4")}},
				Containers: []corev1.Container{ctr("a", res(rl{cpu: "100m"}, nil)), ctr("b", res(nil, nil))},
			},
			want: want{Burstable, 2000, 4000, 0, 0},
		},
	} {
		t.Run(name, func(t *testing.T) {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u"}, Spec: tc.spec}
			got := FromPod(pod)
			w := tc.want
			if got.QoS != w.qos || got.CPURequestMilli != w.cpuReq || got.CPULimitMilli != w.cpuLim || got.MemoryRequest != w.memReq || got.MemoryLimit != w.memLim {
				t.Errorf("got qos %s cpu %d/%d mem %d/%d, want qos %s cpu %d/%d mem %d/%d",
					got.QoS, got.CPURequestMilli, got.CPULimitMilli, got.MemoryRequest, got.MemoryLimit,
					w.qos, w.cpuReq, w.cpuLim, w.memReq, w.memLim)
			}
		})
	}
}

func TestFromPodTakesStatusAndOwner(t *testing.T) {
	yes, gvisor := true, "gvisor"
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web-1", Namespace: "shop", UID: "uid-1", OwnerReferences: []metav1.OwnerReference{
			{Kind: "Node", Name: "n1"},
			{Kind: "ReplicaSet", Name: "web-5d8", Controller: &yes},
		}},
		Spec: corev1.PodSpec{
			RuntimeClassName: &gvisor,
			Containers:       []corev1.Container{ctr("app", res(nil, nil)), ctr("log", res(nil, nil))},
		},
		// The status's class wins over the computed one (BestEffort here).
		Status: corev1.PodStatus{Phase: corev1.PodRunning, QOSClass: corev1.PodQOSBurstable},
	}
	got := FromPod(pod)
	if got.QoS != Burstable || got.OwnerKind != "ReplicaSet" || got.OwnerName != "web-5d8" || got.RuntimeClass != "gvisor" ||
		got.Phase != "Running" || got.UID != "uid-1" || len(got.Containers) != 2 || got.Containers[1] != "log" {
		t.Errorf("FromPod = %+v", got)
	}
}

func boundPod(name, node string, uid types.UID) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: uid},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{ctr("c", res(rl{cpu: "50m"}, nil))}},
		Status:     corev1.PodStatus{Phase: corev1.PodPending},
	}
}

func TestPodsFollowsTheNode(t *testing.T) {
	// The fake ignores field selectors: the pod on node2 checks the informer's own guard.
	cs := newFake(boundPod("a", "node1", "uid-a"), boundPod("other", "node2", "uid-o"))
	p := NewPods(cs, "node1", nil)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { p.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()

	waitFor(t, "the first list", p.Synced)
	if _, ok := p.ByUID("uid-o"); ok {
		t.Error("a pod of another node is kept")
	}
	if pod, ok := p.ByUID("uid-a"); !ok || pod.Name != "a" || pod.CPURequestMilli != 50 || pod.QoS != Burstable {
		t.Errorf("ByUID(uid-a) = %+v, %v", pod, ok)
	}

	pods := cs.CoreV1().Pods("default")
	if _, err := pods.Create(ctx, boundPod("b", "node1", "uid-b"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "pod b", func() bool { _, ok := p.ByUID("uid-b"); return ok })
	running := boundPod("a", "node1", "uid-a")
	running.Status.Phase = corev1.PodRunning
	if _, err := pods.Update(ctx, running, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "pod a running", func() bool { pod, _ := p.ByUID("uid-a"); return pod.Phase == "Running" })
	if err := pods.Delete(ctx, "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "pod b gone", func() bool { _, ok := p.ByUID("uid-b"); return !ok })
	if l := p.List(); len(l) != 1 || l[0].UID != "uid-a" {
		t.Errorf("List = %+v, want pod a alone", l)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A container is found by the runtime id its pod's status reports, through the informer's
// trimmed copy; a restarted container's new id replaces the old, and a deleted pod's ids go.
func TestPodsByContainer(t *testing.T) {
	withIDs := func(ids ...string) *corev1.Pod {
		pod := boundPod("a", "node1", "uid-a")
		pod.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "init", ContainerID: "containerd://" + ids[0]}}
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "app", ContainerID: "containerd://" + ids[1]},
			{Name: "waiting"}} // not created yet: no id
		return pod
	}
	cs := newFake(withIDs("i1", "c1"))
	p := NewPods(cs, "node1", nil)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { p.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()

	waitFor(t, "the first list", p.Synced)
	for id, want := range map[string]string{"i1": "init", "c1": "app"} {
		if pod, name, ok := p.ByContainer(id); !ok || name != want || pod.UID != "uid-a" {
			t.Errorf("ByContainer(%s) = %s, %q, %v; want uid-a, %s", id, pod.UID, name, ok, want)
		}
	}
	if _, _, ok := p.ByContainer(""); ok {
		t.Error("a container without an id is found")
	}
	pods := cs.CoreV1().Pods("default")
	if _, err := pods.Update(ctx, withIDs("i1", "c2"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the restarted container", func() bool { _, _, ok := p.ByContainer("c2"); return ok })
	if _, _, ok := p.ByContainer("c1"); ok {
		t.Error("the restarted container's old id is still found")
	}
	if err := pods.Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the pod gone", func() bool { _, _, ok := p.ByContainer("c2"); return !ok })
	if n := len(p.byContainer); n != 0 {
		t.Errorf("%d container ids kept after the pod's deletion", n)
	}
}
