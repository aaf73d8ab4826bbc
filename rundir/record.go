// Package record defines the run directory's records and reads and writes them. The format is
// documented in docs/run-format.md; this file is its reference.
package rundir

import (
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nodectl/nodectl/rundir/hist"
)

// FormatVersion names the run directory format; readers refuse a major version they do not
// know. FormatVersionSegmented is a run whose records may continue past records.jsonl in
// segments (CreateSegmented): a reader that knew only version 1 would miss them, so it must
// refuse such a run.
const (
	FormatVersion          = "nodectl-run/1"
	FormatVersionSegmented = "nodectl-run/2"
)

// Record types (the "type" field of each line of records.jsonl).
const (
	TypeSample = "sample" // a metric value or histogram at a time
	TypePhase  = "phase"  // a phase started or ended
	TypeEvent  = "event"  // a discrete event: an OOM kill, a workload exit, a drop report
)

// Phase names and phase events (the Name and Event fields of a phase record).
const (
	PhaseBaseline = "baseline" // the victim alone
	PhaseStress   = "stress"   // the victim with its neighbours
	PhaseRecovery = "recovery" // after the neighbours stopped

	EventStart = "start"
	EventEnd   = "end"
)

// Record is one line of records.jsonl.
type Record struct {
	Type string    `json:"type"`
	Time time.Time `json:"t"`

	// Samples.
	Metric   string            `json:"metric,omitempty"`
	Cgroup   string            `json:"cgroup,omitempty"`   // path below the hierarchy root, e.g. /nodectl/<run>/victim
	Workload string            `json:"workload,omitempty"` // role in a stress run, when known
	Labels   map[string]string `json:"labels,omitempty"`
	Value    *float64          `json:"value,omitempty"`
	Hist     *hist.Log2        `json:"hist,omitempty"`

	// Phases: Name is baseline|stress|recovery, Event is start|end.
	Name  string `json:"name,omitempty"`
	Event string `json:"event,omitempty"`

	// Events.
	Message string `json:"message,omitempty"`
}

// TracerAttached is the status in Meta.Tracer of a BPF program that attached.
const TracerAttached = "attached"

// Workload is a role of a stress run and where it lives.
type Workload struct {
	Name   string `json:"name"`             // victim, cpu-hog-0, ...
	Kind   string `json:"kind"`             // victim, cpu, disk, memory, fsync
	Cgroup string `json:"cgroup"`           // path below each hierarchy's root
	CPU    string `json:"cpu,omitempty"`    // limit in Kubernetes notation, empty when unlimited
	Memory string `json:"memory,omitempty"` // limit in Kubernetes notation, empty when unlimited
	// CPURequest sets the cgroup's CPU weight as the kubelet does (Kubernetes notation); empty
	// for the kernel's default weight.
	CPURequest string   `json:"cpu_request,omitempty"`
	Target     string   `json:"target,omitempty"` // directory the workload writes to
	Device     string   `json:"device,omitempty"` // MAJ:MIN of the whole disk behind Target
	Period     Duration `json:"period,omitempty"` // a periodic probe's period (the heartbeat's)
	// Runtime runs the workload: process, runc or runsc; empty for what the run did not start.
	Runtime string `json:"runtime,omitempty"`
	// CPUs is the cgroup's cpuset.cpus when the run placed it by a tuned CPU partition
	// (workloads off the reserved CPUs, the heartbeat on them); empty when it did not.
	CPUs string `json:"cpus,omitempty"`
	// HostProcesses are the host processes found in the workload's cgroup while it ran, with
	// their role (a runsc sandbox is a Sentry, a gofer and stubs, all charged to the sandbox's
	// cgroup).
	HostProcesses []HostProcess `json:"host_processes,omitempty"`
}

// HostProcess is one host process running part of a workload.
type HostProcess struct {
	PID  int    `json:"pid"`
	Comm string `json:"comm"`
	Role string `json:"role"` // sandbox, gofer, stub, process
}

// Meta is meta.json: what ran, where, and how it was configured.
type Meta struct {
	Format    string            `json:"format"`
	ID        string            `json:"id"`
	Scenario  string            `json:"scenario"` // noisy, record, ...
	Node      string            `json:"node"`
	Kernel    string            `json:"kernel"`
	CgroupV1  bool              `json:"cgroup_v1"`
	Start     time.Time         `json:"start"`
	Interval  Duration          `json:"interval"`
	Args      []string          `json:"args,omitempty"`
	Workloads []Workload        `json:"workloads,omitempty"`
	Tracer    map[string]string `json:"tracer,omitempty"`  // program -> TracerAttached or why not
	Runtime   string            `json:"runtime,omitempty"` // how workloads ran, e.g. "runsc (platform ptrace, network none)"
	// Pods names the cgroups of Kubernetes pods an agent window holds; Booking is what the
	// API server booked on the node (agent windows on a Kubernetes node only).
	Pods    []Pod    `json:"pods,omitempty"`
	Booking *Booking `json:"booking,omitempty"`
}

// Duration marshals as a Go duration string.
type Duration time.Duration

func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	*d = Duration(v)
	return err
}

// NewMeta describes a run starting now on this host; procfs is where the host's /proc is.
func NewMeta(id, scenario, procfs string, cgroupV1 bool, interval time.Duration, args []string) Meta {
	host, _ := os.Hostname()
	kernel, _ := os.ReadFile(filepath.Join(procfs, "sys/kernel/osrelease"))
	return Meta{Format: FormatVersion, ID: id, Scenario: scenario, Node: host,
		Kernel: strings.TrimSpace(string(kernel)), CgroupV1: cgroupV1, Start: time.Now().UTC(),
		Interval: Duration(interval), Args: args}
}
