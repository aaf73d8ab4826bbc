package rundir

import (
	"strconv"
	"time"
)

// A density run's events (docs/run-format.md, "event"): its configuration first, each step's
// hold, and at most one collapse. Their labels are encoded and decoded here only.
const (
	EventDensityConfig = "density-config"
	EventHold          = "hold"
	EventCollapse      = "collapse"
	// EventPodEnded: a sandbox pod of a run on a Kubernetes node ended (refused at admission,
	// evicted, OOM-killed, failed); its workload is the pod's.
	EventPodEnded = "pod-ended"

	LabelPhase   = "phase"   // hold: the step
	LabelDensity = "density" // collapse: the step's density
	LabelSignal  = "signal"  // collapse: the criterion crossed first
	LabelValue   = "value"   // collapse: its value
	LabelBound   = "bound"   // collapse: its bound
	LabelEnd     = "end"     // pod-ended: refused, evicted, oom or failed
)

// Collapse signals: which criterion a density step crossed.
const (
	SignalReadiness = "readiness"
	SignalPSIFull   = "psi-memory-full"
	SignalOOMKill   = "oom-kill"
	SignalTickGap   = "tick-gap"
	// Of a run on a Kubernetes node (stress density --node):
	SignalAdmission = "admission"          // the kubelet refused a pod: its bookings (maxPods, allocatable) were full
	SignalEvicted   = "eviction"           // the kubelet evicted a pod under node pressure
	SignalLeaseLate = "lease-renewal-late" // the node's Lease was renewed late by more than the bound
	SignalNotReady  = "node-not-ready"     // the Node's Ready condition left True
)

// Label values of density_memory_bytes' name and density_swap_bytes' name.
const (
	NodeMemoryUsage        = "usage"
	NodeMemoryLimit        = "limit"
	NodeMemoryAnon         = "anon"
	NodeMemoryFile         = "file"
	NodeMemoryInactiveFile = "inactive_file"
	NodeMemorySwap         = "swap"
	NodeMemoryWorkingSet   = "working_set" // usage less inactive file, as the kubelet counts it

	SwapFileSize = "size"
	SwapFileUsed = "used"
)

// DensityConfig is a density sweep's configuration, the labels of its density-config event:
// sizes in bytes, bounds in seconds or shares.
type DensityConfig struct {
	Step, Max, CPUs      int
	SandboxMemoryBytes   int64
	BinaryBytes          int64
	RequestBytes         int64
	LimitBytes           int64
	CPURequestMilli      int64 // each sandbox's CPU request, millicores; 0: none
	CPULimitMilli        int64 // each sandbox's CPU limit, millicores; 0: none
	NodeMemoryBytes      int64 // 0: none
	SwapBytes            int64 // 0: none
	Swappiness           int   // -1: left as it was
	WatermarkScaleFactor int   // -1: left as it was

	CriterionReadinessP99 float64 // seconds
	CriterionPSIFullShare float64
	CriterionOOMKill      bool
	CriterionTickGap      float64 // seconds, 0 = off

	// Node is the Kubernetes node of a run of pods (stress density --node); "" for a local run.
	Node               string
	CriterionLeaseLate float64 // seconds past the renew interval, 0 = off
	// Image is the sandbox pods' image when the user chose one (stress density --image), and
	// ImageBinary the file of it every sandbox maps; "" for the node agent's image.
	Image, ImageBinary string
}

// The density-config event's label keys.
const (
	configStep                  = "step"
	configMax                   = "max"
	configCPUs                  = "cpus"
	configSandboxMemory         = "sandbox_memory_bytes"
	configBinary                = "binary_bytes"
	configRequest               = "request_bytes"
	configLimit                 = "limit_bytes"
	configCPURequest            = "cpu_request_milli"
	configCPULimit              = "cpu_limit_milli"
	configNodeMemory            = "node_memory_bytes"
	configSwap                  = "swap_bytes"
	configSwappiness            = "swappiness"
	configWatermarkScaleFactor  = "watermark_scale_factor"
	configCriterionReadinessP99 = "criterion_readiness_p99_seconds"
	configCriterionPSIFull      = "criterion_psi_full_share"
	configCriterionOOMKill      = "criterion_oom_kill"
	configCriterionTickGap      = "criterion_tick_gap_seconds"
	configNode                  = "node"
	configCriterionLeaseLate    = "criterion_lease_late_seconds"
	configImage                 = "image"
	configImageBinary           = "image_binary"
)

// DensityConfigKeys lists the density-config event's labels, in the order the docs give them.
var DensityConfigKeys = []string{configStep, configMax, configCPUs, configSandboxMemory, configBinary,
	configRequest, configLimit, configCPURequest, configCPULimit, configNodeMemory, configSwap, configSwappiness, configWatermarkScaleFactor,
	configCriterionReadinessP99, configCriterionPSIFull, configCriterionOOMKill, configCriterionTickGap,
	configNode, configCriterionLeaseLate, configImage, configImageBinary}

