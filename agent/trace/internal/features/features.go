//go:build linux

package features

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
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
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return fmt.Errorf("reading kernel BTF: %w", err)
	}
	for _, want := range [][2]string{{"task_struct", "sched_info"}, {"sched_info", "last_queued"}, {"cfs_rq", "rq"}} {
		var s *btf.Struct
		if err := spec.TypeByName(want[0], &s); err != nil {
			if errors.Is(err, btf.ErrNotFound) {
				return fmt.Errorf("no struct %s in kernel BTF: %w", want[0], ebpf.ErrNotSupported)
			}
			return err
		}
		if !slices.ContainsFunc(s.Members, func(m btf.Member) bool { return m.Name == want[1] }) {
			return fmt.Errorf("no %s.%s in kernel BTF: %w", want[0], want[1], ebpf.ErrNotSupported)
		}
	}
	return nil
})
