package agent

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/nodectl/nodectl/agent/cri"
	"github.com/nodectl/nodectl/agent/exporter"
	"github.com/nodectl/nodectl/agent/kube"
	"github.com/nodectl/nodectl/host/kubeid"
	"github.com/nodectl/nodectl/internal/maproom"
	"github.com/nodectl/nodectl/rundir"
)

// Kube makes the agent a Kubernetes citizen: pods named in findings, incidents and metrics,
// the node's Lease and Ready condition recorded. Nil in Config on a node without Kubernetes.
type Kube struct {
	Client kube.API // kube.Client
	Node   string   // this node's name (the DaemonSet's NODE_NAME)
	// CRISocket is the container runtime's CRI socket; "" names pods from the API server and
	// the cgroup paths alone (no container names, no runtime handler).
	CRISocket string
}

// maxPendingEvents bounds the Kubernetes events waiting for the next interval's batch (a Lease
// renews every 10 s, the Node changes rarely): a stalled collector drops, and counts, the rest.
const maxPendingEvents = 256

// kubeSide is the agent's Kubernetes side: the pod informer, the CRI, the Lease's and the
// Node's watches, and the events they make for the next batch.
type kubeSide struct {
	cfg    Kube
	log    *slog.Logger
	pods   *kube.Pods
	ids    *kubeid.Resolver
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// kubelet is the kubelet's cgroup, for the Lease's events ("" when not found).
	kubelet func() string

	criMu sync.Mutex
	cri   *cri.Client

	// recorded is the pod each named cgroup's last pod_info sample said, and when: a cgroup's
	// is recorded again when it changes or is refresh old (podMu; bounded by the resolver's
	// cache, which forgets removed cgroups as this does).
	podMu    sync.Mutex
	recorded map[string]recordedPod
	recRoom  maproom.Room
	refresh  time.Duration

	mu      sync.Mutex
	pending []rundir.Record
	dropped uint64
	node    kube.Node
	nodeOK  bool
	lease   exporter.Lease
}

// recordedPod is what a cgroup's last pod_info sample said: its identity and its pod's
// requests (compared, not formatted, at every interval), and when.
type recordedPod struct {
	id       kubeid.Identity
	cpu, mem int64
	at       time.Time
}

// startKube starts the Kubernetes side; the pods it names are recorded again every refresh,
// within the time the flight recorder keeps an unchanged series.
func startKube(cfg Kube, log *slog.Logger, kubelet func() string, refresh time.Duration) *kubeSide {
	ctx, cancel := context.WithCancel(context.Background())
	k := &kubeSide{cfg: cfg, log: log, cancel: cancel, kubelet: kubelet, recorded: map[string]recordedPod{}, refresh: refresh,
		pods: kube.NewPods(cfg.Client, cfg.Node, log.With("component", "pods"))}
	src := kubeid.Sources{Pod: k.pod, Containers: k.statusContainers}
	if cfg.CRISocket != "" {
		src.Containers = k.containers
	}
	k.ids = kubeid.NewResolver(src)
	k.wg.Add(3)
	go func() { defer k.wg.Done(); k.pods.Run(ctx) }()
	go func() {
		defer k.wg.Done()
		kube.WatchLease(ctx, cfg.Client, cfg.Node, k.renewed, log.With("component", "lease"))
	}()
	go func() {
		defer k.wg.Done()
		kube.WatchNode(ctx, cfg.Client, cfg.Node, k.nodeChanged, log)
	}()
	return k
}

func (k *kubeSide) close() {
	k.cancel()
	k.wg.Wait()
	k.ids.Close() // no listing of the CRI past this
	k.criMu.Lock()
	defer k.criMu.Unlock()
	if k.cri != nil {
		k.cri.Close()
		k.cri = nil
	}
}

// push queues an event for the next batch, never blocking its caller (a watch's).
func (k *kubeSide) push(r rundir.Record) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.pending) >= maxPendingEvents {
		k.dropped++
		return
	}
	k.pending = append(k.pending, r)
}

func (k *kubeSide) renewed(r kube.Renewal) {
	l := rundir.LeaseRenewal{RenewTime: r.RenewTime, Gap: r.Gap, Lag: r.Lag, LeaseDuration: r.LeaseDuration, Holder: r.Holder, Resync: r.Resync}
	k.push(l.Record(r.Seen, k.kubelet()))
	k.mu.Lock()
	k.lease.Renewals++
	k.lease.LastGap, k.lease.LastSeen = r.Gap, r.Seen
	k.mu.Unlock()
}

