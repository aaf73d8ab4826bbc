package kubeid

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/nodectl/nodectl/internal/maproom"
)

// Kinds of an identity: the kind label of the agent's metrics and the kind of a window's pod.
const (
	KindPod       = "pod"       // a pod's cgroup, its sandbox's, or a gVisor sandbox's containers
	KindContainer = "container" // one container of a runc (or other host-kernel) pod
)

// Identity is the pod, and where the host can tell, the container a cgroup belongs to.
type Identity struct {
	// Name is how findings, incidents and metrics call it: namespace/pod/container for a
	// container, namespace/pod for a pod (its own cgroup, its sandbox's, a gVisor sandbox).
	Name                string
	Kind                string // KindPod or KindContainer
	Namespace, Pod, UID string
	Container           string // "" for a pod
	QoS                 string // guaranteed, burstable, besteffort; "" when unknown
	RuntimeClass        string // the pod's runtimeClassName, from the API server
	Handler             string // the runtime handler that runs it, from the CRI
	Owner               string // Kind/name of the pod's controller, from the API server
	// Sandbox: the pod runs in a gVisor sandbox, whose Sentry, gofer and stubs are charged to
	// the pod as a whole. The host sees only the sandbox's processes: which container's task
	// the Sentry ran is known inside the sandbox alone, so there is no per-container figure.
	Sandbox bool
}

// Container is what the container runtime says of a container or pod sandbox id.
type Container struct {
	Name                          string // the container's name in its pod; "" for a pod sandbox
	Sandbox                       bool   // the id is the pod sandbox's (pause, or a gVisor sandbox's root)
	PodUID, PodName, PodNamespace string
	Handler                       string // the pod's runtime handler: runc, runsc, ...
}

// Lookup finds a container or pod sandbox by id in one listing of the runtime's.
type Lookup func(id string) (Container, bool)

// Pod is what the API server says of a pod on this node.
type Pod struct {
	Namespace, Name, QoS, RuntimeClass, Owner string
}

// Sources are where a Resolver asks; either may be nil.
type Sources struct {
	// Containers lists what the runtime runs (one CRI ListContainers and ListPodSandbox) and
	// returns a lookup by container or sandbox id into that listing.
	Containers func(ctx context.Context) (Lookup, error)
	// Pod looks a pod up by uid (the node's pod informer).
	Pod func(uid string) (Pod, bool)
}

// refreshEvery bounds how often a container id the last listing lacked lists the runtime's
// containers again: a new pod's cgroups appear a moment before the CRI lists them, and a
// cgroup of no container must not turn every lookup into a call.
const refreshEvery = 2 * time.Second

// listTimeout bounds one listing, which no lookup waits for.
const listTimeout = time.Second

// Resolver names cgroups after their pods. It caches by cgroup path (Forget drops removed ones)
// and is safe for concurrent use.
type Resolver struct {
	src Sources

	mu         sync.Mutex
	containers Lookup
	listed     time.Time // the last listing's start
	listErr    error
	listing    bool             // one is under way, away from mu
	closed     bool             // Close was called: no more listings
	lists      sync.WaitGroup   // the listing under way
	cache      map[string]entry // by cgroup; misses too
	room       maproom.Room
}

// entry is a cgroup's identity (Name "": a miss), when it was made, and when the cgroup was
// first looked up.
type entry struct {
	id        Identity
	at, first time.Time
	// partial: a container's cgroup named after its pod alone, the runtime not listing the
	// container yet.
	partial bool
}

// complete: nothing more to learn (a pod the API server described, or a cgroup of no pod).
func (e entry) complete(now time.Time, informer bool) bool {
	if e.id.Name == "" || e.partial {
		return now.Sub(e.at) < refreshEvery
	}
	return e.id.Owner != "" || e.id.QoS != "" && !informer || now.Sub(e.at) < refreshEvery
}

// NewResolver returns a resolver asking src.
func NewResolver(src Sources) *Resolver {
	return &Resolver{src: src, cache: map[string]entry{}}
}

// Identify names cgroup's pod (and container), or reports false for a cgroup no source names
// (not Kubernetes', or a pod the runtime and the API server do not know yet). A pod the API
// server does not know yet (its informer lags) is named by the runtime alone, without QoS or
// owner; once it does, Refresh names it fully.
func (r *Resolver) Identify(cgroup string) (Identity, bool) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.cache[cgroup]; ok && e.complete(now, r.src.Pod != nil) {
		return e.id, e.id.Name != ""
	}
	first := now
	if e, ok := r.cache[cgroup]; ok {
		first = e.first
	}
	id, known, partial := r.identify(cgroup)
	r.cache[cgroup] = entry{id: id, at: now, first: first, partial: partial}
	return id, known
}

// namingGrace is how long a new pod's cgroup may wait for its name: the runtime lists a
// container a moment after its cgroup appears, and the API server's informer lags its pod.
const namingGrace = 10 * time.Second

// Pending reports a cgroup that looks like a pod's or a container's whose name may still come,
// first looked up less than namingGrace ago: nothing names it yet, or only its pod while the
// runtime does not list its container yet. A consumer that keys state by name (the metrics'
// workload label) waits for it rather than keying it by a path or its pod for good.
func (r *Resolver) Pending(cgroup string) bool {
	if ParsePath(cgroup).Level < LevelPod {
		return false
	}
	r.Identify(cgroup)
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.cache[cgroup]
	waiting := e.id.Name == "" || e.partial && r.src.Containers != nil
	return waiting && time.Since(e.first) < namingGrace
}

