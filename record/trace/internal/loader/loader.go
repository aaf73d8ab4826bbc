//go:build linux

package loader

import (
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"log/slog"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/nodectl/nodectl/internal/maproom"
	"github.com/nodectl/nodectl/record/trace/internal/features"
	"github.com/nodectl/nodectl/rundir/hist"
)

// Options are set on a collection before it loads.
type Options struct {
	CgroupV1 bool // the cgroup_v1 knob of bpf/include/common.h
	// PerCgroup sizes the maps keyed by cgroup, by map name. They are allocated as cgroups
	// appear where the kernel can do that safely: preallocated per-CPU values cost
	// capacity x value size x CPUs up front, tens of MB on a large node for cgroups that
	// mostly do not exist.
	PerCgroup map[string]uint32
}

// Load sets opts on spec and loads it into objs, a bpf2go objects struct. name names the
// object in errors and logs.
func Load(name string, spec *ebpf.CollectionSpec, opts Options, objs any, log *slog.Logger) error {
	if err := spec.Variables["cgroup_v1"].Set(opts.CgroupV1); err != nil {
		return fmt.Errorf("setting cgroup_v1 of %s: %w", name, err)
	}
	lazy := lazyAlloc(log)
	for m, size := range opts.PerCgroup {
		ms, ok := spec.Maps[m]
		if !ok {
			return fmt.Errorf("sizing %s: no map %s", name, m)
		}
		ms.MaxEntries = size
		if lazy {
			ms.Flags |= unix.BPF_F_NO_PREALLOC
		}
	}
	if err := spec.LoadAndAssign(objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			log.Warn("verifier rejected a program", "object", name, "log", fmt.Sprintf("%+v", ve))
		}
		return fmt.Errorf("loading %s objects: %w", name, err)
	}
	return nil
}

// probeWarned makes an inconclusive allocator probe, whose result is cached for the process,
// logged once rather than once per object.
var probeWarned sync.Once

// lazyAlloc reports whether maps keyed by cgroup may go without preallocation.
func lazyAlloc(log *slog.Logger) bool {
	err := features.HaveBPFMemAlloc()
	if err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
		probeWarned.Do(func() {
			log.Warn("probing for the BPF memory allocator failed, preallocating maps", "err", err)
		})
	}
	return err == nil
}

// Attachment is one program and the hook it attaches to.
type Attachment struct {
	hook   string
	attach func() (link.Link, error)
}

// TpBTF attaches a tp_btf program to the tracepoint its section names.
func TpBTF(tracepoint string, prog *ebpf.Program) Attachment {
	return Attachment{hook: tracepoint, attach: func() (link.Link, error) {
		return link.AttachTracing(link.TracingOptions{Program: prog})
	}}
}

// Tracepoint attaches a program to a classic tracepoint, which tracefs must carry.
func Tracepoint(group, name string, prog *ebpf.Program) Attachment {
	return Attachment{hook: group + "/" + name + " (needs tracefs)", attach: func() (link.Link, error) {
		return link.Tracepoint(group, name, prog, nil)
	}}
}

// Attach attaches in order and returns the links. On failure it detaches what it attached.
func Attach(as ...Attachment) ([]link.Link, error) {
	var links []link.Link
	for _, a := range as {
		l, err := a.attach()
		if err != nil {
			for _, l := range links {
				l.Close()
			}
			return nil, fmt.Errorf("attaching to %s: %w", a.hook, err)
		}
		links = append(links, l)
	}
	return links, nil
}

// Close detaches links and closes objs. name names the object in errors.
func Close(name string, links []link.Link, objs io.Closer) error {
	var errs []error
	for _, l := range links {
		if err := l.Close(); err != nil {
			errs = append(errs, fmt.Errorf("detaching %s program: %w", name, err))
		}
	}
	if err := objs.Close(); err != nil {
		errs = append(errs, fmt.Errorf("closing %s objects: %w", name, err))
	}
	return errors.Join(errs...)
}

// HistSum adds up the per-CPU copies of a struct hist (bpf/include/common.h).
type HistSum struct {
	slots        [hist.Slots]uint64
	count, sumNs uint64
}

// Add adds one CPU's copy.
func (s *HistSum) Add(slots []uint64, count, sumNs uint64) {
	for i, v := range slots {
		s.slots[i] += v
	}
	s.count += count
	s.sumNs += sumNs
}

// Log2 returns the sum.
// Count is the number of values added.
func (s *HistSum) Count() uint64 { return s.count }

func (s *HistSum) Log2() hist.Log2 { return hist.FromSlots(s.slots[:], s.count, s.sumNs) }

// Drops reads the drop counters of bpf/include/common.h, by reason name; every reason is
// present.
func Drops[R ~uint32](m *ebpf.Map, reasons map[R]string) (map[string]uint64, error) {
	out := make(map[string]uint64, len(reasons))
	for r, name := range reasons {
		var n uint64
		if err := m.Lookup(uint32(r), &n); err != nil {
			return nil, fmt.Errorf("reading drops %s: %w", name, err)
		}
		out[name] = n
	}
	return out, nil
}

// Fill returns entries over m's capacity.
func Fill(entries int, m *ebpf.Map) float64 {
	if c := m.MaxEntries(); c > 0 {
		return float64(entries) / float64(c)
	}
	return 0
}

// batchKeys is how many entries a batched read asks the kernel for at once: a few syscalls read
// a map of thousands of cgroups, where walking it took two per entry (BenchmarkBatchRead).
const batchKeys = 256

