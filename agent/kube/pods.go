package kube

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/nodectl/nodectl/internal/maproom"
)

// QoS classes, as status.qosClass spells them.
const (
	Guaranteed = string(corev1.PodQOSGuaranteed)
	Burstable  = string(corev1.PodQOSBurstable)
	BestEffort = string(corev1.PodQOSBestEffort)
)

// Pod is what the agent keeps of a pod on this node.
type Pod struct {
	UID, Namespace, Name string
	// QoS is status.qosClass (Guaranteed, Burstable or BestEffort), computed from the
	// requests and limits when the status has none yet.
	QoS string
	// OwnerKind and OwnerName are the controlling owner (a ReplicaSet, not its Deployment:
	// the agent may not read ReplicaSets), "" for a bare pod.
	OwnerKind, OwnerName string
	RuntimeClass         string // spec.runtimeClassName, "" for the default
	Phase                string
	// The pod's totals as the scheduler books them: max(sum of the containers and sidecars,
	// any init container with the sidecars started before it), plus spec.overhead; pod-level
	// resources (spec.resources) replace them where set. A limit is 0 when some container
	// has none: the pod is unbounded in that resource.
	CPURequestMilli, CPULimitMilli, MemoryRequest, MemoryLimit int64
	Containers                                                 []string // spec.containers' names
	// ContainerIDs are the runtime's ids of the pod's containers (init and sidecar ones too)
	// as the kubelet reported them in the status, by id: the container's name. They name a
	// container's cgroup where the agent does not ask the runtime's CRI.
	ContainerIDs map[string]string
}

// Pods follows the pods bound to one node through an informer whose list and watch carry a
// spec.nodeName field selector, so what it holds is bounded by the node's pods.
type Pods struct {
	node     string
	log      *slog.Logger
	informer cache.SharedIndexInformer

	mu          sync.RWMutex
	pods        map[string]Pod    // by UID
	byContainer map[string]string // container id -> pod UID
	room, cRoom maproom.Room
}

// NewPods makes the informer; Run starts it.
func NewPods(api API, node string, log *slog.Logger) *Pods {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	bridgeKlog(log)
	selector := fields.OneTermEqualSelector("spec.nodeName", node).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return api.ListPods(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return api.WatchPods(ctx, o)
		},
	}
	// No periodic resync: a relist after a broken watch already replaces the whole state.
	// The wrapper lets a client that cannot stream the initial list (the fake clientset)
	// say so, and the reflector list instead.
	inf := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, api), &corev1.Pod{}, 0, cache.Indexers{})
	p := &Pods{node: node, log: log.With("component", "pods"), informer: inf, pods: map[string]Pod{}, byContainer: map[string]string{}}
	// The informer's own cache keeps only what Pod needs: managed fields, env, volumes and
	// the rest of a pod's spec would be most of the agent's memory on a dense node.
	if err := inf.SetTransform(trimPod); err != nil {
		p.log.Warn("trimming cached pods", "err", err)
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    p.set,
		UpdateFunc: func(_, obj any) { p.set(obj) },
		DeleteFunc: p.delete,
	}); err != nil {
		p.log.Warn("adding the pod handler", "err", err)
	}
	return p
}

// Run runs the informer until ctx is done.
func (p *Pods) Run(ctx context.Context) {
	start := time.Now()
	go func() {
		if cache.WaitForCacheSync(ctx.Done(), p.informer.HasSynced) {
			p.log.Info("pods listed", "node", p.node, "pods", len(p.List()), "took", time.Since(start).Round(time.Millisecond))
		}
	}()
	p.informer.RunWithContext(ctx)
}

// Synced says whether the first list has been delivered.
func (p *Pods) Synced() bool { return p.informer.HasSynced() }

// ByUID is the pod with uid (the pod<uid> of a kubelet's cgroup path).
func (p *Pods) ByUID(uid string) (Pod, bool) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	pod, ok := p.pods[uid]
	return pod, ok
}

// ByContainer is the pod of the container with the runtime's id, and the container's name, as
// the pod's status reports them.
func (p *Pods) ByContainer(id string) (Pod, string, bool) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	pod, ok := p.pods[p.byContainer[id]]
	if !ok {
		return Pod{}, "", false
	}
	name, ok := pod.ContainerIDs[id]
	return pod, name, ok
}

