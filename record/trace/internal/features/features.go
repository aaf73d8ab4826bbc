//go:build linux

package features

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"
)

// HaveBPFMemAlloc probes for the BPF memory allocator (Linux 6.1), with which a hash map that
// is not preallocated may allocate from any tracing program, sched_switch included. Without
// it the slab allocator is used, which can deadlock on the run-queue lock, warns elsewhere and
// is refused on PREEMPT_RT.
var HaveBPFMemAlloc = sync.OnceValue(func() error {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return fmt.Errorf("reading kernel BTF: %w", err)
	}
	// The name is also a function's: ask for the struct.
	var s *btf.Struct
	err = spec.TypeByName("bpf_mem_alloc", &s)
	if errors.Is(err, btf.ErrNotFound) {
		return fmt.Errorf("no bpf_mem_alloc in kernel BTF: %w", ebpf.ErrNotSupported)
	}
	return err
})

// HaveSchedInfo probes for the scheduler's own enqueue time of a task (CONFIG_SCHED_INFO:
// task_struct.sched_info.last_queued) and for the run queue a CFS queue belongs to, whose
// clock it is in (CONFIG_FAIR_GROUP_SCHED: cfs_rq.rq). With both, the run-queue tracer reads
// a new task's first wait at its switch-in and runs nothing on sched_wakeup_new.
var HaveSchedInfo = sync.OnceValue(func() error {
	return haveMembers([2]string{"task_struct", "sched_info"}, [2]string{"sched_info", "last_queued"}, [2]string{"cfs_rq", "rq"})
})

// HaveKernelStamps probes for everything the run-queue tracer needs to run nothing on a
// wakeup: HaveSchedInfo's fields, the waits a migration split off (sched_info.run_delay), and
// throttling that switches a task out runnable (Linux 6.18's task-based throttling:
// task_struct.throttle_node), which the tracer otherwise checks at each wakeup
// (bpf/runq.bpf.c, kernel_stamps: the same fields).
var HaveKernelStamps = sync.OnceValue(func() error {
	if err := HaveSchedInfo(); err != nil {
		return err
	}
	return haveMembers([2]string{"sched_info", "run_delay"}, [2]string{"task_struct", "throttle_node"})
})

// haveMembers says whether the kernel's BTF has each struct (first) with its member (second).
func haveMembers(want ...[2]string) error {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return fmt.Errorf("reading kernel BTF: %w", err)
	}
	for _, w := range want {
		var s *btf.Struct
		if err := spec.TypeByName(w[0], &s); err != nil {
			if errors.Is(err, btf.ErrNotFound) {
				return fmt.Errorf("no struct %s in kernel BTF: %w", w[0], ebpf.ErrNotSupported)
			}
			return err
		}
		if !slices.ContainsFunc(s.Members, func(m btf.Member) bool { return m.Name == w[1] }) {
			return fmt.Errorf("no %s.%s in kernel BTF: %w", w[0], w[1], ebpf.ErrNotSupported)
		}
	}
	return nil
}

// HaveSlotHelpers probes for the helpers that free a removed cgroup's per-CPU slots in the
// run-queue tracer (bpf/runq.bpf.c, runq_rmdir) and sum its per-CPU maps in the kernel
// (runq_aggregate): bpf_for_each_map_elem (Linux 5.13), bpf_loop (5.17) and
// bpf_map_lookup_percpu_elem (5.19). All are base helpers, offered to every program type a
// privileged loader may load: the probe loads socket filters.
var HaveSlotHelpers = sync.OnceValue(func() error {
	for _, fn := range []asm.BuiltinFunc{asm.FnForEachMapElem, asm.FnLoop, asm.FnMapLookupPercpuElem} {
		if err := features.HaveProgramHelper(ebpf.SocketFilter, fn); err != nil {
			return fmt.Errorf("helper %s: %w", fn, err)
		}
	}
	return nil
})
