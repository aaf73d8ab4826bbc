// Package reclaim loads bpf/reclaim.bpf.c and reads its maps: per cgroup, how long tasks
// stalled in direct reclaim, memcg reclaim and direct compaction, and the pages reclaimed;
// kswapd's wake-ups and sleeps; OOM kills per cgroup and, for each, the killed process, its
// cgroup and the cgroup whose memory limit was hit.
package reclaim

import (
	"time"

	"github.com/nodectl/nodectl/rundir"

	"github.com/nodectl/nodectl/rundir/hist"
)

// Stall kinds, as in Key.Kind.
const (
	KindDirect     = rundir.ReclaimDirect // direct reclaim: the page allocator found too little free memory
	KindMemcg      = rundir.ReclaimMemcg  // memcg reclaim: a charge hit the limit of the task's memcg or an ancestor
	KindCompaction = "compaction"         // direct compaction: no free block of the order asked for
)

// Defaults for Config's zero values.
const (
	DefaultMaxStalls  = 8192
	DefaultMaxCgroups = 4096
)

// Config configures the tracer.
type Config struct {
	CgroupV1   bool   // ids from the memory hierarchy instead of the unified one
	MaxStalls  uint32 // stalls map capacity (cgroup x kind); 0 means DefaultMaxStalls
	MaxCgroups uint32 // OOM kills map capacity; 0 means DefaultMaxCgroups
}

// Key is a cgroup and a kind of stall.
type Key struct {
	Cgroup uint64
	Kind   string
}

// Stall is what a cgroup's tasks spent in one kind of stall, cumulative.
type Stall struct {
	Time  hist.Log2 // one value per stall
	Pages uint64    // pages reclaimed by those stalls (0 for compaction)
}

// Kill is one OOM kill.
type Kill struct {
	Time   time.Time
	Cgroup uint64 // the killed process's cgroup
	PID    uint32 // its thread group id
	Comm   string
	// Limit is the cgroup whose memory limit was hit, 0 when none was found (a global OOM, or
	// a memcg the tracer could not tell). UsageBytes and LimitBytes are its usage and limit
	// at the kill.
	Limit                  uint64
	UsageBytes, LimitBytes uint64
	// Trigger is the process whose allocation ran the OOM killer (it may be the victim).
	TriggerPID  uint32
	TriggerComm string
}

// Stats is a snapshot: the maps cumulative, Kills those seen since the previous Read.
type Stats struct {
	Stalls       map[Key]Stall
	OOMKills     map[uint64]uint64 // by the killed process's cgroup
	KswapdWakes  uint64
	KswapdSleeps uint64
	Kills        []Kill            // new since the previous Read, in the order they happened
	Drops        map[string]uint64 // by reason, every reason present
	Fill         float64           // entries over capacity of the fuller map, stalls or kills
}
