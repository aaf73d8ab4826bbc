package kubeid

import (
	"context"
	"errors"
	"testing"
	"time"
)

const (
	uid  = "0a1b2c3d-4e5f-6789-abcd-ef0123456789"
	usid = "0a1b2c3d_4e5f_6789_abcd_ef0123456789" // as the systemd driver writes it
	cid  = "3f2a9c0d1e4b5a693f2a9c0d1e4b5a693f2a9c0d1e4b5a693f2a9c0d1e4b5a69"
	sid  = "aaaa9c0d1e4b5a69aaaa9c0d1e4b5a69aaaa9c0d1e4b5a69aaaa9c0d1e4b5a69"
)

func TestParsePath(t *testing.T) {
	for _, c := range []struct {
		name, path string
		want       Ref
	}{
		{"root", "/", Ref{}},
		{"system_unit", "/system.slice/kubelet.service", Ref{}},
		{"nodectl", "/nodectl/r1/victim", Ref{}},
		{"short_hex_leaf", "/docker/abc", Ref{}},
		// cgroupfs driver, v1 or v2 alike.
		{"cgroupfs_kubepods", "/kubepods", Ref{Level: LevelRoot, QoS: QoSGuaranteed}},
		{"cgroupfs_qos", "/kubepods/burstable", Ref{Level: LevelQoS, QoS: QoSBurstable}},
		{"cgroupfs_pod", "/kubepods/besteffort/pod" + uid, Ref{Level: LevelPod, QoS: QoSBestEffort, PodUID: uid}},
		{"cgroupfs_guaranteed_container", "/kubepods/pod" + uid + "/" + cid, Ref{Level: LevelContainer, QoS: QoSGuaranteed, PodUID: uid, ContainerID: cid}},
		{"cgroupfs_crio", "/kubepods/burstable/pod" + uid + "/crio-" + cid, Ref{Level: LevelContainer, QoS: QoSBurstable, PodUID: uid, ContainerID: cid}},
		{"cgroupfs_crio_conmon", "/kubepods/burstable/pod" + uid + "/crio-conmon-" + cid, Ref{Level: LevelContainer, QoS: QoSBurstable, PodUID: uid, ContainerID: cid}},
		{"cgroupfs_below_container", "/kubepods/burstable/pod" + uid + "/" + cid + "/init", Ref{Level: LevelContainer, QoS: QoSBurstable, PodUID: uid, ContainerID: cid}},
		{"cgroup_root_prefix", "/nodectl/testcluster/kubepods/besteffort/pod" + uid, Ref{Level: LevelPod, QoS: QoSBestEffort, PodUID: uid}},
		// systemd driver.
		{"systemd_containerd", "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + usid + ".slice/cri-containerd-" + cid + ".scope",
			Ref{Level: LevelContainer, QoS: QoSBurstable, PodUID: uid, ContainerID: cid}},
		{"systemd_crio", "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + usid + ".slice/crio-" + cid + ".scope",
			Ref{Level: LevelContainer, QoS: QoSBestEffort, PodUID: uid, ContainerID: cid}},
		{"systemd_guaranteed_pod", "/kubepods.slice/kubepods-pod" + usid + ".slice", Ref{Level: LevelPod, QoS: QoSGuaranteed, PodUID: uid}},
		{"systemd_kind_prefix", "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod" + usid + ".slice",
			Ref{Level: LevelPod, QoS: QoSBestEffort, PodUID: uid}},
		{"not_a_pod", "/kubepods/not-a-pod", Ref{}},
		// Outside kubepods: only the id.
		{"containerd_namespace", "/k8s.io/" + cid, Ref{Level: LevelContainer, ContainerID: cid}},
		{"containerd_below", "/nodectl/testcluster/k8s.io/" + cid + "/sub", Ref{Level: LevelContainer, ContainerID: cid}},
		{"docker_scope", "/system.slice/docker-" + cid + ".scope", Ref{Level: LevelContainer, ContainerID: cid}},
	} {
		if got := ParsePath(c.path); got != c.want {
			t.Errorf("%s: ParsePath(%q) = %+v, want %+v", c.name, c.path, got, c.want)
		}
	}
}

