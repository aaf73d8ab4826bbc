package rundir

import (
	"strconv"
	"strings"
)

// Scenarios: Meta.Scenario. Record-mode runs have no workloads; the others are stress runs.
const (
	ScenarioNoisy      = "noisy"
	ScenarioRecord     = "record"
	ScenarioWake       = "wake"
	ScenarioDensity    = "density"
	ScenarioFsyncStorm = "fsync-storm"
	// ScenarioAgent is a window of the agent's flight recorder (`agent export`, `postmortem`,
	// `analyze --from --to`): no workloads of its own, the cgroups under examination as
	// KindObserved, and the phases PhaseBaseline and PhaseWindow.
	ScenarioAgent = "agent"
)

// Scenarios lists every scenario, in the order the docs give them.
var Scenarios = []string{ScenarioNoisy, ScenarioRecord, ScenarioWake, ScenarioDensity, ScenarioFsyncStorm, ScenarioAgent}

// Workload kinds: Workload.Kind.
const (
	KindVictim      = "victim"       // noisy: the probe whose slowdown is explained
	KindHeartbeat   = "heartbeat"    // noisy: a periodic probe standing for a system daemon
	KindCPU         = "cpu"          // noisy hogs, by what they load
	KindDisk        = "disk"         //
	KindMemory      = "memory"       //
	KindFsync       = "fsync"        //
	KindChurn       = "churn"        //
	KindDaemon      = "daemon"       // noisy: a system daemon of the host the run followed
	KindWake        = "wake"         // wake: one start of the sandbox
	KindStormWriter = "fsync-writer" // fsync-storm: one writer
	KindSandbox     = "sandbox"      // density: one sandbox stand-in
	KindNode        = "node"         // density: the run's cgroup, the emulated node
	KindObserved    = "observed"     // agent: a cgroup under examination (an incident's), with no probe
)

// Kinds lists every workload kind, in the order the docs give them.
var Kinds = []string{KindVictim, KindHeartbeat, KindCPU, KindDisk, KindMemory, KindFsync, KindChurn,
	KindDaemon, KindWake, KindStormWriter, KindSandbox, KindNode, KindObserved}

// HogKinds are the neighbour kinds of a noisy run.
var HogKinds = []string{KindCPU, KindDisk, KindMemory, KindFsync, KindChurn}

// Workload names and cgroup leaves that are not derived from a kind and an index.
const (
	WorkloadVictim    = "victim"
	WorkloadHeartbeat = "heartbeat"
	WorkloadNode      = "node"   // density's run cgroup
	CgroupHeartbeat   = "system" // the heartbeat's cgroup below the run's: a system slice's stand-in
)

// HogName names the i-th neighbour of a kind: cpu-hog-0, disk-hog-1, ...
func HogName(kind string, i int) string { return kind + "-hog-" + strconv.Itoa(i) }

// StormWriterName names the i-th writer of an fsync storm.
func StormWriterName(i int) string { return KindStormWriter + "-" + strconv.Itoa(i) }

// SandboxName names the i-th sandbox of a density sweep.
func SandboxName(i int) string { return KindSandbox + "-" + strconv.Itoa(i) }

// WakeName names the i-th start at a CPU limit (Kubernetes notation): wake-50m-0.
func WakeName(cpu string, i int) string { return WakeGroup(cpu) + "-" + strconv.Itoa(i) }

// WakeGroup names the starts at one CPU limit, which the analyzer reports on: wake-50m.
func WakeGroup(cpu string) string { return KindWake + "-" + cpu }

// Phases. A noisy run has baseline, stress and recovery; a record run one phase record; a wake
// run one phase per start, named after its workload; an fsync storm round-<n>; a density sweep
// step-<density>.
const (
	PhaseRecord = "record"
	// PhaseWindow is the window an agent export examines (an incident's, or the one asked
	// for), against PhaseBaseline, the quiet window before it.
	PhaseWindow = "window"

	phaseRoundPrefix = "round-"
	phaseStepPrefix  = "step-"
)

// RoundPhase names the n-th storm (from 1) of an fsync-storm run.
func RoundPhase(n int) string { return phaseRoundPrefix + strconv.Itoa(n) }

// IsRoundPhase says whether a phase is a storm of an fsync-storm run.
func IsRoundPhase(name string) bool { return strings.HasPrefix(name, phaseRoundPrefix) }

// StepPhase names a density sweep's step by the density it brings the node to.
func StepPhase(density int) string { return phaseStepPrefix + strconv.Itoa(density) }

// StepDensity is the density of a step phase; ok is false for any other phase.
func StepDensity(phase string) (density int, ok bool) {
	d, ok := strings.CutPrefix(phase, phaseStepPrefix)
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(d)
	return n, err == nil
}

// Label values of the samplers' and tracers' metrics.
const (
	// LabelResource of the pressure metrics.
	ResourceCPU    = "cpu"
	ResourceMemory = "memory"
	ResourceIO     = "io"

	// LabelKind of the pressure metrics.
	PressureSome = "some"
	PressureFull = "full"

	// LabelKind of memory_refaults_total.
	RefaultAnon = "anon"
	RefaultFile = "file"

	// LabelKind of memory_limit_events_total.
	LimitMax  = "max"
	LimitHigh = "high"
	// LimitSwap: swap its swap.max refused (v2 memory.swap.events max). v1's memory.memsw.failcnt
	// would say the same but stays 0 on 6.18 (memory+swap filled, OOM-killed: measured).
	LimitSwap = "swap"

	// LabelOp of the block and disk metrics.
	OpRead    = "read"
	OpWrite   = "write"
	OpFlush   = "flush"
	OpDiscard = "discard"
	OpOther   = "other"

	// LabelOp of memory_swap_pages_total.
	SwapIn  = "in"
	SwapOut = "out"
)

// BPF programs, the keys of Meta.Tracer and the program label of bpf_drops_total.
const (
	ProgramRunq    = "runq"
	ProgramFsync   = "fsync"
	ProgramBlkio   = "blkio"
	ProgramReclaim = "reclaim"
)

// Label values of fsync_latency_seconds' syscall.
const (
	SyscallFsync         = "fsync"
	SyscallFdatasync     = "fdatasync"
	SyscallSyncFileRange = "sync_file_range"
)

// Roles of a workload's host processes (Workload.HostProcesses).
const (
	RoleSandbox = "sandbox" // gVisor's Sentry: the application kernel, in the host's eyes one process
	RoleGofer   = "gofer"   // gVisor's file proxy: the host side of the sandbox's file I/O
	RoleStub    = "stub"    // a ptrace/systrap stub: where the application's own threads run
	RoleProcess = "process" // a plain process (the process runtime, or inside a runc container)
)

// Runtimes of a workload (Workload.Runtime).
const (
	RuntimeProcess = "process"
	RuntimeRunc    = "runc"
	RuntimeRunsc   = "runsc"
)
