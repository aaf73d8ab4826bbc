//go:build linux

package blkio

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/nodectl/nodectl/rundir"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/nodectl/nodectl/host/blockdev"
	"github.com/nodectl/nodectl/record/trace/internal/loader"
	"github.com/nodectl/nodectl/rundir/hist"
)

var opNames = map[blkioBlkOp]string{
	blkioBlkOpBLK_OP_READ:    rundir.OpRead,
	blkioBlkOpBLK_OP_WRITE:   rundir.OpWrite,
	blkioBlkOpBLK_OP_FLUSH:   rundir.OpFlush,
	blkioBlkOpBLK_OP_DISCARD: rundir.OpDiscard,
	blkioBlkOpBLK_OP_OTHER:   rundir.OpOther,
}

// Drop reasons as reported in Stats.Drops.
var dropReasons = map[blkioDropReason]string{
	blkioDropReasonDROP_STATS_FULL:        "io_map_full",
	blkioDropReasonDROP_INFLIGHT_FULL:     "inflight_full",
	blkioDropReasonDROP_COMPLETION_UNSEEN: "completion_unseen",
	blkioDropReasonDROP_ISSUE_UNSEEN:      "issue_unseen",
}

// objects are blkioObjects but the sweep program, which New loads apart: it needs
// bpf_for_each_map_elem (Linux 5.13), younger than the tracepoint programs, which run
// without it.
type objects struct {
	blkioMaps
	RqComplete *ebpf.Program `ebpf:"rq_complete"`
	RqInsert   *ebpf.Program `ebpf:"rq_insert"`
	RqIssue    *ebpf.Program `ebpf:"rq_issue"`
	RqMerge    *ebpf.Program `ebpf:"rq_merge"`
}

func (o *objects) Close() error {
	return errors.Join(o.blkioMaps.Close(), o.RqComplete.Close(), o.RqInsert.Close(), o.RqIssue.Close(), o.RqMerge.Close())
}

// Tracer owns the loaded programs, their maps and links. It is not safe for concurrent use.
type Tracer struct {
	objs  objects
	links []link.Link
	sweep *ebpf.Program // nil on a kernel without what it needs
	parts int           // ReadPart calls since the last sweep
	sysfs string
	io    loader.Batch[blkioBlkKey, blkioBlkStats]
}

// New loads the programs and attaches them to block_rq_insert, block_rq_issue,
// block_rq_merge and block_rq_complete, and loads the sweep, which Read runs. Without the
// sweep (a kernel before 5.13) it warns and goes on: requests whose completion the kernel
// hides from the tracer are then never charged. A failed New closes what it opened.
func New(cfg Config, log *slog.Logger) (*Tracer, error) {
	if cfg.MaxEntries == 0 {
		cfg.MaxEntries = DefaultMaxEntries
	}
	if cfg.Sysfs == "" {
		cfg.Sysfs = "/sys"
	}
	spec, err := loadBlkio()
	if err != nil {
		return nil, fmt.Errorf("loading blkio spec: %w", err)
	}
	t := &Tracer{sysfs: cfg.Sysfs}
	opts := loader.Options{CgroupV1: cfg.CgroupV1, PerCgroup: map[string]uint32{blkioMapIo: cfg.MaxEntries}}
	if err := loader.Load(rundir.ProgramBlkio, spec, opts, &t.objs, log); err != nil {
		return nil, err
	}
	// Later stages first, so that no entry is made that its end would not remove.
	t.links, err = loader.Attach(
		loader.TpBTF("block_rq_complete", t.objs.RqComplete),
		loader.TpBTF("block_rq_merge", t.objs.RqMerge),
		loader.TpBTF("block_rq_issue", t.objs.RqIssue),
		loader.TpBTF("block_rq_insert", t.objs.RqInsert),
	)
	if err != nil {
		t.Close()
		return nil, err
	}
	if t.sweep, err = loadSweep(spec, &t.objs); err != nil {
		log.Warn("requests whose completion the kernel hides from the block tracer will not be counted", "err", err)
	}
	return t, nil
}

