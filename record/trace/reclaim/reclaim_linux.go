//go:build linux

package reclaim

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nodectl/nodectl/rundir"

	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/nodectl/nodectl/internal/printable"
	"github.com/nodectl/nodectl/record/trace/internal/loader"
)

// Drop reasons as reported in Stats.Drops.
var dropReasons = map[reclaimDropReason]string{
	reclaimDropReasonDROP_STALL_FULL:   "stalls_map_full",
	reclaimDropReasonDROP_STORAGE_FAIL: "task_storage",
	reclaimDropReasonDROP_KILLS_FULL:   "kills_map_full",
	reclaimDropReasonDROP_RING_FULL:    "kill_ring_full",
}

var kinds = map[reclaimStallKind]string{
	reclaimStallKindSTALL_DIRECT:     KindDirect,
	reclaimStallKindSTALL_MEMCG:      KindMemcg,
	reclaimStallKindSTALL_COMPACTION: KindCompaction,
}

// Tracer owns the loaded programs, their maps and links. It is not safe for concurrent use.
type Tracer struct {
	objs     reclaimObjects
	links    []link.Link
	ring     *ringbuf.Reader
	pageSize uint64
	stalls   loader.Batch[reclaimStallKey, reclaimStallVal]
	kills    loader.Batch[uint64, uint64]
}

// New loads the programs and attaches them to the vmscan reclaim and kswapd tracepoints, the
// compaction ones and oom/mark_victim, all as tp_btf (no tracefs needed). A failed New closes
// what it opened.
func New(cfg Config, log *slog.Logger) (*Tracer, error) {
	if cfg.MaxStalls == 0 {
		cfg.MaxStalls = DefaultMaxStalls
	}
	if cfg.MaxCgroups == 0 {
		cfg.MaxCgroups = DefaultMaxCgroups
	}
	spec, err := loadReclaim()
	if err != nil {
		return nil, fmt.Errorf("loading reclaim spec: %w", err)
	}
	t := &Tracer{pageSize: uint64(os.Getpagesize())}
	opts := loader.Options{CgroupV1: cfg.CgroupV1, PerCgroup: map[string]uint32{
		reclaimMapStalls: cfg.MaxStalls,
		reclaimMapKills:  cfg.MaxCgroups,
	}}
	if err := loader.Load(rundir.ProgramReclaim, spec, opts, &t.objs, log); err != nil {
		return nil, err
	}
	t.links, err = loader.Attach(
		loader.TpBTF("mm_vmscan_direct_reclaim_begin", t.objs.ReclaimDirectBegin),
		loader.TpBTF("mm_vmscan_direct_reclaim_end", t.objs.ReclaimDirectEnd),
		loader.TpBTF("mm_vmscan_memcg_reclaim_begin", t.objs.ReclaimMemcgBegin),
		loader.TpBTF("mm_vmscan_memcg_reclaim_end", t.objs.ReclaimMemcgEnd),
		loader.TpBTF("mm_compaction_begin", t.objs.ReclaimCompactionBegin),
		loader.TpBTF("mm_compaction_end", t.objs.ReclaimCompactionEnd),
		loader.TpBTF("mm_vmscan_kswapd_wake", t.objs.ReclaimKswapdWake),
		loader.TpBTF("mm_vmscan_kswapd_sleep", t.objs.ReclaimKswapdSleep),
		loader.TpBTF("mark_victim", t.objs.ReclaimMarkVictim),
	)
	if err != nil {
		t.Close()
		return nil, err
	}
	if t.ring, err = ringbuf.NewReader(t.objs.Ring); err != nil {
		t.Close()
		return nil, fmt.Errorf("opening the OOM kill ring: %w", err)
	}
	return t, nil
}

