// Package blkio loads bpf/blkio.bpf.c and reads its maps: per issuing cgroup, disk and
// operation, the time block requests waited in the I/O scheduler (insert to issue), the time
// the device took (issue to complete), and the bytes and requests completed.
//
// A request is charged to the cgroup that issued it, not to the kernel thread that submitted
// it, when the kernel knows it: see rq_cgroup in bpf/blkio.bpf.c for which writes that covers
// on v1 and v2 hosts.
package blkio

import "github.com/nodectl/nodectl/rundir/hist"

// DefaultMaxEntries is the io map capacity for Config's zero MaxEntries.
const DefaultMaxEntries = 4096

// Config configures the tracer.
type Config struct {
	CgroupV1   bool   // ids from the blkio hierarchy instead of the unified one
	MaxEntries uint32 // io map capacity in (cgroup, device, op) keys; 0 means DefaultMaxEntries
	Sysfs      string // sysfs mount, to map partitions to disks; "" means /sys
}

// Key identifies the statistics of one cgroup's requests of one kind on one disk.
type Key struct {
	Cgroup uint64 // kernfs id
	Dev    string // "MAJ:MIN" of the whole disk, "" when unknown
	Op     string // read, write, flush, discard or other
}

// Counters are completed volume, cumulative. Untimed counts the requests, among Requests,
// that are in neither histogram: the kernel did not run the tracer at their issue or their
// completion (see struct rq_key in bpf/blkio.bpf.c), so their bytes are known, their times
// are not.
type Counters struct {
	Bytes, Requests, Untimed uint64
}

// Stats is a cumulative snapshot of the maps. Queue holds zero for requests that were issued
// without passing through an I/O scheduler (no elevator, or issued directly), so its count
// equals Service's: the key's Requests less its Untimed.
type Stats struct {
	Queue, Service map[Key]hist.Log2
	IO             map[Key]Counters
	Drops          map[string]uint64 // by reason, every reason present
	Fill           float64           // entries over capacity of the io map
}
