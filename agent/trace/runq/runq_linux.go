//go:build linux

package runq

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/nodectl/nodectl/agent/hist"
)

// Drop reasons as reported in Stats.Drops.
var dropReasons = map[runqDropReason]string{
	runqDropReasonDROP_HIST_FULL:    "latency_map_full",
	runqDropReasonDROP_PAIR_FULL:    "pairs_map_full",
	runqDropReasonDROP_STORAGE_FAIL: "task_storage",
}

// Tracer owns the loaded programs, their maps and links. It is not safe for concurrent use.
type Tracer struct {
	objs  runqObjects
	links []link.Link
}

// New loads the programs and attaches them to sched_wakeup, sched_wakeup_new and
// sched_switch. A failed New closes what it opened.
func New(cfg Config, log *slog.Logger) (*Tracer, error) {
	if cfg.MaxCgroups == 0 {
		cfg.MaxCgroups = DefaultMaxCgroups
	}
	if cfg.MaxPairs == 0 {
		cfg.MaxPairs = DefaultMaxPairs
	}
	spec, err := loadRunq()
	if err != nil {
		return nil, fmt.Errorf("loading runq spec: %w", err)
	}
	if err := spec.Variables[runqVarCgroupV1].Set(cfg.CgroupV1); err != nil {
		return nil, fmt.Errorf("setting cgroup_v1: %w", err)
	}
	spec.Maps[runqMapLatency].MaxEntries = cfg.MaxCgroups
	spec.Maps[runqMapPairs].MaxEntries = cfg.MaxPairs
	if lazyMapsSafe(log) {
		// Per-CPU values cost max_entries x value size x CPUs when preallocated: tens of MB
		// on a large node for cgroups that mostly do not exist.
		spec.Maps[runqMapLatency].Flags |= unix.BPF_F_NO_PREALLOC
		spec.Maps[runqMapPairs].Flags |= unix.BPF_F_NO_PREALLOC
	}

	t := &Tracer{}
	if err := spec.LoadAndAssign(&t.objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			log.Warn("verifier rejected runq", "log", fmt.Sprintf("%+v", ve))
		}
		return nil, fmt.Errorf("loading runq objects: %w", err)
	}
	for _, a := range []struct {
		tracepoint string
		prog       *ebpf.Program
	}{
		{"sched_wakeup", t.objs.RunqWakeup},
		{"sched_wakeup_new", t.objs.RunqWakeupNew},
		{"sched_switch", t.objs.RunqSwitch},
	} {
		l, err := link.AttachTracing(link.TracingOptions{Program: a.prog})
		if err != nil {
			t.Close()
			return nil, fmt.Errorf("attaching to %s: %w", a.tracepoint, err)
		}
		t.links = append(t.links, l)
	}
	return t, nil
}

// lazyMapsSafe reports whether hash maps may allocate at run time from sched_switch: only
// with the BPF memory allocator (Linux 6.1), which never takes locks the scheduler holds.
// Older kernels allocate with the slab and could deadlock on the run-queue lock.
func lazyMapsSafe(log *slog.Logger) bool {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		log.Warn("reading kernel BTF, preallocating maps", "err", err)
		return false
	}
	_, err = spec.AnyTypeByName("bpf_mem_alloc")
	return err == nil
}

// Read sums the per-CPU values of every map.
func (t *Tracer) Read() (Stats, error) {
	if t.objs.Latency == nil {
		return Stats{}, errors.New("reading runq maps: tracer closed")
	}
	st := Stats{Latency: map[uint64]hist.Log2{}, Drops: map[string]uint64{}}

	var id uint64
	var hs []runqHist
	it := t.objs.Latency.Iterate()
	for it.Next(&id, &hs) {
		var slots [len(runqHist{}.Slots)]uint64
		var count, sum uint64
		for _, h := range hs {
			for i, v := range h.Slots {
				slots[i] += v
			}
			count += h.Count
			sum += h.SumNs
		}
		st.Latency[id] = hist.FromSlots(slots[:], count, sum)
	}
	if err := it.Err(); err != nil {
		return Stats{}, fmt.Errorf("reading runq latency map: %w", err)
	}

	var k runqPairKey
	var vs []runqPairVal
	it = t.objs.Pairs.Iterate()
	for it.Next(&k, &vs) {
		p := Pair{Victim: k.Victim, Preemptor: k.Preemptor}
		for _, v := range vs {
			p.Count += v.Count
			p.WaitNs += v.WaitNs
		}
		st.Pairs = append(st.Pairs, p)
	}
	if err := it.Err(); err != nil {
		return Stats{}, fmt.Errorf("reading runq pairs map: %w", err)
	}

	for r, name := range dropReasons {
		var per []uint64
		if err := t.objs.Drops.Lookup(uint32(r), &per); err != nil {
			return Stats{}, fmt.Errorf("reading runq drops %s: %w", name, err)
		}
		var n uint64
		for _, v := range per {
			n += v
		}
		st.Drops[name] = n
	}
	return st, nil
}

// Forget deletes the entries of cgroups that live reports gone: latency entries by id, pairs
// whose victim or (real) preemptor is gone. It returns how many entries it deleted.
func (t *Tracer) Forget(live func(id uint64) bool) (int, error) {
	if t.objs.Latency == nil {
		return 0, errors.New("forgetting runq entries: tracer closed")
	}
	ids, err := keys[uint64](t.objs.Latency)
	if err != nil {
		return 0, fmt.Errorf("listing runq latency map: %w", err)
	}
	ids = slices.DeleteFunc(ids, live)
	pairs, err := keys[runqPairKey](t.objs.Pairs)
	if err != nil {
		return 0, fmt.Errorf("listing runq pairs map: %w", err)
	}
	pairs = slices.DeleteFunc(pairs, func(k runqPairKey) bool {
		special := k.Preemptor == PreemptorIdle || k.Preemptor == PreemptorThrottled
		return live(k.Victim) && (special || live(k.Preemptor))
	})

	n := 0
	for _, id := range ids {
		if err := t.objs.Latency.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return n, fmt.Errorf("deleting runq latency of cgroup %d: %w", id, err)
		}
		n++
	}
	for _, k := range pairs {
		if err := t.objs.Pairs.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return n, fmt.Errorf("deleting runq pair %d/%d: %w", k.Victim, k.Preemptor, err)
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
			errs = append(errs, fmt.Errorf("detaching runq program: %w", err))
		}
	}
	t.links = nil
	if err := t.objs.Close(); err != nil {
		errs = append(errs, fmt.Errorf("closing runq objects: %w", err))
	}
	t.objs = runqObjects{}
	return errors.Join(errs...)
}
