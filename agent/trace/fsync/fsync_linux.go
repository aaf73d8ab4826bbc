//go:build linux

package fsync

import (
	"errors"
	"fmt"
	"github.com/nodectl/nodectl/rundir"
	"log/slog"

	"github.com/cilium/ebpf/link"

	"github.com/nodectl/nodectl/agent/blockdev"
	"github.com/nodectl/nodectl/agent/hist"
	"github.com/nodectl/nodectl/agent/trace/internal/loader"
)

var syscallNames = map[fsyncFsyncSyscall]string{
	fsyncFsyncSyscallSYSCALL_FSYNC:           rundir.SyscallFsync,
	fsyncFsyncSyscallSYSCALL_FDATASYNC:       rundir.SyscallFdatasync,
	fsyncFsyncSyscallSYSCALL_SYNC_FILE_RANGE: rundir.SyscallSyncFileRange,
}

// Drop reasons as reported in Stats.Drops.
var dropReasons = map[fsyncDropReason]string{
	fsyncDropReasonDROP_LATENCY_FULL:  "latency_map_full",
	fsyncDropReasonDROP_INFLIGHT_FULL: "inflight_full",
}

// Tracer owns the loaded programs, their maps and links. It is not safe for concurrent use.
type Tracer struct {
	objs    fsyncObjects
	links   []link.Link
	sysfs   string
	latency loader.Batch[fsyncFsyncKey, fsyncHist]
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
	t := &Tracer{sysfs: cfg.Sysfs}
	opts := loader.Options{CgroupV1: cfg.CgroupV1, PerCgroup: map[string]uint32{fsyncMapLatency: cfg.MaxEntries}}
	if err := loader.Load(rundir.ProgramFsync, spec, opts, &t.objs, log); err != nil {
		return nil, err
	}
	// Exits first: a call that enters before its exit is attached would leave an entry behind.
	t.links, err = loader.Attach(
		loader.Tracepoint("syscalls", "sys_exit_fsync", t.objs.ExitFsync),
		loader.Tracepoint("syscalls", "sys_exit_fdatasync", t.objs.ExitFdatasync),
		loader.Tracepoint("syscalls", "sys_exit_sync_file_range", t.objs.ExitSyncFileRange),
		loader.Tracepoint("syscalls", "sys_enter_fsync", t.objs.EnterFsync),
		loader.Tracepoint("syscalls", "sys_enter_fdatasync", t.objs.EnterFdatasync),
		loader.Tracepoint("syscalls", "sys_enter_sync_file_range", t.objs.EnterSyncFileRange),
	)
	if err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

// Read sums the per-CPU values of the maps. Keys that differ only in the partition of a disk
// are added together.
func (t *Tracer) Read() (Stats, error) {
	if t.objs.Latency == nil {
		return Stats{}, errors.New("reading fsync maps: tracer closed")
	}
	st := Stats{Latency: map[Key]hist.Log2{}}

	entries := 0
	err := t.latency.Each(t.objs.Latency, func(k fsyncFsyncKey, hs []fsyncHist) {
		entries++
		var sum loader.HistSum
		for _, h := range hs {
			sum.Add(h.Slots[:], h.Count, h.SumNs)
		}
		key := Key{Cgroup: k.Cgroup, Dev: t.disk(k.Dev), Syscall: syscallNames[k.Syscall]}
		st.Latency[key] = st.Latency[key].Add(sum.Log2())
	})
	if err != nil {
		return Stats{}, fmt.Errorf("reading fsync latency map: %w", err)
	}
	st.Fill = loader.Fill(entries, t.objs.Latency)

	if st.Drops, err = loader.Drops(t.objs.Drops, dropReasons); err != nil {
		return Stats{}, fmt.Errorf("reading fsync maps: %w", err)
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
	n, err := t.latency.DeleteIf(t.objs.Latency, func(k fsyncFsyncKey) bool { return !live(k.Cgroup) })
	if err != nil {
		return n, fmt.Errorf("forgetting fsync latency entries: %w", err)
	}
	return n, nil
}

// Close detaches and unloads everything. It is safe to call more than once.
func (t *Tracer) Close() error {
	err := loader.Close(rundir.ProgramFsync, t.links, &t.objs)
	t.links, t.objs = nil, fsyncObjects{}
	return err
}
