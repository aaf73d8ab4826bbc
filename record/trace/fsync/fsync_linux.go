//go:build linux

package fsync

import (
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/nodectl/nodectl/rundir"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/nodectl/nodectl/host/blockdev"
	"github.com/nodectl/nodectl/record/trace/internal/loader"
	"github.com/nodectl/nodectl/rundir/hist"
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
	objs    io.Closer  // *ext4Objects or *syscallObjects
	maps    *fsyncMaps // objs' maps
	hooks   Hooks
	links   []link.Link
	sysfs   string
	latency loader.Batch[fsyncFsyncKey, fsyncHist]
}

// ext4Objects and syscallObjects are the maps with the programs of one set of hooks:
// LoadAndAssign loads only the programs a struct names.
type ext4Objects struct {
	fsyncMaps
	Enter *ebpf.Program `ebpf:"ext4_sync_enter"`
	Exit  *ebpf.Program `ebpf:"ext4_sync_exit"`
}

func (o *ext4Objects) Close() error { return _FsyncClose(o.Enter, o.Exit, &o.fsyncMaps) }

type syscallObjects struct {
	fsyncMaps
	EnterFsync         *ebpf.Program `ebpf:"enter_fsync"`
	EnterFdatasync     *ebpf.Program `ebpf:"enter_fdatasync"`
	EnterSyncFileRange *ebpf.Program `ebpf:"enter_sync_file_range"`
	ExitFsync          *ebpf.Program `ebpf:"exit_fsync"`
	ExitFdatasync      *ebpf.Program `ebpf:"exit_fdatasync"`
	ExitSyncFileRange  *ebpf.Program `ebpf:"exit_sync_file_range"`
}

func (o *syscallObjects) Close() error {
	return _FsyncClose(o.EnterFsync, o.EnterFdatasync, o.EnterSyncFileRange, o.ExitFsync, o.ExitFdatasync, o.ExitSyncFileRange, &o.fsyncMaps)
}

// New loads the programs of cfg.Hooks (chosen by ChooseHooks when empty) and attaches them:
// enter and exit of ext4_sync_file, or of the three syscalls. A failed New closes what it
// opened.
func New(cfg Config, log *slog.Logger) (*Tracer, error) {
	if cfg.MaxEntries == 0 {
		cfg.MaxEntries = DefaultMaxEntries
	}
	if cfg.Sysfs == "" {
		cfg.Sysfs = "/sys"
	}
	if cfg.Hooks == "" {
		h, why, err := ChooseHooks(cfg.Procfs)
		if err != nil {
			return nil, err
		}
		log.Info("fsync hooks", "hooks", h, "why", why)
		cfg.Hooks = h
	}
	spec, err := loadFsync()
	if err != nil {
		return nil, fmt.Errorf("loading fsync spec: %w", err)
	}
	t := &Tracer{sysfs: cfg.Sysfs, hooks: cfg.Hooks}
	opts := loader.Options{CgroupV1: cfg.CgroupV1, PerCgroup: map[string]uint32{fsyncMapLatency: cfg.MaxEntries}}
	// Exits first: a call that enters before its exit is attached would leave an entry behind.
	var hooks []loader.Attachment
	switch cfg.Hooks {
	case HooksExt4:
		o := &ext4Objects{}
		t.objs, t.maps = o, &o.fsyncMaps
		err = loader.Load(rundir.ProgramFsync, spec, opts, o, log)
		hooks = []loader.Attachment{loader.TpBTF("ext4_sync_file_exit", o.Exit), loader.TpBTF("ext4_sync_file_enter", o.Enter)}
	case HooksSyscalls:
		o := &syscallObjects{}
		t.objs, t.maps = o, &o.fsyncMaps
		err = loader.Load(rundir.ProgramFsync, spec, opts, o, log)
		hooks = []loader.Attachment{
			loader.Tracepoint("syscalls", "sys_exit_fsync", o.ExitFsync),
			loader.Tracepoint("syscalls", "sys_exit_fdatasync", o.ExitFdatasync),
			loader.Tracepoint("syscalls", "sys_exit_sync_file_range", o.ExitSyncFileRange),
			loader.Tracepoint("syscalls", "sys_enter_fsync", o.EnterFsync),
			loader.Tracepoint("syscalls", "sys_enter_fdatasync", o.EnterFdatasync),
			loader.Tracepoint("syscalls", "sys_enter_sync_file_range", o.EnterSyncFileRange),
		}
	default:
		return nil, fmt.Errorf("fsync hooks %q: want %q or %q", cfg.Hooks, HooksExt4, HooksSyscalls)
	}
	if err != nil {
		return nil, err
	}
	if t.links, err = loader.Attach(hooks...); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

// Hooks tells which hooks the tracer took.
func (t *Tracer) Hooks() Hooks { return t.hooks }

// Read reads the maps (shared by the CPUs: bpf/include/common.h, hist_add_shared). Keys that
// differ only in the partition of a disk are added together.
func (t *Tracer) Read() (Stats, error) {
	if t.maps == nil {
		return Stats{}, errors.New("reading fsync maps: tracer closed")
	}
	st := Stats{Latency: map[Key]hist.Log2{}}

	entries := 0
	err := t.latency.Each(t.maps.Latency, func(k fsyncFsyncKey, hs []fsyncHist) {
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
	st.Fill = loader.Fill(entries, t.maps.Latency)

	if st.Drops, err = loader.Drops(t.maps.Drops, dropReasons); err != nil {
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
	if t.maps == nil {
		return 0, errors.New("forgetting fsync entries: tracer closed")
	}
	n, err := t.latency.DeleteIf(t.maps.Latency, func(k fsyncFsyncKey) bool { return !live(k.Cgroup) })
	if err != nil {
		return n, fmt.Errorf("forgetting fsync latency entries: %w", err)
	}
	return n, nil
}

// Close detaches and unloads everything. It is safe to call more than once.
func (t *Tracer) Close() error {
	if t.objs == nil {
		return nil
	}
	err := loader.Close(rundir.ProgramFsync, t.links, t.objs)
	t.links, t.objs, t.maps = nil, nil, nil
	return err
}
