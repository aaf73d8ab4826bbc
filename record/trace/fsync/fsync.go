// Package fsync loads bpf/fsync.bpf.c and reads its maps: the latency of fsync, fdatasync and
// sync_file_range per cgroup, disk and syscall.
//
// The programs attach to ext4's tracepoints around ext4_sync_file where every writable disk
// filesystem is ext4 (HooksExt4), else to the classic syscall tracepoints (HooksSyscalls),
// which need tracefs mounted (at /sys/kernel/tracing or under debugfs) to look the events up:
// package tracefs provides it, and the composite tracer uses that before it loads this one.
package fsync

import "github.com/nodectl/nodectl/rundir/hist"

// DefaultMaxEntries is the latency map capacity for Config's zero MaxEntries.
const DefaultMaxEntries = 4096

// Hooks are where the programs take the calls.
type Hooks string

const (
	// HooksExt4: ext4_sync_file_enter and _exit (tp_btf), which fire only in a sync. Every
	// fsync of a file on ext4 passes there, however it was asked for (fsync, fdatasync,
	// msync, io_uring, an overlay's fsync of its upper file), and is keyed fdatasync or fsync
	// by its datasync flag; sync_file_range, which starts and waits for writeback but syncs
	// no file, is not seen.
	HooksExt4 Hooks = "ext4"
	// HooksSyscalls: the enter and exit tracepoints of fsync, fdatasync and
	// sync_file_range, on any filesystem. Enabling a syscall tracepoint puts every syscall of
	// every task through the kernel's traced path: about 80 ns more for getppid on 6.18
	// (bench/overhead TestSyscallCost), all the time, on the whole node.
	HooksSyscalls Hooks = "syscalls"
)

// Config configures the tracer.
type Config struct {
	CgroupV1   bool   // ids from the blkio hierarchy instead of the unified one
	MaxEntries uint32 // latency map capacity in (cgroup, device, syscall) keys; 0 means DefaultMaxEntries
	Sysfs      string // sysfs mount, to map partitions to disks; "" means /sys
	// Hooks to attach to; "" means ChooseHooks's pick from the mount table of pid 1 under
	// Procfs ("" meaning /proc).
	Hooks  Hooks
	Procfs string
}

// Key identifies one latency histogram.
type Key struct {
	Cgroup  uint64 // kernfs id
	Dev     string // "MAJ:MIN" of the whole disk, "" when unknown or not a block device (tmpfs, overlay)
	Syscall string // fsync, fdatasync or sync_file_range
}

// Stats is a cumulative snapshot of the maps.
type Stats struct {
	Latency map[Key]hist.Log2
	Drops   map[string]uint64 // by reason, every reason present
	Fill    float64           // entries over capacity of the latency map
}