// Record is the density-config event at t.
func (c DensityConfig) Record(t time.Time) Record {
	i := func(v int64) string { return strconv.FormatInt(v, 10) }
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	oom := "0"
	if c.CriterionOOMKill {
		oom = "1"
	}
	return Record{Type: TypeEvent, Time: t, Name: EventDensityConfig, Message: "density sweep configuration", Labels: map[string]string{
		configStep: strconv.Itoa(c.Step), configMax: strconv.Itoa(c.Max), configCPUs: strconv.Itoa(c.CPUs),
		configSandboxMemory: i(c.SandboxMemoryBytes), configBinary: i(c.BinaryBytes), configRequest: i(c.RequestBytes),
		configLimit: i(c.LimitBytes), configCPURequest: i(c.CPURequestMilli), configCPULimit: i(c.CPULimitMilli),
		configNodeMemory: i(c.NodeMemoryBytes), configSwap: i(c.SwapBytes),
		configSwappiness: strconv.Itoa(c.Swappiness), configWatermarkScaleFactor: strconv.Itoa(c.WatermarkScaleFactor),
		configCriterionReadinessP99: f(c.CriterionReadinessP99), configCriterionPSIFull: f(c.CriterionPSIFullShare),
		configCriterionOOMKill: oom, configCriterionTickGap: f(c.CriterionTickGap),
		configNode: c.Node, configCriterionLeaseLate: f(c.CriterionLeaseLate),
		configImage: c.Image, configImageBinary: c.ImageBinary,
	}}
}

// ParseDensityConfig decodes a density-config event's labels; a missing or malformed label is
// zero (a criterion then off), as an older run without it would mean.
func ParseDensityConfig(labels map[string]string) DensityConfig {
	n := func(k string) int64 { v, _ := strconv.ParseInt(labels[k], 10, 64); return v }
	f := func(k string) float64 { v, _ := strconv.ParseFloat(labels[k], 64); return v }
	return DensityConfig{
		Step: int(n(configStep)), Max: int(n(configMax)), CPUs: int(n(configCPUs)),
		SandboxMemoryBytes: n(configSandboxMemory), BinaryBytes: n(configBinary), RequestBytes: n(configRequest),
		LimitBytes: n(configLimit), CPURequestMilli: n(configCPURequest), CPULimitMilli: n(configCPULimit),
		NodeMemoryBytes: n(configNodeMemory), SwapBytes: n(configSwap),
		Swappiness: int(n(configSwappiness)), WatermarkScaleFactor: int(n(configWatermarkScaleFactor)),
		CriterionReadinessP99: f(configCriterionReadinessP99), CriterionPSIFullShare: f(configCriterionPSIFull),
		CriterionOOMKill: n(configCriterionOOMKill) > 0, CriterionTickGap: f(configCriterionTickGap),
		Node: labels[configNode], CriterionLeaseLate: f(configCriterionLeaseLate),
		Image: labels[configImage], ImageBinary: labels[configImageBinary],
	}
}

// HoldRecord is the hold event of a step: from t its pressure window begins.
func HoldRecord(t time.Time, step string) Record {
	return Record{Type: TypeEvent, Time: t, Name: EventHold, Labels: map[string]string{LabelPhase: step},
		Message: "the step's sandboxes are up and settled; its pressure window begins"}
}

// HoldPhase is the step a hold event names.
func HoldPhase(r Record) string { return r.Labels[LabelPhase] }

// Collapse is a density step that crossed a collapse criterion.
type Collapse struct {
	Density int
	Signal  string
	Value   float64
	Bound   float64
}

// Record is the collapse event at t, when the crossing was first seen.
func (c Collapse) Record(t time.Time, message string) Record {
	return Record{Type: TypeEvent, Time: t, Name: EventCollapse, Message: message, Labels: map[string]string{
		LabelDensity: strconv.Itoa(c.Density), LabelSignal: c.Signal,
		LabelValue: strconv.FormatFloat(c.Value, 'g', 6, 64), LabelBound: strconv.FormatFloat(c.Bound, 'g', 6, 64)}}
}

// ParseCollapse decodes a collapse event.
func ParseCollapse(r Record) Collapse {
	n, _ := strconv.Atoi(r.Labels[LabelDensity])
	v, _ := strconv.ParseFloat(r.Labels[LabelValue], 64)
	b, _ := strconv.ParseFloat(r.Labels[LabelBound], 64)
	return Collapse{Density: n, Signal: r.Labels[LabelSignal], Value: v, Bound: b}
}

// How a pod ended: pod-ended's end label.
const (
	PodEndRefused = "refused" // the kubelet's admission refused it: the node's bookings were full
	PodEndEvicted = "evicted" // the kubelet evicted it under node pressure
	PodEndOOM     = "oom"     // its container was OOM-killed
	PodEndFailed  = "failed"  // it failed otherwise, or exited
)

// PodEnded is a sandbox pod that ended during a run of pods.
type PodEnded struct {
	End, Reason string
}

// Record is the pod-ended event of workload at t, with the kubelet's message.
func (p PodEnded) Record(t time.Time, workload, message string) Record {
	return Record{Type: TypeEvent, Time: t, Name: EventPodEnded, Workload: workload, Message: message,
		// reason: the kubelet's (OutOfpods, Evicted, OOMKilled, ...).
		Labels: map[string]string{LabelEnd: p.End, LabelReason: p.Reason}}
}

// ParsePodEnded reads a pod-ended event; false for any other record.
func ParsePodEnded(r Record) (PodEnded, bool) {
	if r.Type != TypeEvent || r.Name != EventPodEnded {
		return PodEnded{}, false
	}
	return PodEnded{End: r.Labels[LabelEnd], Reason: r.Labels[LabelReason]}, true
}