// self is the Kubernetes side's figures for the exporter.
func (k *kubeSide) self(s *exporter.Self) {
	for _, id := range k.ids.Named(nil) {
		s.Pods = append(s.Pods, exporter.PodInfo{Workload: id.Name, Kind: id.Kind, Namespace: id.Namespace, Pod: id.Pod,
			Container: id.Container, QoS: id.QoS, RuntimeClass: id.RuntimeClass, Sandbox: id.Sandbox})
	}
	_, s.UnknownPods, _ = k.ids.Stats()
	k.mu.Lock()
	lease := k.lease
	k.mu.Unlock()
	s.Lease = &lease
}

// classify names a cgroup's workload for the exporter: its pod's name, else by its path once
// its name has had a while to come.
func (k *kubeSide) classify(cg string) (workload, kind string, ok bool) {
	if k.ids.Pending(cg) {
		return "", "", false
	}
	if id, ok := k.ids.Identify(cg); ok {
		return id.Name, id.Kind, true
	}
	workload, kind = kubeid.Classify(cg)
	return workload, kind, true
}

func (k *kubeSide) nodeChanged(old, n kube.Node) {
	k.mu.Lock()
	first := !k.nodeOK
	k.node, k.nodeOK = n, true
	k.mu.Unlock()
	// A Ready transition is a new status or a new lastTransitionTime (a flap between two
	// versions seen still shows as a new transition time).
	if first || n.Ready != old.Ready || !n.ReadySince.Equal(old.ReadySince) {
		k.push(rundir.NodeReady{Status: n.Ready, Reason: n.ReadyReason, Since: n.ReadySince}.Record(time.Now()))
	}
}

// Sample hands the queued events to the interval's batch (a session source), with a pod_info
// sample of each cgroup named since, or whose pod changed or was recorded refresh ago.
func (k *kubeSide) Sample(now time.Time) ([]rundir.Record, error) {
	k.mu.Lock()
	out := k.pending
	k.pending = nil
	k.mu.Unlock()
	k.podMu.Lock()
	defer k.podMu.Unlock()
	// What the resolver holds: the agent asks it of each new cgroup, and a window's meta and
	// the exporter ask it again of those it named partly; the interval never waits on the CRI.
	k.ids.EachCached(func(cg string, id kubeid.Identity) {
		kp, _ := k.pods.ByUID(id.UID)
		rec := recordedPod{id: id, cpu: kp.CPURequestMilli, mem: kp.MemoryRequest, at: now}
		if r, ok := k.recorded[cg]; ok && r.id == id && r.cpu == rec.cpu && r.mem == rec.mem && now.Sub(r.at) < k.refresh {
			return
		}
		k.recorded[cg] = rec
		out = append(out, k.podOf(cg, id).Record(now))
	})
	return out, nil
}

// forget drops removed cgroups, as the resolver does.
func (k *kubeSide) forget(cgroups []string) {
	k.ids.Forget(cgroups)
	k.podMu.Lock()
	defer k.podMu.Unlock()
	k.recorded = maproom.Delete(&k.recRoom, k.recorded, cgroups)
}

// pod is the informer's pod as the resolver wants it.
func (k *kubeSide) pod(uid string) (kubeid.Pod, bool) {
	p, ok := k.pods.ByUID(uid)
	if !ok {
		return kubeid.Pod{}, false
	}
	owner := ""
	if p.OwnerKind != "" {
		owner = p.OwnerKind + "/" + p.OwnerName
	}
	return kubeid.Pod{Namespace: p.Namespace, Name: p.Name, QoS: strings.ToLower(p.QoS), RuntimeClass: p.RuntimeClass, Owner: owner}, true
}

// statusContainers names containers from their pods' statuses, where the agent does not ask
// the runtime's CRI: every container the kubelet reported, by its runtime id. It knows no pod
// sandbox's id (a sandbox's cgroup below its pod's is named after the pod by its path) nor the
// runtime handler, and a container only once the kubelet posted its status.
func (k *kubeSide) statusContainers(context.Context) (kubeid.Lookup, error) {
	return func(id string) (kubeid.Container, bool) {
		p, name, ok := k.pods.ByContainer(id)
		if !ok {
			return kubeid.Container{}, false
		}
		return kubeid.Container{Name: name, PodUID: p.UID, PodName: p.Name, PodNamespace: p.Namespace}, true
	}, nil
}