// Batch reads whole hash maps with BPF_MAP_LOOKUP_BATCH into buffers it keeps between reads,
// so that reading a map every interval allocates nothing once warm. V is one CPU's value for
// a per-CPU map. The zero Batch is ready; it is not safe for concurrent use.
type Batch[K, V comparable] struct {
	keys []K
	vals []V
	// last and next hold each key's signature as Changed last saw it; pointer-free, so the
	// collector never scans them.
	last, next map[K]uint64
	room       maproom.Room
	seed       maphash.Seed
	// Cost is what the reads copied from the kernel, all told.
	Cost Cost
}

// Cost is what reading maps copied from the kernel: bytes (keys and values, one value per
// possible CPU of a per-CPU map) and the syscalls that copied them.
type Cost struct {
	Bytes, Calls uint64
}

// Add is c and d together.
func (c Cost) Add(d Cost) Cost { return Cost{Bytes: c.Bytes + d.Bytes, Calls: c.Calls + d.Calls} }

// Each calls fn with every key of m and its values (one per possible CPU for a per-CPU map,
// else one), which fn must not keep. Entries added or deleted meanwhile may be missed; none
// is seen twice. Kernels without batched lookups (before 5.6) are walked key by key.
//
// Reading and deleting in one (BPF_MAP_LOOKUP_AND_DELETE_BATCH, keeping the totals here) was
// tried for the run-queue maps: freeing and reallocating per-CPU values made each read cost
// several times a plain one. Changed reads everything and passes on only what changed.
func (b *Batch[K, V]) Each(m *ebpf.Map, fn func(K, []V)) error {
	cpus := 1
	if perCPU(m.Type()) {
		n, err := ebpf.PossibleCPU()
		if err != nil {
			return err
		}
		cpus = n
	}
	if len(b.keys) == 0 {
		b.keys = make([]K, batchKeys)
	}
	var cursor ebpf.MapBatchCursor
	for {
		if len(b.vals) != len(b.keys)*cpus {
			b.vals = make([]V, len(b.keys)*cpus)
		}
		n, err := m.BatchLookup(&cursor, b.keys, b.vals, nil)
		b.Cost.Calls++
		b.Cost.Bytes += uint64(n) * uint64(m.KeySize()+m.ValueSize()*uint32(cpus))
		switch {
		case errors.Is(err, unix.ENOSPC):
			// A hash bucket holds more entries than the batch: ask for more at once.
			b.keys = make([]K, 2*len(b.keys))
			continue
		case errors.Is(err, ebpf.ErrNotSupported):
			return b.walk(m, fn)
		case err != nil && !errors.Is(err, ebpf.ErrKeyNotExist):
			return err
		}
		for i := range n {
			fn(b.keys[i], b.vals[i*cpus:(i+1)*cpus])
		}
		if err != nil { // ErrKeyNotExist: the last batch
			return nil
		}
	}
}

// Changed is Each for the entries whose values differ from what the previous Changed saw of
// their key (every entry at the first, and a key that left and came back): the conversions and
// records of a map of thousands of cgroups, most of them idle in any one interval, then cost
// what its busy ones do. sig is a counter of one CPU's value that grows whenever the value
// changes (an event count); nil hashes the whole value. It returns how many entries m holds.
func (b *Batch[K, V]) Changed(m *ebpf.Map, sig func(V) uint64, fn func(K, []V)) (int, error) {
	if b.next == nil {
		b.seed = maphash.MakeSeed()
		b.next = map[K]uint64{}
	}
	err := b.Each(m, func(k K, vs []V) {
		var h uint64
		for _, v := range vs {
			if sig != nil {
				h += sig(v) // counters only grow: their sum changes when one does
			} else {
				h = h*31 + maphash.Comparable(b.seed, v)
			}
		}
		b.next[k] = h
		if old, ok := b.last[k]; ok && old == h {
			return
		}
		fn(k, vs)
	})
	if err != nil {
		// Nothing is known of what this read missed: see everything as new next time.
		clear(b.next)
		clear(b.last)
		return 0, err
	}
	n := len(b.next)
	b.last, b.next = b.next, b.last
	// After a churn of thousands of cgroups the pairs' signatures would keep megabytes.
	if b.room.Oversized(n) || b.next == nil {
		b.last, b.next = maproom.Fit(&b.room, b.last), make(map[K]uint64, n)
	} else {
		clear(b.next)
	}
	return n, nil
}

// walk is Each key by key.
func (b *Batch[K, V]) walk(m *ebpf.Map, fn func(K, []V)) error {
	var k K
	var vs []V
	it := m.Iterate()
	if !perCPU(m.Type()) {
		var v V
		for it.Next(&k, &v) {
			fn(k, []V{v})
		}
		return it.Err()
	}
	for it.Next(&k, &vs) {
		fn(k, vs)
	}
	return it.Err()
}

// perCPU says whether a map of type t holds a value per possible CPU.
func perCPU(t ebpf.MapType) bool {
	switch t {
	case ebpf.PerCPUHash, ebpf.PerCPUArray, ebpf.LRUCPUHash, ebpf.PerCPUCGroupStorage:
		return true
	}
	return false
}

// DeleteIf deletes the keys of hash map m for which gone holds and returns how many it
// deleted. Keys added meanwhile may be missed.
func (b *Batch[K, V]) DeleteIf(m *ebpf.Map, gone func(K) bool) (int, error) {
	var doomed []K
	err := b.Each(m, func(k K, _ []V) {
		if gone(k) {
			doomed = append(doomed, k)
		}
	})
	if err != nil {
		return 0, fmt.Errorf("listing keys: %w", err)
	}
	n := 0
	for _, k := range doomed {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return n, fmt.Errorf("deleting %+v: %w", k, err)
		}
		n++
	}
	return n, nil
}
