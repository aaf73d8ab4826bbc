// Package fsync loads bpf/fsync.bpf.c and reads its maps: the latency of fsync, fdatasync and
// sync_file_range per cgroup, disk and syscall.
//
// The programs attach to classic syscall tracepoints, which need tracefs mounted (at
// /sys/kernel/tracing or under debugfs) to look the events up: package tracefs provides it,
// and the composite tracer uses that before it loads this one.
package fsync

import "github.com/nodectl/nodectl/agent/hist"

// DefaultMaxEntries is the latency map capacity for Config's zero MaxEntries.
const DefaultMaxEntries = 4096

// Config configures the tracer.
type Config struct {
	CgroupV1   bool   // ids from the blkio hierarchy instead of the unified one
	MaxEntries uint32 // latency map capacity in (cgroup, device, syscall) keys; 0 means DefaultMaxEntries
	Sysfs      string // sysfs mount, to map partitions to disks; "" means /sys
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