// Read reads every map (shared by the CPUs) and drains the kill ring.
func (t *Tracer) Read() (Stats, error) {
	if t.objs.Stalls == nil {
		return Stats{}, errors.New("reading reclaim maps: tracer closed")
	}
	st := Stats{Stalls: map[Key]Stall{}, OOMKills: map[uint64]uint64{}}

	err := t.stalls.Each(t.objs.Stalls, func(k reclaimStallKey, vs []reclaimStallVal) {
		var sum loader.HistSum
		var pages uint64
		for _, v := range vs {
			sum.Add(v.Stall.Slots[:], v.Stall.Count, v.Stall.SumNs)
			pages += v.Pages
		}
		kind, ok := kinds[reclaimStallKind(k.Kind)]
		if ok {
			st.Stalls[Key{Cgroup: k.Cgroup, Kind: kind}] = Stall{Time: sum.Log2(), Pages: pages}
		}
	})
	if err != nil {
		return Stats{}, fmt.Errorf("reading reclaim stalls map: %w", err)
	}

	err = t.kills.Each(t.objs.Kills, func(id uint64, n []uint64) { st.OOMKills[id] = n[0] })
	if err != nil {
		return Stats{}, fmt.Errorf("reading reclaim kills map: %w", err)
	}

	for c, dst := range map[reclaimCounter]*uint64{
		reclaimCounterCOUNTER_KSWAPD_WAKE:  &st.KswapdWakes,
		reclaimCounterCOUNTER_KSWAPD_SLEEP: &st.KswapdSleeps,
	} {
		if err := t.objs.Counters.Lookup(uint32(c), dst); err != nil {
			return Stats{}, fmt.Errorf("reading reclaim counters: %w", err)
		}
	}

	st.Fill = max(loader.Fill(len(st.Stalls), t.objs.Stalls), loader.Fill(len(st.OOMKills), t.objs.Kills))
	if st.Drops, err = loader.Drops(t.objs.Drops, dropReasons); err != nil {
		return Stats{}, fmt.Errorf("reading reclaim maps: %w", err)
	}
	if st.Kills, err = t.drain(); err != nil {
		return Stats{}, err
	}
	return st, nil
}

// drain reads the kills the ring holds without waiting for more.
func (t *Tracer) drain() ([]Kill, error) {
	var mono unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &mono); err != nil {
		return nil, fmt.Errorf("reading the monotonic clock: %w", err)
	}
	// bpf_ktime_get_ns is CLOCK_MONOTONIC: a kill at ts happened this long before now.
	now, monoNow := time.Now(), uint64(mono.Nano())
	t.ring.SetDeadline(now)
	var out []Kill
	var rec ringbuf.Record
	for {
		err := t.ring.ReadInto(&rec)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("reading the OOM kill ring: %w", err)
		}
		var k reclaimOomKill
		if err := binary.Read(bytes.NewReader(rec.RawSample), binary.NativeEndian, &k); err != nil {
			return out, fmt.Errorf("decoding an OOM kill: %w", err)
		}
		out = append(out, Kill{
			Time:   now.Add(-time.Duration(monoNow - min(k.Ts, monoNow))),
			Cgroup: k.Cgroup, PID: k.Pid, Comm: printable.Escape(cString(k.Comm[:])),
			Limit: k.Limit, UsageBytes: k.Usage * t.pageSize, LimitBytes: k.Max * t.pageSize,
			TriggerPID: k.Trigger, TriggerComm: printable.Escape(cString(k.TriggerComm[:])),
		})
	}
}

// Forget deletes the entries of cgroups that live reports gone. It returns how many entries it
// deleted.
func (t *Tracer) Forget(live func(id uint64) bool) (int, error) {
	if t.objs.Stalls == nil {
		return 0, errors.New("forgetting reclaim entries: tracer closed")
	}
	n, err := t.stalls.DeleteIf(t.objs.Stalls, func(k reclaimStallKey) bool { return !live(k.Cgroup) })
	if err != nil {
		return n, fmt.Errorf("forgetting reclaim stalls: %w", err)
	}
	m, err := t.kills.DeleteIf(t.objs.Kills, func(id uint64) bool { return !live(id) })
	if err != nil {
		return n + m, fmt.Errorf("forgetting reclaim kills: %w", err)
	}
	return n + m, nil
}

// Close detaches and unloads everything. It is safe to call more than once.
func (t *Tracer) Close() error {
	var errs []error
	if t.ring != nil {
		if err := t.ring.Close(); err != nil {
			errs = append(errs, fmt.Errorf("closing the OOM kill ring: %w", err))
		}
	}
	errs = append(errs, loader.Close(rundir.ProgramReclaim, t.links, &t.objs))
	t.ring, t.links, t.objs = nil, nil, reclaimObjects{}
	return errors.Join(errs...)
}

// cString is a NUL-terminated C string.
func cString(b []int8) string {
	s := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}
