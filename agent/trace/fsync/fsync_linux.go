//go:build linux

package fsync

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"

	"github.com/nodectl/nodectl/agent/blockdev"
	"github.com/nodectl/nodectl/agent/hist"
)

var syscallNames = map[fsyncFsyncSyscall]string{
	fsyncFsyncSyscallSYSCALL_FSYNC:           "fsync",
	fsyncFsyncSyscallSYSCALL_FDATASYNC:       "fdatasync",
	fsyncFsyncSyscallSYSCALL_SYNC_FILE_RANGE: "sync_file_range",
}

// Drop reasons as reported in Stats.Drops.
var dropReasons = map[fsyncDropReason]string{
	fsyncDropReasonDROP_LATENCY_FULL:  "latency_map_full",
	fsyncDropReasonDROP_INFLIGHT_FULL: "inflight_full",
}

// Tracer owns the loaded programs, their maps and links. It is not safe for concurrent use.
type Tracer struct {
	objs  fsyncObjects
	links []link.Link
	sysfs string
}

// New loads the programs and attaches them to the enter and exit tracepoints of the three
// syscalls. A failed New closes what it opened.
func New(cfg Config, log *slog.Logger) (*Tracer, error) {
	if cfg.MaxEntries == 0 {
		cfg.MaxEntries = DefaultMaxEntries
	}
	if cfg.Sysfs == "" {
		cfg.Sysfs = "/sys"
	}
	spec, err := loadFsync()
	if err != nil {
		return nil, fmt.Errorf("loading fsync spec: %w", err)
	}
	if err := spec.Variables[fsyncVarCgroupV1].Set(cfg.CgroupV1); err != nil {
		return nil, fmt.Errorf("setting cgroup_v1: %w", err)
	}
	spec.Maps[fsyncMapLatency].MaxEntries = cfg.MaxEntries
	if lazyMapsSafe(log) {
		// Preallocated per-CPU values cost max_entries x value size x CPUs up front.
		spec.Maps[fsyncMapLatency].Flags |= bpfFNoPrealloc
	}

	t := &Tracer{sysfs: cfg.Sysfs}
	if err := spec.LoadAndAssign(&t.objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("loading fsync objects: %w (verifier log: %+v)", err, ve)
		}
		return nil, fmt.Errorf("loading fsync objects: %w", err)
	}
	// Exits first: a call that enters before its exit is attached would leave an entry behind.
	for _, tp := range []struct {
		name string
		prog *ebpf.Program
	}{
		{"sys_exit_fsync", t.objs.ExitFsync},
		{"sys_exit_fdatasync", t.objs.ExitFdatasync},
		{"sys_exit_sync_file_range", t.objs.ExitSyncFileRange},
		{"sys_enter_fsync", t.objs.EnterFsync},
		{"sys_enter_fdatasync", t.objs.EnterFdatasync},
		{"sys_enter_sync_file_range", t.objs.EnterSyncFileRange},
	} {
		l, err := link.Tracepoint("syscalls", tp.name, tp.prog, nil)
		if err != nil {
			t.Close()
			return nil, fmt.Errorf("attaching to syscalls/%s (tracefs must be mounted): %w", tp.name, err)
		}
		t.links = append(t.links, l)
	}
	return t, nil
}

// bpfFNoPrealloc is BPF_F_NO_PREALLOC from the kernel's UAPI.
const bpfFNoPrealloc = 1

// lazyMapsSafe reports whether hash maps may allocate at run time from a tracing program
// without risk: only with the BPF memory allocator (Linux 6.1). Older kernels warn, or refuse
// on PREEMPT_RT.
func lazyMapsSafe(log *slog.Logger) bool {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		log.Warn("reading kernel BTF, preallocating maps", "component", "fsync", "err", err)
		return false
	}
	_, err = spec.AnyTypeByName("bpf_mem_alloc")
	return err == nil
}

// Read sums the per-CPU values of the maps. Keys that differ only in the partition of a disk
// are added together.
func (t *Tracer) Read() (Stats, error) {
	if t.objs.Latency == nil {
		return Stats{}, errors.New("reading fsync maps: tracer closed")
	}
	st := Stats{Latency: map[Key]hist.Log2{}, Drops: map[string]uint64{}}

	var k fsyncFsyncKey
	var hs []fsyncHist
	it := t.objs.Latency.Iterate()
	for it.Next(&k, &hs) {
		var slots [len(fsyncHist{}.Slots)]uint64
		var count, sum uint64
		for _, h := range hs {
			for i, v := range h.Slots {
				slots[i] += v
			}
			count += h.Count
			sum += h.SumNs
		}
		key := Key{Cgroup: k.Cgroup, Dev: t.disk(k.Dev), Syscall: syscallNames[k.Syscall]}
		st.Latency[key] = st.Latency[key].Add(hist.FromSlots(slots[:], count, sum))
	}
	if err := it.Err(); err != nil {
		return Stats{}, fmt.Errorf("reading fsync latency map: %w", err)
	}

	for r, name := range dropReasons {
		var per []uint64
		if err := t.objs.Drops.Lookup(uint32(r), &per); err != nil {
			return Stats{}, fmt.Errorf("reading fsync drops %s: %w", name, err)
		}
		var n uint64
		for _, v := range per {
			n += v
		}
		st.Drops[name] = n
	}
	return st, nil
}

// disk names the whole disk of a superblock's device. Major 0 is an anonymous device (tmpfs,
// overlay, btrfs subvolumes), which no block queue carries.
func (t *Tracer) disk(dev uint32) string {
	if dev>>20 == 0 {
		return ""
	}
	return blockdev.WholeDisk(t.sysfs, blockdev.Name(dev))
}

// Forget deletes the entries of cgroups that live reports gone and returns how many it
// deleted.
func (t *Tracer) Forget(live func(id uint64) bool) (int, error) {
	if t.objs.Latency == nil {
		return 0, errors.New("forgetting fsync entries: tracer closed")
	}
	keys, err := keys[fsyncFsyncKey](t.objs.Latency)
	if err != nil {
		return 0, fmt.Errorf("listing fsync latency map: %w", err)
	}
	n := 0
	for _, k := range keys {
		if live(k.Cgroup) {
			continue
		}
		if err := t.objs.Latency.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return n, fmt.Errorf("deleting fsync latency of cgroup %d: %w", k.Cgroup, err)
		}
		n++
	}
	return n, nil
}

// keys lists a hash map's keys; entries added meanwhile may be missed.
func keys[K any](m *ebpf.Map) ([]K, error) {
	var out []K
	var prev any // nil asks for the first key
	for {
		var k K
		err := m.NextKey(prev, &k)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		out = append(out, k)
		prev = k
	}
}

// Close detaches and unloads everything. It is safe to call more than once.
func (t *Tracer) Close() error {
	var errs []error
	for _, l := range t.links {
		if err := l.Close(); err != nil {
			errs = append(errs, fmt.Errorf("detaching fsync program: %w", err))
		}
	}
	t.links = nil
	if err := t.objs.Close(); err != nil {
		errs = append(errs, fmt.Errorf("closing fsync objects: %w", err))
	}
	t.objs = fsyncObjects{}
	return errors.Join(errs...)
}
