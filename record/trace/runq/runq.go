// Package runq loads bpf/runq.bpf.c and reads its maps: run-queue latency per cgroup (wakeup
// or preemption to running) and, for each (victim, preemptor) pair, the number of involuntary
// switches and the time the victim then waited, and the waits after a wakeup charged to what
// ran on the CPU just before the victim got it.
//
// It sees what sched_switch shows. On the Firecracker kernel of the development machines
// (6.18) no sched_switch fires when some system threads leave a CPU (process_api's tokio
// workers, DAMON's damon-regions; ftrace's own event misses them too), so the wait of the
// task that runs next is not recorded; with the kernel's stamps it is added to that task's
// next recorded wait (run_delay's growth), once the task has been preempted under the tracer.
package runq

import "github.com/nodectl/nodectl/rundir/hist"

// Special preemptor ids. Kernfs ids start at 1 (a hierarchy's root, so 1 is taken) and, on
// 64-bit, stay far below 2^63, so none collides with a cgroup.
const (
	PreemptorIdle      uint64 = 0          // the CPU went idle while the victim stayed runnable
	PreemptorThrottled uint64 = ^uint64(0) // the victim's cgroup (or an ancestor) ran out of quota
	PreemptorKernel    uint64 = ^uint64(1) // a kernel thread (kworker, ksoftirqd, jbd2, ...), in whatever cgroup
)

// Defaults for Config's zero values.
const (
	DefaultMaxCgroups = 4096
	DefaultMaxPairs   = 16384
	// DefaultPairsBudget: a node of 1,000 cgroups whose tasks wake each other holds thousands
	// of pairs (each victim with every cgroup that happened to run before it), and reading
	// them was most of the agent's tracer cost (BenchmarkAgent1000Cgroups); 1,024 rather than
	// 2,048 took a tenth off the agent's CPU time there.
	DefaultPairsBudget = 1024
)

// Config configures the tracer.
type Config struct {
	CgroupV1   bool   // ids from the cpu hierarchy instead of the unified one
	MaxCgroups uint32 // latency map capacity; 0 means DefaultMaxCgroups
	MaxPairs   uint32 // pairs map capacity; 0 means DefaultMaxPairs
	// ChangedOnly makes Read return the latency and pairs entries that changed since the
	// previous Read (all of them at the first): on a node of thousands of cgroups most are
	// idle in any interval. Drops and Fill are always whole.
	ChangedOnly bool
	// PairsBudget is about how many pairs ReadPart reads at a call: past it, it reads the
	// pairs map every ceil(pairs / PairsBudget) calls. 0 means DefaultPairsBudget.
	PairsBudget int
	// noKernelStamps traces as on a kernel without the scheduler's stamps (sched_wakeup and
	// sched_wakeup_new traced): for the tests of that way on a kernel that has them.
	noKernelStamps bool
	// noSlots leaves the slots unused, as on a kernel without the helpers that free them:
	// for the tests of the maps.
	noSlots bool
	// noSums reads the maps whole, as on a kernel without the helpers that sum them
	// (bpf/runq.bpf.c, runq_aggregate): for the tests of that way.
	noSums bool
	// slots per CPU (bpf/runq.bpf.c, slots), a power of two; 0 means defaultSlots. A test
	// takes one to send most cgroups, and their pairs, to the maps. slotPairs is how many of
	// a slot's places for pairs may be taken, 0 all (slot_pairs): a test takes one to send a
	// victim's other pairs to the pairs map.
	slots, slotPairs uint32
	// taskStamps is how many tasks' stamps the table holds (bpf/runq.bpf.c, task_stamps), a
	// power of two; 0 sizes it by pid_max (taskStampsFor). A test takes one to send the stamps
	// of all tasks but one to task storage.
	taskStamps uint32
}

// defaultSlots: 512 bytes each with a victim's first four pairs, 32 KiB a CPU (6 MiB at 192
// CPUs), allocated at load; a CPU rarely sees more busy cgroups at once, and the others are
// served by the maps.
const defaultSlots = 64

// maxTaskStamps caps the table of tasks' stamps: 40 bytes each, 2.5 MiB at the cap, allocated
// at load. Where pid_max is higher (4,194,304 where systemd raises it), two live tasks whose
// pids share an entry have the second's stamp in task storage, as exact and slower.
const maxTaskStamps = 1 << 16

// taskStampsFor is the table's size for pid_max: a power of two at least as large, so that
// no two pids share an entry, up to the cap.
func taskStampsFor(pidMax uint64) uint32 {
	n := uint32(1)
	for uint64(n) < pidMax && n < maxTaskStamps {
		n <<= 1
	}
	return n
}

// Pair is what one cgroup's preemptions of another cost it, cumulative; or, Woken, what
// Victim's tasks waited after a wakeup while Preemptor held the CPU.
type Pair struct {
	Victim, Preemptor uint64 // kernfs ids; Preemptor may be a special one (see the constants)
	// Woken: the waits began at a wakeup, and Preemptor is what ran on the CPU just before
	// the task got it (PreemptorThrottled if its quota was out at the wakeup). Waits on an
	// idle CPU are in Latency only.
	Woken bool
	// Involuntary switches of Victim's tasks in favour of Preemptor (Woken: waits), each
	// counted when the task runs again, with its wait.
	Count  uint64
	WaitNs uint64 // time those tasks then waited to run
}

// Stats is a cumulative snapshot of the maps.
type Stats struct {
	Latency map[uint64]hist.Log2 // by cgroup id
	Pairs   []Pair
	Drops   map[string]uint64 // by reason, every reason present
	Fill    float64           // entries over capacity of the fuller map, latency or pairs
	// OnCPU are the cgroups of the tasks on a CPU at the read (idle CPUs left out), each
	// once: they may run on without a switch, which Latency would not show.
	OnCPU []uint64
	// Cost is what this read copied from the kernel.
	Cost Cost
}

// Cost is what a read copied from the kernel's maps: bytes (keys and values, one value per
// possible CPU of a per-CPU map read whole) and the syscalls that copied them.
type Cost struct {
	Bytes, Calls uint64
}
