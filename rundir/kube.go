package rundir

import (
	"strconv"
	"time"
)

// The agent's Kubernetes events (docs/run-format.md, "event"): every renewal of the node's
// Lease the agent saw, and each transition of the Node's Ready condition. Their labels are
// encoded and decoded here only.
const (
	EventLeaseRenewal = "lease_renewal"
	EventNodeReady    = "node_ready"

	labelRenewTime     = "renew_time"             // the Lease's spec.renewTime, RFC 3339 with nanoseconds
	labelGap           = "gap_seconds"            // since the previous renewal; absent for the first seen
	labelLag           = "lag_seconds"            // from renewTime to the agent seeing it
	labelLeaseDuration = "lease_duration_seconds" // spec.leaseDurationSeconds
	labelHolder        = "holder"
	labelResync        = "resync" // "true": seen by the read that rebuilt the watch after it failed; renewals before it may be unseen
	labelStatus        = "status" // node_ready: True, False, Unknown
	labelReason        = "reason"
)

// LeaseRenewal is one renewal of the node's Lease as the agent saw it.
type LeaseRenewal struct {
	RenewTime     time.Time
	Gap           time.Duration // since the previous renewal seen; 0 for the first
	Lag           time.Duration // from RenewTime (the kubelet's clock) to the agent seeing it
	LeaseDuration time.Duration
	Holder        string
	// Resync: seen by the read that rebuilt the watch after it failed, not by the watch:
	// renewals between the two may have gone unseen, so Gap may span more than one interval.
	Resync bool
}

// Record is the renewal as an event record at seen; Cgroup is the kubelet's when known.
func (l LeaseRenewal) Record(seen time.Time, cgroup string) Record {
	labels := map[string]string{
		labelRenewTime:     l.RenewTime.UTC().Format(time.RFC3339Nano),
		labelLag:           seconds(l.Lag),
		labelLeaseDuration: seconds(l.LeaseDuration),
		labelHolder:        l.Holder,
	}
	if l.Gap > 0 {
		labels[labelGap] = seconds(l.Gap)
	}
	if l.Resync {
		labels[labelResync] = "true"
	}
	return Record{Type: TypeEvent, Time: seen, Name: EventLeaseRenewal, Cgroup: cgroup, Labels: labels,
		Message: "node Lease renewed " + l.Gap.Round(time.Millisecond).String() + " after the previous renewal"}
}

// ParseLeaseRenewal reads a lease_renewal event; false for any other record or a damaged one.
func ParseLeaseRenewal(r Record) (LeaseRenewal, bool) {
	if r.Type != TypeEvent || r.Name != EventLeaseRenewal {
		return LeaseRenewal{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, r.Labels[labelRenewTime])
	if err != nil {
		return LeaseRenewal{}, false
	}
	l := LeaseRenewal{RenewTime: t, Holder: r.Labels[labelHolder], Resync: r.Labels[labelResync] == "true"}
	var ok bool
	if l.Lag, ok = parseSeconds(r.Labels[labelLag]); !ok {
		return LeaseRenewal{}, false
	}
	l.LeaseDuration, _ = parseSeconds(r.Labels[labelLeaseDuration])
	l.Gap, _ = parseSeconds(r.Labels[labelGap])
	return l, true
}

// NodeReady is a transition of the Node's Ready condition.
type NodeReady struct {
	Status, Reason string
	Since          time.Time // the condition's lastTransitionTime
}

// Record is the transition as an event record at seen.
func (n NodeReady) Record(seen time.Time) Record {
	return Record{Type: TypeEvent, Time: seen, Name: EventNodeReady,
		Labels:  map[string]string{labelStatus: n.Status, labelReason: n.Reason, labelRenewTime: n.Since.UTC().Format(time.RFC3339Nano)},
		Message: "node Ready " + n.Status + " (" + n.Reason + ")"}
}

// ParseNodeReady reads a node_ready event.
func ParseNodeReady(r Record) (NodeReady, bool) {
	if r.Type != TypeEvent || r.Name != EventNodeReady {
		return NodeReady{}, false
	}
	since, _ := time.Parse(time.RFC3339Nano, r.Labels[labelRenewTime])
	return NodeReady{Status: r.Labels[labelStatus], Reason: r.Labels[labelReason], Since: since}, true
}

func seconds(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) }

func parseSeconds(s string) (time.Duration, bool) {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, false
	}
	return time.Duration(v * float64(time.Second)), true
}