func (r *Resolver) identify(cgroup string) (id Identity, known, partial bool) {
	ref := ParsePath(cgroup)
	switch {
	case ref.ContainerID != "":
		c, ok := r.container(ref.ContainerID)
		if !ok {
			if ref.PodUID == "" {
				return Identity{}, false, false
			}
			// Known to the API server perhaps, not (yet) to the runtime: the pod.
			id.UID, partial = ref.PodUID, true
			break
		}
		id = Identity{UID: c.PodUID, Namespace: c.PodNamespace, Pod: c.PodName, Handler: c.Handler, Sandbox: isGVisor(c.Handler)}
		if !c.Sandbox && !id.Sandbox {
			id.Container = c.Name
		}
	case ref.PodUID != "":
		id.UID = ref.PodUID
	default:
		return Identity{}, false, false
	}
	if r.src.Pod != nil {
		if p, ok := r.src.Pod(id.UID); ok {
			id.Namespace, id.Pod, id.QoS, id.RuntimeClass, id.Owner = p.Namespace, p.Name, p.QoS, p.RuntimeClass, p.Owner
		}
	}
	if id.QoS == "" {
		id.QoS = ref.QoS
	}
	// A gVisor pod is its sandbox, whichever of its cgroups: the runtime's handler says so of
	// its containers where the CRI is asked, its RuntimeClass of all of them (by the names GKE
	// and runsc use), also where containers are named from the pods' statuses alone.
	if isGVisor(id.RuntimeClass) {
		id.Sandbox, id.Container = true, ""
	}
	if id.Pod == "" {
		return Identity{}, false, false
	}
	id.Kind, id.Name = KindPod, id.Namespace+"/"+id.Pod
	if id.Container != "" {
		id.Kind, id.Name = KindContainer, id.Name+"/"+id.Container
	}
	return id, true, partial
}

// container looks id up in the runtime's last listing. When it lacks id and is older than
// refreshEvery, a new listing starts in the background and the lookup misses: a runtime that
// hangs must not stall the callers, the agent's interval among them, under the resolver's
// lock. The listing names again what it may name once it is in (see list).
func (r *Resolver) container(id string) (Container, bool) {
	if r.containers != nil {
		if c, ok := r.containers(id); ok {
			return c, true
		}
	}
	if r.src.Containers == nil || r.listing || r.closed || time.Since(r.listed) < refreshEvery {
		return Container{}, false
	}
	r.listing, r.listed = true, time.Now()
	r.lists.Add(1)
	go r.list()
	return Container{}, false
}

// list lists the runtime's containers without holding the resolver's lock (within
// listTimeout), then names again each cached container cgroup left unnamed or named after its
// pod alone, from the listing now in memory.
func (r *Resolver) list() {
	defer r.lists.Done()
	ctx, cancel := context.WithTimeout(context.Background(), listTimeout)
	cs, err := r.src.Containers(ctx)
	cancel()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.listing, r.listErr = false, err
	if err != nil {
		return
	}
	r.containers = cs
	now := time.Now()
	for c, e := range r.cache {
		if (e.id.Name == "" || e.partial) && ParsePath(c).ContainerID != "" {
			e.id, _, e.partial = r.identify(c)
			e.at = now
			r.cache[c] = e
		}
	}
}

// Close waits for a listing under way and starts no more; lookups go on from what is known.
func (r *Resolver) Close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.lists.Wait()
}

// isGVisor tells a gVisor runtime handler by name (runsc, gvisor, and the like).
func isGVisor(handler string) bool {
	h := strings.ToLower(handler)
	return strings.Contains(h, "runsc") || strings.Contains(h, "gvisor")
}

// Forget drops removed cgroups from the cache.
func (r *Resolver) Forget(cgroups []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cache = maproom.Delete(&r.room, r.cache, cgroups)
}

// Refresh forgets every cached identity, so that the next lookups ask the sources again (the
// API server's pods synced, a pod's QoS or owner learnt).
func (r *Resolver) Refresh() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.room.Saw(len(r.cache))
	clear(r.cache)
	r.cache = maproom.Fit(&r.room, r.cache)
}

// Stats: the cgroups named, those in the kubelet's tree that nothing names, and the last
// listing's error.
func (r *Resolver) Stats() (named, unknown int, listErr error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for c, e := range r.cache {
		switch {
		case e.id.Name != "":
			named++
		case ParsePath(c).Level >= LevelPod:
			unknown++
		}
	}
	return named, unknown, r.listErr
}

// Named returns the identities of the cgroups keep admits (nil: all), by cgroup, asking the
// sources again for those a lookup left unnamed or incomplete a while ago.
func (r *Resolver) Named(keep func(cgroup string) bool) map[string]Identity {
	out := map[string]Identity{}
	r.EachNamed(keep, func(cgroup string, id Identity) { out[cgroup] = id })
	return out
}

// EachNamed is Named without the map: fn gets each named cgroup keep admits, under the
// resolver's lock (fn must not call it).
func (r *Resolver) EachNamed(keep func(cgroup string) bool, fn func(cgroup string, id Identity)) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for c, e := range r.cache {
		if keep != nil && !keep(c) {
			continue
		}
		if !e.complete(now, r.src.Pod != nil) {
			e.id, _, e.partial = r.identify(c)
			e.at = now
			r.cache[c] = e
		}
		if e.id.Name != "" {
			fn(c, e.id)
		}
	}
}

// EachCached is EachNamed over what the cache holds, without asking the sources: cheap enough
// for every interval, and never waiting on the container runtime.
func (r *Resolver) EachCached(fn func(cgroup string, id Identity)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for c, e := range r.cache {
		if e.id.Name != "" {
			fn(c, e.id)
		}
	}
}