// List is every pod known on the node, by namespace and name.
func (p *Pods) List() []Pod {
	p.mu.RLock()
	out := make([]Pod, 0, len(p.pods))
	for _, pod := range p.pods {
		out = append(out, pod)
	}
	p.mu.RUnlock()
	slices.SortFunc(out, func(a, b Pod) int {
		if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

func (p *Pods) set(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	// The field selector already bounds the watch; this guards a server (or fake) that
	// ignores it and a pod rebound elsewhere, which must not linger.
	if pod.Spec.NodeName != p.node {
		p.delete(obj)
		return
	}
	v := FromPod(pod)
	p.mu.Lock()
	p.unindex(v.UID)
	p.pods[v.UID] = v
	for id := range v.ContainerIDs {
		p.byContainer[id] = v.UID
	}
	p.room.Saw(len(p.pods))
	p.cRoom.Saw(len(p.byContainer))
	p.mu.Unlock()
}

// unindex drops the container ids of the pod with uid. Called with p.mu held.
func (p *Pods) unindex(uid string) {
	for id := range p.pods[uid].ContainerIDs {
		if p.byContainer[id] == uid {
			delete(p.byContainer, id)
		}
	}
}

func (p *Pods) delete(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj // deleted while the watch was down: the relist found it gone
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	p.mu.Lock()
	p.unindex(string(pod.UID))
	delete(p.pods, string(pod.UID))
	p.pods = maproom.Fit(&p.room, p.pods)
	p.byContainer = maproom.Fit(&p.cRoom, p.byContainer)
	p.mu.Unlock()
}

// trimPod drops what Pod never reads from the informer's copy.
func trimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a DeletedFinalStateUnknown: already trimmed when it was stored
	}
	t := &corev1.Pod{
		TypeMeta: pod.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID,
			ResourceVersion: pod.ResourceVersion, OwnerReferences: pod.OwnerReferences,
			DeletionTimestamp: pod.DeletionTimestamp,
		},
		Spec: corev1.PodSpec{
			NodeName:         pod.Spec.NodeName,
			RuntimeClassName: pod.Spec.RuntimeClassName,
			Overhead:         pod.Spec.Overhead,
			Resources:        pod.Spec.Resources,
			Containers:       trimContainers(pod.Spec.Containers),
			InitContainers:   trimContainers(pod.Spec.InitContainers),
		},
		Status: corev1.PodStatus{Phase: pod.Status.Phase, QOSClass: pod.Status.QOSClass,
			ContainerStatuses:          trimStatuses(pod.Status.ContainerStatuses),
			InitContainerStatuses:      trimStatuses(pod.Status.InitContainerStatuses),
			EphemeralContainerStatuses: trimStatuses(pod.Status.EphemeralContainerStatuses)},
	}
	return t, nil
}

// trimStatuses keeps a container status's name and runtime id.
func trimStatuses(ss []corev1.ContainerStatus) []corev1.ContainerStatus {
	if ss == nil {
		return nil
	}
	out := make([]corev1.ContainerStatus, len(ss))
	for i, st := range ss {
		out[i] = corev1.ContainerStatus{Name: st.Name, ContainerID: st.ContainerID}
	}
	return out
}

func trimContainers(cs []corev1.Container) []corev1.Container {
	if cs == nil {
		return nil
	}
	out := make([]corev1.Container, len(cs))
	for i, c := range cs {
		out[i] = corev1.Container{Name: c.Name, Resources: c.Resources, RestartPolicy: c.RestartPolicy}
	}
	return out
}

// FromPod is what the agent keeps of pod.
func FromPod(pod *corev1.Pod) Pod {
	v := Pod{
		UID:       string(pod.UID),
		Namespace: pod.Namespace,
		Name:      pod.Name,
		QoS:       string(pod.Status.QOSClass),
		Phase:     string(pod.Status.Phase),
	}
	if v.QoS == "" {
		v.QoS = QoS(pod)
	}
	if o := owner(pod.OwnerReferences); o != nil {
		v.OwnerKind, v.OwnerName = o.Kind, o.Name
	}
	if rc := pod.Spec.RuntimeClassName; rc != nil {
		v.RuntimeClass = *rc
	}
	for _, c := range pod.Spec.Containers {
		v.Containers = append(v.Containers, c.Name)
	}
	for _, ss := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses, pod.Status.EphemeralContainerStatuses} {
		for _, st := range ss {
			// <runtime>://<id>, e.g. containerd://0123…; "" until the container was created.
			if _, id, ok := strings.Cut(st.ContainerID, "://"); ok && id != "" {
				if v.ContainerIDs == nil {
					v.ContainerIDs = map[string]string{}
				}
				v.ContainerIDs[id] = st.Name
			}
		}
	}
	v.CPURequestMilli, v.CPULimitMilli = podTotals(pod, corev1.ResourceCPU)
	v.MemoryRequest, v.MemoryLimit = podTotals(pod, corev1.ResourceMemory)
	return v
}