func TestKubepods(t *testing.T) {
	for cg, want := range map[string]string{
		"/kubepods/burstable/pod1/abc": "/kubepods",
		"/kubepods":                    "/kubepods",
		"/nodectl/testcluster/kubepods/besteffort/pod2/def":                       "/nodectl/testcluster/kubepods",
		"/kubepods.slice/kubepods-burstable.slice/x.scope":                        "/kubepods.slice",
		"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice": "/kubelet.slice/kubelet-kubepods.slice",
		"/system.slice/containerd.service":                                        "",
	} {
		if got := Kubepods(cg); got != want {
			t.Errorf("Kubepods(%s) = %q, want %q", cg, got, want)
		}
	}
}

// fakeSources answer from maps and count the runtime's listings.
type fakeSources struct {
	containers map[string]Container
	pods       map[string]Pod
	lists      int
	err        error
}

func (f *fakeSources) sources() Sources {
	return Sources{
		Containers: func(context.Context) (Lookup, error) {
			f.lists++
			if f.err != nil {
				return nil, f.err
			}
			listed := map[string]Container{}
			for k, v := range f.containers {
				listed[k] = v
			}
			return func(id string) (Container, bool) { c, ok := listed[id]; return c, ok }, nil
		},
		Pod: func(uid string) (Pod, bool) { p, ok := f.pods[uid]; return p, ok },
	}
}

// identified is cgroup's identity once the listing its first lookup started is in.
func identified(r *Resolver, cgroup string) (Identity, bool) {
	r.Identify(cgroup)
	r.lists.Wait()
	return r.Identify(cgroup)
}

func TestResolverNamesPodsAndContainers(t *testing.T) {
	f := &fakeSources{
		containers: map[string]Container{
			sid: {Sandbox: true, PodUID: uid, PodName: "web-0", PodNamespace: "shop", Handler: "runc"},
			cid: {Name: "app", PodUID: uid, PodName: "web-0", PodNamespace: "shop", Handler: "runc"},
		},
		pods: map[string]Pod{uid: {Namespace: "shop", Name: "web-0", QoS: QoSBurstable, Owner: "StatefulSet/web"}},
	}
	r := NewResolver(f.sources())
	defer r.Close()
	cases := []struct {
		name, cgroup string
		want         Identity
	}{
		{"container", "/kubepods/burstable/pod" + uid + "/" + cid,
			Identity{Name: "shop/web-0/app", Kind: KindContainer, Namespace: "shop", Pod: "web-0", UID: uid, Container: "app", QoS: QoSBurstable, Handler: "runc", Owner: "StatefulSet/web"}},
		{"sandbox_is_the_pod", "/k8s.io/" + sid,
			Identity{Name: "shop/web-0", Kind: KindPod, Namespace: "shop", Pod: "web-0", UID: uid, QoS: QoSBurstable, Handler: "runc", Owner: "StatefulSet/web"}},
		{"pod_cgroup_from_the_informer", "/kubepods/burstable/pod" + uid,
			Identity{Name: "shop/web-0", Kind: KindPod, Namespace: "shop", Pod: "web-0", UID: uid, QoS: QoSBurstable, Owner: "StatefulSet/web"}},
	}
	// The first lookups start the runtime's listing, which names them when it is in.
	for _, c := range cases {
		r.Identify(c.cgroup)
	}
	r.lists.Wait()
	for _, c := range cases {
		got, ok := r.Identify(c.cgroup)
		if !ok || got != c.want {
			t.Errorf("%s: Identify = %+v, %v; want %+v", c.name, got, ok, c.want)
		}
	}
	if f.lists != 1 {
		t.Errorf("the runtime was listed %d times, want once", f.lists)
	}
	if _, ok := r.Identify("/system.slice/kubelet.service"); ok {
		t.Error("a system unit was named as a pod")
	}
	named, unknown, _ := r.Stats()
	if named != 3 || unknown != 0 {
		t.Errorf("Stats = %d named, %d unknown; want 3, 0", named, unknown)
	}
}

