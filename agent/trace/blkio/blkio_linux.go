//go:build linux

package blkio

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

var opNames = map[blkioBlkOp]string{
	blkioBlkOpBLK_OP_READ:    "read",
	blkioBlkOpBLK_OP_WRITE:   "write",
	blkioBlkOpBLK_OP_FLUSH:   "flush",
	blkioBlkOpBLK_OP_DISCARD: "discard",
	blkioBlkOpBLK_OP_OTHER:   "other",
}

// Drop reasons as reported in Stats.Drops.
var dropReasons = map[blkioDropReason]string{
	blkioDropReasonDROP_STATS_FULL:    "io_map_full",
	blkioDropReasonDROP_INFLIGHT_FULL: "inflight_full",
}

// Tracer owns the loaded programs, their maps and links. It is not safe for concurrent use.
type Tracer struct {
	objs  blkioObjects
	links []link.Link
	sysfs string
}

// New loads the programs and attaches them to block_rq_insert, block_rq_issue,
// block_rq_merge and block_rq_complete. A failed New closes what it opened.
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
	if err := spec.Variables[blkioVarCgroupV1].Set(cfg.CgroupV1); err != nil {
		return nil, fmt.Errorf("setting cgroup_v1: %w", err)
	}
	spec.Maps[blkioMapIo].MaxEntries = cfg.MaxEntries
	if lazyMapsSafe(log) {
		// Preallocated per-CPU values cost max_entries x value size x CPUs up front.
		spec.Maps[blkioMapIo].Flags |= bpfFNoPrealloc
	}

	t := &Tracer{sysfs: cfg.Sysfs}
	if err := spec.LoadAndAssign(&t.objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("loading blkio objects: %w (verifier log: %+v)", err, ve)
		}
		return nil, fmt.Errorf("loading blkio objects: %w", err)
	}
	// Later stages first, so that no entry is made that its end would not remove.
	for _, tp := range []struct {
		name string
		prog *ebpf.Program
	}{
		{"block_rq_complete", t.objs.RqComplete},
		{"block_rq_merge", t.objs.RqMerge},
		{"block_rq_issue", t.objs.RqIssue},
		{"block_rq_insert", t.objs.RqInsert},
	} {
		l, err := link.AttachTracing(link.TracingOptions{Program: tp.prog})
		if err != nil {
			t.Close()
			return nil, fmt.Errorf("attaching to %s: %w", tp.name, err)
		}
		t.links = append(t.links, l)
	}
	return t, nil
}

// bpfFNoPrealloc is BPF_F_NO_PREALLOC from the kernel's UAPI.
const bpfFNoPrealloc = 1

// lazyMapsSafe reports whether hash maps may allocate at run time from a tracing program
// without risk: only with the BPF memory allocator (Linux 6.1).
func lazyMapsSafe(log *slog.Logger) bool {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		log.Warn("reading kernel BTF, preallocating maps", "component", "blkio", "err", err)
		return false
	}
	_, err = spec.AnyTypeByName("bpf_mem_alloc")
	return err == nil
}

// Read sums the per-CPU values of the maps. Keys that differ only in the partition of a disk
// are added together.
func (t *Tracer) Read() (Stats, error) {
	if t.objs.Io == nil {
		return Stats{}, errors.New("reading blkio maps: tracer closed")
	}
	st := Stats{
		Queue:   map[Key]hist.Log2{},
		Service: map[Key]hist.Log2{},
		IO:      map[Key]Counters{},
		Drops:   map[string]uint64{},
	}

	var k blkioBlkKey
	var vs []blkioBlkStats
	it := t.objs.Io.Iterate()
	for it.Next(&k, &vs) {
		var queue, service []blkioHist
		var c Counters
		for _, v := range vs {
			queue = append(queue, v.Queue)
			service = append(service, v.Service)
			c.Bytes += v.Bytes
			c.Requests += v.Requests
		}
		key := Key{Cgroup: k.Cgroup, Dev: t.disk(k.Dev), Op: opNames[k.Op]}
		st.Queue[key] = st.Queue[key].Add(sum(queue))
		st.Service[key] = st.Service[key].Add(sum(service))
		prev := st.IO[key]
		st.IO[key] = Counters{Bytes: prev.Bytes + c.Bytes, Requests: prev.Requests + c.Requests}
	}
	if err := it.Err(); err != nil {
		return Stats{}, fmt.Errorf("reading blkio io map: %w", err)
	}

	for r, name := range dropReasons {
		var per []uint64
		if err := t.objs.Drops.Lookup(uint32(r), &per); err != nil {
			return Stats{}, fmt.Errorf("reading blkio drops %s: %w", name, err)
		}
		var n uint64
		for _, v := range per {
			n += v
		}
		st.Drops[name] = n
	}
	return st, nil
}

// sum adds per-CPU histograms.
func sum(hs []blkioHist) hist.Log2 {
	var slots [len(blkioHist{}.Slots)]uint64
	var count, total uint64
	for _, h := range hs {
		for i, v := range h.Slots {
			slots[i] += v
		}
		count += h.Count
		total += h.SumNs
	}
	return hist.FromSlots(slots[:], count, total)
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
	keys, err := keys[blkioBlkKey](t.objs.Io)
	if err != nil {
		return 0, fmt.Errorf("listing blkio io map: %w", err)
	}
	n := 0
	for _, k := range keys {
		if live(k.Cgroup) {
			continue
		}
		if err := t.objs.Io.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return n, fmt.Errorf("deleting blkio entry of cgroup %d: %w", k.Cgroup, err)
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
			errs = append(errs, fmt.Errorf("detaching blkio program: %w", err))
		}
	}
	t.links = nil
	if err := t.objs.Close(); err != nil {
		errs = append(errs, fmt.Errorf("closing blkio objects: %w", err))
	}
	t.objs = blkioObjects{}
	return errors.Join(errs...)
}
