//go:build linux

package features

import (
	"errors"
	"fmt"
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