// containers lists the runtime's containers and sandboxes, dialing the CRI on first use and
// again after a failure.
func (k *kubeSide) containers(ctx context.Context) (kubeid.Lookup, error) {
	k.criMu.Lock()
	defer k.criMu.Unlock()
	if k.cri == nil {
		c, err := cri.Dial(ctx, k.cfg.CRISocket)
		if err != nil {
			k.log.Warn("the container runtime's CRI does not answer: containers are not named", "err", err)
			return nil, err
		}
		k.cri = c
	}
	snap, err := k.cri.Snapshot(ctx)
	if err != nil {
		k.log.Warn("listing the container runtime's containers", "err", err)
		k.cri.Close()
		k.cri = nil
		return nil, err
	}
	return func(id string) (kubeid.Container, bool) {
		if c, s, ok := snap.Container(id); ok && s.PodUID != "" {
			return kubeid.Container{Name: c.Name, PodUID: s.PodUID, PodName: s.PodName, PodNamespace: s.PodNamespace, Handler: s.RuntimeHandler}, true
		}
		if s, ok := snap.Sandbox(id); ok {
			return kubeid.Container{Sandbox: true, PodUID: s.PodUID, PodName: s.PodName, PodNamespace: s.PodNamespace, Handler: s.RuntimeHandler}, true
		}
		return kubeid.Container{}, false
	}, nil
}

// booking is what the API server books on the node now; nil before the Node was read.
func (k *kubeSide) booking() *rundir.Booking {
	k.mu.Lock()
	n, ok := k.node, k.nodeOK
	k.mu.Unlock()
	if !ok || !k.pods.Synced() {
		return nil
	}
	b := &rundir.Booking{At: time.Now(), AllocatableCPUMilli: n.AllocatableCPUMilli, AllocatableMemory: n.AllocatableMemory,
		MaxPods: n.MaxPods, AttachableVolumes: n.AttachableVolumes, AttachedVolumes: n.AttachedVolumes}
	for _, p := range k.pods.List() {
		if p.Phase == "Succeeded" || p.Phase == "Failed" {
			continue
		}
		b.Pods++
		b.RequestedCPUMilli += p.CPURequestMilli
		b.RequestedMemory += p.MemoryRequest
		if p.CPURequestMilli > 0 && (b.SmallestCPURequest == 0 || p.CPURequestMilli < b.SmallestCPURequest) {
			b.SmallestCPURequest = p.CPURequestMilli
		}
		if p.CPULimitMilli > 0 {
			b.CPULimitedPods++
			b.CPULimitTotalMilli += p.CPULimitMilli
		}
		if p.MemoryLimit > 0 {
			b.MemoryLimitedPods++
			b.MemoryLimitTotal += p.MemoryLimit
		}
	}
	return b
}

// windowPods are the named cgroups as a window's meta lists them, those keep admits (nil: all).
func (k *kubeSide) windowPods(keep func(string) bool) []rundir.Pod {
	var out []rundir.Pod
	k.ids.EachNamed(keep, func(cg string, id kubeid.Identity) { out = append(out, k.podOf(cg, id)) })
	return out
}

// podOf is cgroup cg's pod as a window names it: its identity with its pod's requests.
func (k *kubeSide) podOf(cg string, id kubeid.Identity) rundir.Pod {
	p := rundir.Pod{Cgroup: cg, Name: id.Name, Kind: id.Kind, Namespace: id.Namespace, Pod: id.Pod, Container: id.Container,
		UID: id.UID, QoS: id.QoS, RuntimeClass: id.RuntimeClass, Handler: id.Handler, Owner: id.Owner, Sandbox: id.Sandbox}
	if kp, ok := k.pods.ByUID(id.UID); ok {
		p.CPURequest, p.MemoryRequest = milliString(kp.CPURequestMilli), bytesString(kp.MemoryRequest)
	}
	return p
}

// milliString and bytesString write a request in Kubernetes notation; "" for none.
func milliString(m int64) string {
	if m <= 0 {
		return ""
	}
	return resource.NewMilliQuantity(m, resource.DecimalSI).String()
}

func bytesString(b int64) string {
	if b <= 0 {
		return ""
	}
	return resource.NewQuantity(b, resource.BinarySI).String()
}