func TestResolverGVisorSandboxIsThePod(t *testing.T) {
	f := &fakeSources{containers: map[string]Container{
		sid: {Sandbox: true, PodUID: uid, PodName: "agent-7", PodNamespace: "sbx", Handler: "runsc"},
		cid: {Name: "tool", PodUID: uid, PodName: "agent-7", PodNamespace: "sbx", Handler: "runsc"},
	}}
	// The pod's own cgroup too, which the runtime does not list: by its RuntimeClass.
	f.pods = map[string]Pod{uid: {Namespace: "sbx", Name: "agent-7", QoS: QoSBestEffort, RuntimeClass: "gvisor"}}
	r := NewResolver(f.sources())
	defer r.Close()
	for _, cg := range []string{"/k8s.io/" + sid, "/kubepods/besteffort/pod" + uid + "/" + cid, "/kubepods/besteffort/pod" + uid} {
		got, ok := identified(r, cg)
		if !ok || got.Name != "sbx/agent-7" || got.Kind != KindPod || !got.Sandbox || got.Container != "" {
			t.Errorf("Identify(%s) = %+v, %v; want the pod sbx/agent-7 as a sandbox", cg, got, ok)
		}
	}
}

func TestResolverListsAgainOnlyAfterAWhile(t *testing.T) {
	f := &fakeSources{containers: map[string]Container{}}
	r := NewResolver(f.sources())
	defer r.Close()
	cg := "/k8s.io/" + cid
	for range 5 {
		if _, ok := r.Identify(cg); ok {
			t.Fatal("named a container the runtime does not list")
		}
	}
	r.lists.Wait()
	if f.lists != 1 {
		t.Fatalf("listed %d times in a burst of misses, want 1", f.lists)
	}
	_, unknown, _ := r.Stats()
	if unknown != 1 {
		t.Errorf("unknown = %d, want 1", unknown)
	}
	// The container appears; once the miss is older than refreshEvery it is listed again.
	f.containers[cid] = Container{Name: "app", PodUID: uid, PodName: "p", PodNamespace: "ns", Handler: "runc"}
	r.mu.Lock()
	r.listed = r.listed.Add(-refreshEvery)
	e := r.cache[cg]
	e.at = e.at.Add(-refreshEvery)
	r.cache[cg] = e
	r.mu.Unlock()
	if got, ok := identified(r, cg); !ok || got.Name != "ns/p/app" {
		t.Errorf("after the container appeared: %+v, %v", got, ok)
	}
	r.Forget([]string{cg})
	if named, unknown, _ := r.Stats(); named != 0 || unknown != 0 {
		t.Errorf("after Forget: %d named, %d unknown", named, unknown)
	}
}

// EachCached lists what lookups named, and never asks the sources: a cgroup the runtime lists
// only now stays unnamed there until a lookup (or Named) asks again.
func TestResolverEachCachedAsksNoSource(t *testing.T) {
	f := &fakeSources{containers: map[string]Container{}}
	r := NewResolver(f.sources())
	defer r.Close()
	named, unnamed := "/kubepods/pod"+uid+"/"+cid, "/k8s.io/"+sid
	f.containers[cid] = Container{Name: "app", PodUID: uid, PodName: "p", PodNamespace: "ns", Handler: "runc"}
	identified(r, named)
	delete(f.containers, cid)
	r.mu.Lock()
	r.listed = r.listed.Add(-refreshEvery)
	r.mu.Unlock()
	identified(r, unnamed)
	f.containers[sid] = Container{Sandbox: true, PodUID: uid, PodName: "p", PodNamespace: "ns"}
	r.mu.Lock()
	r.listed = r.listed.Add(-refreshEvery) // a lookup would list again now
	r.mu.Unlock()
	lists := f.lists
	got := map[string]string{}
	r.EachCached(func(cg string, id Identity) { got[cg] = id.Name })
	if len(got) != 1 || got[named] != "ns/p/app" || f.lists != lists {
		t.Errorf("EachCached gave %v after %d listings, want only %s named and no listing", got, f.lists-lists, named)
	}
}