// Pod is a cgroup the agent named after its Kubernetes pod (and container): Meta.Pods of an
// agent window, so that its findings name pods, not paths.
type Pod struct {
	Cgroup       string `json:"cgroup"`
	Name         string `json:"name"` // namespace/pod[/container]
	Kind         string `json:"kind"` // pod or container
	Namespace    string `json:"namespace"`
	Pod          string `json:"pod"`
	Container    string `json:"container,omitempty"`
	UID          string `json:"uid,omitempty"`
	QoS          string `json:"qos,omitempty"`
	RuntimeClass string `json:"runtime_class,omitempty"`
	Handler      string `json:"handler,omitempty"`
	Owner        string `json:"owner,omitempty"`
	// Sandbox: a gVisor sandbox, charged to the pod as a whole.
	Sandbox bool `json:"sandbox,omitempty"`
	// CPURequest and MemoryRequest are the pod's (all its containers'), in Kubernetes
	// notation; empty when none or unknown.
	CPURequest    string `json:"cpu_request,omitempty"`
	MemoryRequest string `json:"memory_request,omitempty"`
}

// The labels of a pod_info sample (MetricPodInfo), one per Pod field but its cgroup (the
// record's), its name and its kind (both follow from the others). Encoded and decoded here only.
const (
	labelPodNamespace     = "namespace"
	labelPodPod           = "pod"
	labelPodContainer     = "container"
	labelPodUID           = "uid"
	labelPodQoS           = "qos"
	labelPodRuntimeClass  = "runtime_class"
	labelPodHandler       = "handler"
	labelPodOwner         = "owner"
	labelPodSandbox       = "sandbox" // "true" for a gVisor sandbox
	labelPodCPURequest    = "cpu_request"
	labelPodMemoryRequest = "memory_request"
)

// Record is the pod as a pod_info sample of value 1 at t: how the agent's flight recorder
// remembers whom a cgroup belonged to after the pod is gone.
func (p Pod) Record(t time.Time) Record {
	labels := map[string]string{labelPodNamespace: p.Namespace, labelPodPod: p.Pod}
	for k, v := range map[string]string{labelPodContainer: p.Container, labelPodUID: p.UID, labelPodQoS: p.QoS,
		labelPodRuntimeClass: p.RuntimeClass, labelPodHandler: p.Handler, labelPodOwner: p.Owner,
		labelPodCPURequest: p.CPURequest, labelPodMemoryRequest: p.MemoryRequest} {
		if v != "" {
			labels[k] = v
		}
	}
	if p.Sandbox {
		labels[labelPodSandbox] = "true"
	}
	one := 1.0
	return Record{Type: TypeSample, Time: t, Metric: MetricPodInfo, Cgroup: p.Cgroup, Labels: labels, Value: &one}
}

// ParsePodInfo reads a pod_info sample; false for any other record or one without a pod.
func ParsePodInfo(r Record) (Pod, bool) {
	if r.Type != TypeSample || r.Metric != MetricPodInfo || r.Cgroup == "" || r.Labels[labelPodPod] == "" {
		return Pod{}, false
	}
	l := r.Labels
	p := Pod{Cgroup: r.Cgroup, Kind: podKind, Namespace: l[labelPodNamespace], Pod: l[labelPodPod], Container: l[labelPodContainer],
		UID: l[labelPodUID], QoS: l[labelPodQoS], RuntimeClass: l[labelPodRuntimeClass], Handler: l[labelPodHandler],
		Owner: l[labelPodOwner], Sandbox: l[labelPodSandbox] == "true", CPURequest: l[labelPodCPURequest],
		MemoryRequest: l[labelPodMemoryRequest]}
	p.Name = p.Namespace + "/" + p.Pod
	if p.Container != "" {
		p.Kind, p.Name = containerKind, p.Name+"/"+p.Container
	}
	return p, true
}

// The kinds of a Pod (its JSON "kind").
const (
	podKind       = "pod"
	containerKind = "container"
)

// Booking is what the API server books on the node (Meta.Booking of an agent window): what
// bounds scheduling there, against which the kernel's figures tell whether the node is full or
// only booked full.
type Booking struct {
	At                  time.Time `json:"at"`
	AllocatableCPUMilli int64     `json:"allocatable_cpu_milli"`
	AllocatableMemory   int64     `json:"allocatable_memory_bytes"`
	MaxPods             int64     `json:"max_pods"`
	// AttachableVolumes: the node's attach limit (allocatable attachable-volumes-*); 0 unknown.
	AttachableVolumes int64 `json:"attachable_volumes,omitempty"`
	AttachedVolumes   int64 `json:"attached_volumes,omitempty"`
	// Pods counts the pods bound to the node that hold resources (not Succeeded or Failed), and
	// their requests.
	Pods               int64 `json:"pods"`
	RequestedCPUMilli  int64 `json:"requested_cpu_milli"`
	RequestedMemory    int64 `json:"requested_memory_bytes"`
	SmallestCPURequest int64 `json:"smallest_cpu_request_milli,omitempty"`
	CPULimitedPods     int64 `json:"cpu_limited_pods,omitempty"`
	CPULimitTotalMilli int64 `json:"cpu_limit_total_milli,omitempty"`
	MemoryLimitedPods  int64 `json:"memory_limited_pods,omitempty"`
	MemoryLimitTotal   int64 `json:"memory_limit_total_bytes,omitempty"`
}