// loadSweep loads the sweep program on objs' maps; spec is the one they were loaded from.
func loadSweep(spec *ebpf.CollectionSpec, objs *objects) (*ebpf.Program, error) {
	var o struct {
		Sweep *ebpf.Program `ebpf:"sweep"`
	}
	err := spec.LoadAndAssign(&o, &ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{
		blkioMapDrops: objs.Drops, blkioMapInflight: objs.Inflight, blkioMapIo: objs.Io,
	}})
	if err != nil {
		return nil, fmt.Errorf("loading the sweep: %w", err)
	}
	return o.Sweep, nil
}

// Read first sweeps the in-flight table, charging the requests that ended unseen, then reads
// the maps (shared by the CPUs). Keys that differ only in the partition of a disk are added
// together.
func (t *Tracer) Read() (Stats, error) { return t.read(true) }

// sweepEvery is how many ReadPart calls sweep the in-flight table once: the sweep walks every
// bucket of it (16,384), a twenty-fifth of the agent's CPU at 1,000 idle cgroups when it ran
// every second (make bench), for the few requests whose completion went unseen.
const sweepEvery = 10

// ReadPart is Read for every interval: it sweeps the in-flight table every sweepEvery calls, so
// that a request whose completion went unseen is charged up to that many intervals late (a
// full Read, at a window's edge, sweeps always).
func (t *Tracer) ReadPart() (Stats, error) {
	t.parts++
	return t.read(t.parts >= sweepEvery)
}

func (t *Tracer) read(sweep bool) (Stats, error) {
	if t.objs.Io == nil {
		return Stats{}, errors.New("reading blkio maps: tracer closed")
	}
	if sweep {
		t.parts = 0
	}
	if t.sweep != nil && sweep {
		if _, err := t.sweep.Run(&ebpf.RunOptions{}); err != nil {
			return Stats{}, fmt.Errorf("sweeping blkio in-flight requests: %w", err)
		}
	}
	st := Stats{
		Queue:   map[Key]hist.Log2{},
		Service: map[Key]hist.Log2{},
		IO:      map[Key]Counters{},
	}

	entries := 0
	err := t.io.Each(t.objs.Io, func(k blkioBlkKey, vs []blkioBlkStats) {
		entries++
		var queue, service loader.HistSum
		var c Counters
		for _, v := range vs {
			queue.Add(v.Queue.Slots[:], v.Queue.Count, v.Queue.SumNs)
			service.Add(v.Service.Slots[:], v.Service.Count, v.Service.SumNs)
			c.Bytes += v.Bytes
			c.Requests += v.Requests
			c.Untimed += v.Untimed
		}
		key := Key{Cgroup: k.Cgroup, Dev: t.disk(k.Dev), Op: opNames[k.Op]}
		st.Queue[key] = st.Queue[key].Add(queue.Log2())
		st.Service[key] = st.Service[key].Add(service.Log2())
		prev := st.IO[key]
		st.IO[key] = Counters{Bytes: prev.Bytes + c.Bytes, Requests: prev.Requests + c.Requests, Untimed: prev.Untimed + c.Untimed}
	})
	if err != nil {
		return Stats{}, fmt.Errorf("reading blkio io map: %w", err)
	}
	st.Fill = loader.Fill(entries, t.objs.Io)

	if st.Drops, err = loader.Drops(t.objs.Drops, dropReasons); err != nil {
		return Stats{}, fmt.Errorf("reading blkio maps: %w", err)
	}
	return st, nil
}

// disk names the whole disk of a request's device, "" for the 0 of a request without one.
func (t *Tracer) disk(dev uint32) string {
	if dev == 0 {
		return ""
	}
	return blockdev.WholeDisk(t.sysfs, blockdev.Name(dev))
}

// Forget deletes the entries of cgroups that live reports gone and returns how many it
// deleted.
func (t *Tracer) Forget(live func(id uint64) bool) (int, error) {
	if t.objs.Io == nil {
		return 0, errors.New("forgetting blkio entries: tracer closed")
	}
	n, err := t.io.DeleteIf(t.objs.Io, func(k blkioBlkKey) bool { return !live(k.Cgroup) })
	if err != nil {
		return n, fmt.Errorf("forgetting blkio entries: %w", err)
	}
	return n, nil
}

// Close detaches and unloads everything. It is safe to call more than once.
func (t *Tracer) Close() error {
	err := errors.Join(loader.Close(rundir.ProgramBlkio, t.links, &t.objs), t.sweep.Close())
	t.links, t.objs, t.sweep = nil, objects{}, nil
	return err
}