func TestResolverRuntimeDown(t *testing.T) {
	f := &fakeSources{err: errors.New("connection refused")}
	r := NewResolver(f.sources())
	defer r.Close()
	// The pod's cgroup is still named once the API server knows it.
	f.pods = map[string]Pod{uid: {Namespace: "ns", Name: "p", QoS: QoSBestEffort}}
	if got, ok := identified(r, "/kubepods/besteffort/pod"+uid+"/"+cid); !ok || got.Name != "ns/p" {
		t.Errorf("Identify with the runtime down = %+v, %v; want the pod ns/p", got, ok)
	}
	if _, _, err := r.Stats(); err == nil {
		t.Error("Stats does not report the listing's error")
	}
}

func TestResolverPendingWhileANameMayCome(t *testing.T) {
	f := &fakeSources{containers: map[string]Container{}}
	r := NewResolver(f.sources())
	pod := "/kubepods/besteffort/pod" + uid + "/" + cid
	if !r.Pending(pod) {
		t.Error("a new container's cgroup nothing names yet is not pending")
	}
	if r.Pending("/system.slice/kubelet.service") {
		t.Error("a system unit is pending a pod's name")
	}
	// Past the grace, the cgroup is no longer waited for.
	r.mu.Lock()
	e := r.cache[pod]
	e.first = e.first.Add(-namingGrace)
	r.cache[pod] = e
	r.mu.Unlock()
	if r.Pending(pod) {
		t.Error("still pending after the grace")
	}
}

// A container the runtime does not list yet is named after its pod meanwhile, and pending: a
// consumer keying by name waits for the container's own name.
func TestResolverContainerBeforeTheRuntimeListsIt(t *testing.T) {
	f := &fakeSources{containers: map[string]Container{}, pods: map[string]Pod{uid: {Namespace: "ns", Name: "p", QoS: QoSBurstable}}}
	r := NewResolver(f.sources())
	defer r.Close()
	cg := "/kubepods/burstable/pod" + uid + "/" + cid
	if id, ok := identified(r, cg); !ok || id.Name != "ns/p" || !r.Pending(cg) {
		t.Fatalf("before the listing: %+v, %v, pending %v; want the pod, pending", id, ok, r.Pending(cg))
	}
	f.containers[cid] = Container{Name: "app", PodUID: uid, PodName: "p", PodNamespace: "ns", Handler: "runc"}
	r.mu.Lock()
	r.listed = r.listed.Add(-refreshEvery)
	e := r.cache[cg]
	e.at = e.at.Add(-refreshEvery)
	r.cache[cg] = e
	r.mu.Unlock()
	if id, ok := identified(r, cg); !ok || id.Name != "ns/p/app" || r.Pending(cg) {
		t.Errorf("once listed: %+v, %v, pending %v; want the container, not pending", id, ok, r.Pending(cg))
	}
}

// A runtime whose listing hangs stalls no lookup: the listing runs away from the resolver's
// lock, and what it names comes once it is in.
func TestResolverHungRuntimeStallsNoLookup(t *testing.T) {
	release := make(chan struct{})
	src := Sources{
		Containers: func(context.Context) (Lookup, error) {
			<-release // hung, deaf to its deadline
			return func(id string) (Container, bool) {
				return Container{Name: "app", PodUID: uid, PodName: "p", PodNamespace: "ns", Handler: "runc"}, id == cid
			}, nil
		},
		Pod: func(string) (Pod, bool) {
			return Pod{Namespace: "ns", Name: "p", QoS: QoSBurstable, Owner: "Job/p"}, true
		},
	}
	r := NewResolver(src)
	cg := "/kubepods/burstable/pod" + uid + "/" + cid
	answered := make(chan Identity)
	go func() {
		id, _ := r.Identify(cg) // starts the listing
		r.Identify("/kubepods/burstable/pod" + uid)
		r.Named(nil)
		r.EachCached(func(string, Identity) {})
		r.Stats()
		answered <- id
	}()
	select {
	case id := <-answered:
		if id.Name != "ns/p" {
			t.Errorf("while the runtime hangs the container is %+v, want its pod ns/p", id)
		}
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatal("lookups waited for the hung runtime's listing")
	}
	close(release)
	r.Close()
	if id, ok := r.Identify(cg); !ok || id.Name != "ns/p/app" {
		t.Errorf("once the listing came in: %+v, %v; want ns/p/app", id, ok)
	}
}