// owner is the controlling owner reference, else the first.
func owner(refs []metav1.OwnerReference) *metav1.OwnerReference {
	for i := range refs {
		if c := refs[i].Controller; c != nil && *c {
			return &refs[i]
		}
	}
	if len(refs) > 0 {
		return &refs[0]
	}
	return nil
}

// amount is a quantity in the unit Pod keeps: millicores for CPU, bytes otherwise.
func amount(name corev1.ResourceName, q resource.Quantity) int64 {
	if name == corev1.ResourceCPU {
		return q.MilliValue()
	}
	return q.Value()
}

// containerAmounts is a container's request and limit of name; a request left out defaults to
// the limit, as the API server's defaulting does. hasLimit is false without a limit.
func containerAmounts(c *corev1.Container, name corev1.ResourceName) (req, lim int64, hasLimit bool) {
	if q, ok := c.Resources.Limits[name]; ok {
		lim, hasLimit = amount(name, q), true
	}
	if q, ok := c.Resources.Requests[name]; ok {
		req = amount(name, q)
	} else if hasLimit {
		req = lim
	}
	return req, lim, hasLimit
}

// podTotals books pod's request and limit of name: the regular containers and the sidecars
// (restartable init containers) run together; each other init container runs alone beside
// the sidecars started before it; the pod needs the larger, plus its overhead. The limit is 0
// when any container lacks one.
func podTotals(pod *corev1.Pod, name corev1.ResourceName) (req, lim int64) {
	var sumReq, sumLim, sideReq, sideLim, initReq, initLim int64
	bounded := true
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		r, l, ok := containerAmounts(c, name)
		bounded = bounded && ok
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			sideReq, sideLim = sideReq+r, sideLim+l
			initReq, initLim = max(initReq, sideReq), max(initLim, sideLim)
			continue
		}
		initReq, initLim = max(initReq, sideReq+r), max(initLim, sideLim+l)
	}
	for i := range pod.Spec.Containers {
		r, l, ok := containerAmounts(&pod.Spec.Containers[i], name)
		bounded = bounded && ok
		sumReq, sumLim = sumReq+r, sumLim+l
	}
	req, lim = max(sumReq+sideReq, initReq), max(sumLim+sideLim, initLim)
	if pr := pod.Spec.Resources; pr != nil { // pod-level resources bound the pod as a whole
		q, hasLim := pr.Limits[name]
		if hasLim {
			lim, bounded = amount(name, q), true
		}
		if q, ok := pr.Requests[name]; ok {
			req = amount(name, q)
		} else if hasLim {
			req = lim
		}
	}
	if !bounded || len(pod.Spec.Containers) == 0 {
		return req + amount(name, pod.Spec.Overhead[name]), 0
	}
	o := amount(name, pod.Spec.Overhead[name])
	return req + o, lim + o
}

// QoS is the class Kubernetes gives pod from its CPU and memory requests and limits (all
// containers, init containers included): BestEffort without any; Guaranteed when every
// container limits both and requests what it limits; Burstable otherwise. Pod-level resources,
// where set, decide instead.
func QoS(pod *corev1.Pod) string {
	names := []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory}
	if pr := pod.Spec.Resources; pr != nil && (len(pr.Requests) > 0 || len(pr.Limits) > 0) {
		return qosOf([]corev1.ResourceRequirements{*pr}, names)
	}
	var rs []corev1.ResourceRequirements
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range cs {
			rs = append(rs, c.Resources)
		}
	}
	return qosOf(rs, names)
}

func qosOf(rs []corev1.ResourceRequirements, names []corev1.ResourceName) string {
	any, guaranteed := false, true
	for _, r := range rs {
		for _, n := range names {
			req, hasReq := r.Requests[n]
			lim, hasLim := r.Limits[n]
			hasReq = hasReq && !req.IsZero()
			hasLim = hasLim && !lim.IsZero()
			any = any || hasReq || hasLim
			if !hasLim || (hasReq && req.Cmp(lim) != 0) {
				guaranteed = false
			}
		}
	}
	switch {
	case !any:
		return BestEffort
	case guaranteed:
		return Guaranteed
	}
	return Burstable
}
