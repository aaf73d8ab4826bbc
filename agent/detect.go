package agent

import (
	"fmt"
	"math/bits"
	"time"

	"github.com/nodectl/nodectl/internal/badvalue"
	"github.com/nodectl/nodectl/internal/maproom"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

// Incident triggers: Incident.Trigger (extend, never rename; docs/agent.md).
const (
	TriggerOOMKill        = rundir.EventOOMKill // an OOM kill
	TriggerMemoryPressure = "memory_pressure"   // a cgroup's (or the node's) memory PSI full above its bound
	TriggerRunqStall      = "runq_stall"        // a task waited on the run queue at least Triggers.RunqStall
	TriggerDaemonWait     = "daemon_late"       // a system daemon waited on the run queue at least Triggers.DaemonWait
	TriggerSwapThrashing  = "swap_thrashing"    // the node swapped in and out at once
	TriggerLeaseLate      = "lease_late"        // the node's Lease was renewed later than its interval by Triggers.LeaseLate
	TriggerFsyncStall     = "fsync_stall"       // a cgroup's fsync took at least Triggers.FsyncStall
	TriggerBlkRequestWait = "blk_request_wait"  // a block request waited in a device's queue, or in the device, at least Triggers.BlkRequestWait
)

// TriggerNames lists every trigger, in the order the docs give them.
var TriggerNames = []string{TriggerOOMKill, TriggerMemoryPressure, TriggerRunqStall, TriggerDaemonWait, TriggerSwapThrashing, TriggerLeaseLate,
	TriggerFsyncStall, TriggerBlkRequestWait}

// Triggers are the bounds past which the agent opens an incident.
type Triggers struct {
	// RunqStall: a run-queue wait this long. The histogram knows a wait only to its log2
	// bucket: a wait fires in the first bucket whose waits are all at least RunqStall, or
	// above (from 1.07 s for 1 s), so that no shorter wait does: on a virtual machine whose
	// host holds a vCPU for half a second now and then, the bucket holding 1 s (from 0.54 s)
	// opened an incident every minute or two on an idle node.
	RunqStall time.Duration
	// MemoryPSIFull: the share of an interval all of a cgroup's tasks (or the node's) were
	// stalled on memory (PSI memory full), 0..1.
	MemoryPSIFull float64
	// DaemonWait: a run-queue wait of a system daemon this long (same bucket rule as RunqStall:
	// from 134 ms for 100 ms).
	DaemonWait time.Duration
	// SwapPagesPerSecond: the node swapping at least this many pages a second both in and out.
	SwapPagesPerSecond float64
	// LeaseLate: a renewal of the node's Lease this much later than the kubelet's renew
	// interval (a quarter of leaseDurationSeconds: 10 s of 40 s) after the previous one.
	LeaseLate time.Duration
	// FsyncStall: an fsync, fdatasync or sync_file_range of a cgroup this long (same bucket
	// rule as RunqStall: from 1.07 s for 1 s).
	FsyncStall time.Duration
	// BlkRequestWait: a block request this long in its device's queue (insert to issue) or in
	// the device (issue to completion), each known on its own (same bucket rule: from 268 ms
	// for 250 ms). A virtio or NVMe disk queues in the device: its scheduler queue stays short.
	BlkRequestWait time.Duration
}

// DefaultTriggers are the bounds nodectl ships with (docs/agent.md says why).
var DefaultTriggers = Triggers{RunqStall: time.Second, MemoryPSIFull: 0.10, DaemonWait: 100 * time.Millisecond, SwapPagesPerSecond: 256,
	LeaseLate: 3 * time.Second, FsyncStall: time.Second, BlkRequestWait: 250 * time.Millisecond}

// Fields of Triggers and Windows in errors (badvalue.Error's Field); the CLI names its flags.
const (
	FieldRunqStall          = "Triggers.RunqStall"
	FieldDaemonWait         = "Triggers.DaemonWait"
	FieldMemoryPSIFull      = "Triggers.MemoryPSIFull"
	FieldSwapPagesPerSecond = "Triggers.SwapPagesPerSecond"
	FieldLeaseLate          = "Triggers.LeaseLate"
	FieldFsyncStall         = "Triggers.FsyncStall"
	FieldBlkRequestWait     = "Triggers.BlkRequestWait"
)

// Validate names a bound out of range.
func (t Triggers) Validate() error {
	switch {
	case t.RunqStall < time.Microsecond:
		return badvalue.Errorf(FieldRunqStall, t.RunqStall.String(), "must be at least 1µs")
	case t.DaemonWait < time.Microsecond:
		return badvalue.Errorf(FieldDaemonWait, t.DaemonWait.String(), "must be at least 1µs")
	case t.MemoryPSIFull <= 0 || t.MemoryPSIFull > 1:
		return badvalue.Errorf(FieldMemoryPSIFull, fmt.Sprint(t.MemoryPSIFull), "must be a share in (0, 1]")
	case t.SwapPagesPerSecond <= 0:
		return badvalue.Errorf(FieldSwapPagesPerSecond, fmt.Sprint(t.SwapPagesPerSecond), "must be more than 0")
	case t.LeaseLate < 100*time.Millisecond:
		return badvalue.Errorf(FieldLeaseLate, t.LeaseLate.String(), "must be at least 100ms")
	case t.FsyncStall < time.Microsecond:
		return badvalue.Errorf(FieldFsyncStall, t.FsyncStall.String(), "must be at least 1µs")
	case t.BlkRequestWait < time.Microsecond:
		return badvalue.Errorf(FieldBlkRequestWait, t.BlkRequestWait.String(), "must be at least 1µs")
	}
	return nil
}

// firing is one trigger that fired at an interval: what, where, and the first evidence.
type firing struct {
	Trigger  string
	Cgroup   string // "" for the node
	Workload string // the cgroup's daemon or pod, "" when nothing names it
	Time     time.Time
	Evidence string
}

// detector turns each interval's records into the triggers that fired. It keeps, per cgroup,
// the last cumulative value of the few series the triggers read; a series seen for the first
// time sets its reference and fires nothing.
type detector struct {
	cfg           Triggers
	stallBucket   int
	daemonBucket  int
	fsyncBucket   int
	requestBucket int
	daemon        func(cgroup string) (name string, ok bool)
	name          func(cgroup string) string // a firing's workload; nil names none

	long    map[string]uint64 // cgroup → run-queue waits at or above stallBucket so far
	daemonW map[string]uint64 // daemon cgroup → waits at or above daemonBucket so far
	// cgroup → one of its fsync or block request series → its values at or above the
	// trigger's bucket so far (a cgroup has a series per syscall or op and device)
	slowIO   map[string]map[ioSeries]uint64
	psiFull  map[string]reading // cgroup ("" = node) → memory full seconds
	last     time.Time
	vm       map[string]float64 // pswpin, pswpout
	vmBefore map[string]float64
	// rooms of long, daemonW, psiFull and slowIO, made again after a churn
	longRoom, daemonRoom, psiRoom, ioRoom maproom.Room
}

func newDetector(cfg Triggers, daemon func(string) (string, bool)) *detector {
	return &detector{cfg: cfg, stallBucket: bucketFrom(cfg.RunqStall), daemonBucket: bucketFrom(cfg.DaemonWait), daemon: daemon,
		fsyncBucket: bucketFrom(cfg.FsyncStall), requestBucket: bucketFrom(cfg.BlkRequestWait),
		long: map[string]uint64{}, daemonW: map[string]uint64{}, slowIO: map[string]map[ioSeries]uint64{}, psiFull: map[string]reading{},
		vm: map[string]float64{}}
}

// reading is a cumulative value and when it was read.
type reading struct {
	t time.Time
	v float64
}

// bucketOf is the log2 bucket holding d.
func bucketOf(d time.Duration) int { return bits.Len64(uint64(d)) - 1 }

// bucketFrom is the first log2 bucket whose values are all at least d.
func bucketFrom(d time.Duration) int { return bits.Len64(uint64(d) - 1) }

// atOrAbove counts h's values in bucket k or above.
func atOrAbove(h *hist.Log2, k int) uint64 {
	var n uint64
	for i := max(k, 0); i < len(h.Buckets); i++ {
		n += h.Buckets[i]
	}
	return n
}

// Vmstat counters the swap trigger reads.
const (
	vmSwapIn  = "pswpin"  //rundir:other: a /proc/vmstat key
	vmSwapOut = "pswpout" //rundir:other: a /proc/vmstat key
)

// observe returns what fired in the interval ending at t.
func (d *detector) observe(t time.Time, batch []rundir.Record) []firing {
	var out []firing
	elapsed := t.Sub(d.last).Seconds()
	if d.last.IsZero() {
		elapsed = 0
	}
	d.vmBefore = nil
	for i := range batch {
		r := &batch[i]
		switch {
		case r.Type == rundir.TypeEvent && r.Name == rundir.EventOOMKill:
			out = append(out, firing{Trigger: TriggerOOMKill, Cgroup: r.Cgroup, Time: r.Time, Evidence: r.Message})
		case r.Type == rundir.TypeEvent && r.Name == rundir.EventLeaseRenewal:
			if f, ok := d.leaseLate(r); ok {
				out = append(out, f)
			}
		case r.Type != rundir.TypeSample:
		case r.Metric == rundir.MetricRunqLatency && r.Hist != nil && r.Cgroup != "":
			if f, ok := d.waits(d.long, r, d.stallBucket, d.cfg.RunqStall); ok {
				f.Trigger, f.Time = TriggerRunqStall, t
				out = append(out, f)
			}
			if name, ok := d.daemon(r.Cgroup); ok {
				if f, ok := d.waits(d.daemonW, r, d.daemonBucket, d.cfg.DaemonWait); ok {
					f.Trigger, f.Time = TriggerDaemonWait, t
					f.Evidence = name + ": " + f.Evidence
					out = append(out, f)
				}
			}
		case r.Metric == rundir.MetricFsyncLatency && r.Hist != nil && r.Cgroup != "":
			if n, ok := d.gained(r, d.fsyncBucket); ok {
				out = append(out, firing{Trigger: TriggerFsyncStall, Cgroup: r.Cgroup, Time: t,
					Evidence: fmt.Sprintf("%d %s call(s) on device %s of at least %v (bound %v); longest at least %v", n,
						r.Labels[rundir.LabelSyscall], r.Labels[rundir.LabelDevice], bucketFloor(d.fsyncBucket), d.cfg.FsyncStall, longest(r.Hist))})
			}
		case (r.Metric == rundir.MetricBlkQueue || r.Metric == rundir.MetricBlkService) && r.Hist != nil:
			// The device's incident is the node's: its analysis examines every cgroup whose
			// I/O got slower and names who loaded the device.
			if n, ok := d.gained(r, d.requestBucket); ok {
				where := "in its queue (insert to issue)"
				if r.Metric == rundir.MetricBlkService {
					where = "in the device (issue to completion)"
				}
				out = append(out, firing{Trigger: TriggerBlkRequestWait, Time: t,
					Evidence: fmt.Sprintf("%d %s request(s) of %s on device %s waited at least %v %s (bound %v); longest at least %v", n,
						r.Labels[rundir.LabelOp], d.issuer(r.Cgroup), r.Labels[rundir.LabelDevice], bucketFloor(d.requestBucket), where,
						d.cfg.BlkRequestWait, longest(r.Hist))})
			}
		case (r.Metric == rundir.MetricCgroupPressure || r.Metric == rundir.MetricSystemPressure) && r.Value != nil &&
			r.Labels[rundir.LabelResource] == rundir.ResourceMemory && r.Labels[rundir.LabelKind] == rundir.PressureFull:
			// A cgroup's pressure file may be read in the sampler's rotation: the rate is
			// over the time since its own last reading.
			prev, seen := d.psiFull[r.Cgroup]
			d.psiFull[r.Cgroup] = reading{t: t, v: *r.Value}
			span := t.Sub(prev.t).Seconds()
			if share := (*r.Value - prev.v) / span; seen && span > 0 && share >= d.cfg.MemoryPSIFull {
				out = append(out, firing{Trigger: TriggerMemoryPressure, Cgroup: r.Cgroup, Time: t,
					Evidence: fmt.Sprintf("memory PSI full %.0f%% of the last %.1fs (bound %.0f%%)", 100*share, span, 100*d.cfg.MemoryPSIFull)})
			}
		case r.Metric == rundir.MetricVmstat && r.Value != nil && (r.Labels[rundir.LabelName] == vmSwapIn || r.Labels[rundir.LabelName] == vmSwapOut):
			if d.vmBefore == nil {
				d.vmBefore = map[string]float64{}
			}
			name := r.Labels[rundir.LabelName]
			if prev, ok := d.vm[name]; ok {
				d.vmBefore[name] = prev
			}
			d.vm[name] = *r.Value
		}
	}
	if f, ok := d.swapping(t, elapsed); ok {
		out = append(out, f)
	}
	d.last = t
	if d.name != nil {
		for i := range out {
			if out[i].Cgroup != "" {
				out[i].Workload = d.name(out[i].Cgroup)
			}
		}
	}
	return out
}

// LeaseRenewInterval is how often a kubelet renews its node Lease: a quarter of the Lease's
// duration (the kubelet's nodeLeaseRenewIntervalFraction, 0.25: 10 s of the default 40 s).
func LeaseRenewInterval(leaseDuration time.Duration) time.Duration { return leaseDuration / 4 }

// leaseLate fires for a renewal that came later than the renew interval by the bound. Its
// cgroup is the kubelet's (the renewal event's), so that the window examines the kubelet.
func (d *detector) leaseLate(r *rundir.Record) (firing, bool) {
	l, ok := rundir.ParseLeaseRenewal(*r)
	// A renewal the re-made watch's Get saw may follow one the agent missed: its gap says
	// nothing of the kubelet.
	if !ok || l.Gap <= 0 || l.LeaseDuration <= 0 || l.Resync {
		return firing{}, false
	}
	bound := LeaseRenewInterval(l.LeaseDuration) + d.cfg.LeaseLate
	if l.Gap < bound {
		return firing{}, false
	}
	ev := fmt.Sprintf("node Lease renewed %v after the previous renewal (renew interval %v, bound %v; lease duration %v)",
		l.Gap.Round(10*time.Millisecond), LeaseRenewInterval(l.LeaseDuration), bound, l.LeaseDuration)
	if l.Gap >= l.LeaseDuration {
		ev += ": past the lease duration, the node controller may mark the node NotReady"
	}
	return firing{Trigger: TriggerLeaseLate, Cgroup: r.Cgroup, Time: r.Time, Evidence: ev}, true
}

// waits fires when the cgroup's histogram gained values at or above bucket k.
func (d *detector) waits(seen map[string]uint64, r *rundir.Record, k int, bound time.Duration) (firing, bool) {
	n := atOrAbove(r.Hist, k)
	prev, ok := seen[r.Cgroup]
	seen[r.Cgroup] = n
	if !ok || n <= prev {
		return firing{}, false
	}
	return firing{Cgroup: r.Cgroup, Evidence: fmt.Sprintf("%d run-queue wait(s) of at least %v (bound %v); longest at least %v",
		n-prev, bucketFloor(k), bound, longest(r.Hist))}, true
}

// ioSeries names one of a cgroup's fsync or block request series without building a string at
// every reading: its metric, syscall or op, and device.
type ioSeries struct{ metric, kind, device string }

// gained returns how many values at or above bucket k the series r gained since its previous
// reading, and whether it gained any (a first reading sets the reference).
func (d *detector) gained(r *rundir.Record, k int) (uint64, bool) {
	n := atOrAbove(r.Hist, k)
	series := d.slowIO[r.Cgroup]
	if series == nil {
		series = map[ioSeries]uint64{}
		d.slowIO[r.Cgroup] = series
	}
	// A series has a syscall (fsync) or an op (block requests), never both.
	key := ioSeries{r.Metric, r.Labels[rundir.LabelSyscall] + r.Labels[rundir.LabelOp], r.Labels[rundir.LabelDevice]}
	prev, ok := series[key]
	series[key] = n
	return n - prev, ok && n > prev
}

// bucketFloor is the smallest value of log2 bucket k, to the microsecond.
func bucketFloor(k int) time.Duration { return time.Duration(uint64(1) << k).Round(time.Microsecond) }

// issuer names the cgroup that issued a request in a node's firing: its pod or daemon and its
// path, or its path alone.
func (d *detector) issuer(cgroup string) string {
	if cgroup == "" {
		return "the root cgroup"
	}
	if d.name != nil {
		if n := d.name(cgroup); n != "" && n != cgroup {
			return fmt.Sprintf("%s (cgroup %s)", n, cgroup)
		}
	}
	return "cgroup " + cgroup
}

// longest is a lower bound of h's largest value, to the millisecond.
func longest(h *hist.Log2) time.Duration {
	return time.Duration(h.LongestAtLeast() * 1e9).Round(time.Millisecond)
}

// swapping fires when both swap counters rose past the bound in the interval.
func (d *detector) swapping(t time.Time, elapsed float64) (firing, bool) {
	in0, okIn := d.vmBefore[vmSwapIn]
	out0, okOut := d.vmBefore[vmSwapOut]
	if !okIn || !okOut || elapsed <= 0 {
		return firing{}, false
	}
	in, out := (d.vm[vmSwapIn]-in0)/elapsed, (d.vm[vmSwapOut]-out0)/elapsed
	if in < d.cfg.SwapPagesPerSecond || out < d.cfg.SwapPagesPerSecond {
		return firing{}, false
	}
	return firing{Trigger: TriggerSwapThrashing, Time: t,
		Evidence: fmt.Sprintf("the node swapped %.0f pages/s in and %.0f out (bound %.0f each)", in, out, d.cfg.SwapPagesPerSecond)}, true
}

// forget drops removed cgroups' references.
func (d *detector) forget(cgroups []string) {
	d.longRoom.Saw(len(d.long))
	d.daemonRoom.Saw(len(d.daemonW))
	d.psiRoom.Saw(len(d.psiFull))
	d.ioRoom.Saw(len(d.slowIO))
	for _, c := range cgroups {
		delete(d.long, c)
		delete(d.daemonW, c)
		delete(d.psiFull, c)
		delete(d.slowIO, c)
	}
	d.long, d.daemonW = maproom.Fit(&d.longRoom, d.long), maproom.Fit(&d.daemonRoom, d.daemonW)
	d.psiFull, d.slowIO = maproom.Fit(&d.psiRoom, d.psiFull), maproom.Fit(&d.ioRoom, d.slowIO)
}
