//go:build linux

package runq

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"

	"github.com/nodectl/nodectl/rundir"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/prometheus/procfs"

	"github.com/nodectl/nodectl/record/trace/internal/features"
	"github.com/nodectl/nodectl/record/trace/internal/loader"
	"github.com/nodectl/nodectl/rundir/hist"
)

// Drop reasons as reported in Stats.Drops.
var dropReasons = map[runqDropReason]string{
	runqDropReasonDROP_HIST_FULL:    "latency_map_full",
	runqDropReasonDROP_PAIR_FULL:    "pairs_map_full",
	runqDropReasonDROP_STORAGE_FAIL: "task_storage",
	runqDropReasonDROP_DIRTY_FULL:   "marks_full",
}

// Tracer owns the loaded programs, their maps and links. It is not safe for concurrent use.
type Tracer struct {
	objs  runqObjects
	links []link.Link
	// summed: the kernel sums the changed keys over the CPUs (bpf/runq.bpf.c, runq_aggregate)
	// and the reader reads those sums (readSums). Else, where the kernel lacks its helpers, the
	// reader reads the maps whole (readWhole), with what follows up to pairSeen.
	summed bool
	sums   summedRead
	// Read's totals of every cgroup and pair without ChangedOnly, where the kernel hands over
	// only what changed.
	totals     map[uint64]hist.Log2
	totalPairs map[runqPairKey]Pair
	latency    loader.Batch[uint64, runqCell]
	slots      loader.Batch[uint32, runqSlot]
	pairs      loader.Batch[runqPairKey, runqPairVal]
	// slotSeen is each slot owner's count, on all CPUs, at the last read: with ChangedOnly a
	// cgroup whose slots moved is read whole even when its latency entry did not.
	slotSeen map[uint64]uint64
	// gone are slot owners Forget found removed: their slots are freed at their rmdir, and
	// one whose rmdir the program missed (a run skipped for recursion) is not read again.
	gone map[uint64]bool
	// The same for the pairs in slots: each one's count at the last read of the pairs, and
	// the pairs Forget found with a removed cgroup.
	pairSeen map[runqPairKey]uint64
	pairGone map[runqPairKey]bool
	changed  bool // Config.ChangedOnly
	budget   int  // Config.PairsBudget
	parts    int  // ReadPart calls since the pairs were last read
	held     int  // pairs the map held at the last read of them
	// Entries Forget deleted, which the programs' counts of those they added are less.
	deletedLatency, deletedPairs uint64
}

// summedRead are the buffers readSums reads the sums into, kept between reads.
type summedRead struct {
	keys   []uint32
	cgroup []runqCgroupSum
	pairs  []runqPairSum
	oncpu  []uint64
}

// New loads the programs and attaches them to sched_switch, to sched_wakeup on a kernel
// without the stamps of features.HaveKernelStamps, and to sched_wakeup_new on one without its
// own enqueue time (features.HaveSchedInfo). A failed New closes what it opened.
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
	if cfg.PairsBudget <= 0 {
		cfg.PairsBudget = DefaultPairsBudget
	}
	if cfg.slots == 0 {
		cfg.slots = defaultSlots
	}
	if cfg.slots&(cfg.slots-1) != 0 {
		return nil, fmt.Errorf("runq slots %d: want a power of two", cfg.slots)
	}
	if places := uint32(len(runqSlot{}.Pairs)); cfg.slotPairs == 0 || cfg.slotPairs > places {
		cfg.slotPairs = places
	}
	if cfg.taskStamps == 0 {
		pidMax, err := readPidMax()
		if err != nil {
			return nil, err
		}
		cfg.taskStamps = taskStampsFor(pidMax)
	}
	if cfg.taskStamps&(cfg.taskStamps-1) != 0 {
		return nil, fmt.Errorf("runq task stamps %d: want a power of two", cfg.taskStamps)
	}
	t := &Tracer{changed: cfg.ChangedOnly, budget: cfg.PairsBudget, slotSeen: map[uint64]uint64{}, gone: map[uint64]bool{},
		pairSeen: map[runqPairKey]uint64{}, pairGone: map[runqPairKey]bool{}}
	if !cfg.ChangedOnly {
		t.totals, t.totalPairs = map[uint64]hist.Log2{}, map[runqPairKey]Pair{}
	}
	opts := loader.Options{CgroupV1: cfg.CgroupV1, PerCgroup: map[string]uint32{
		runqMapLatency: cfg.MaxCgroups,
		runqMapPairs:   cfg.MaxPairs,
	}}
	// The marks are inserted and deleted at every read (bpf/runq.bpf.c, dirty), so they stay
	// preallocated: a delete gives the element back to the map's own free list. Allocated as
	// they filled, each delete went through the kernel's allocator for BPF maps (unit_free), 6%
	// of the agent's CPU at 1,000 cgroups (perf, make bench). Their elements are tens of bytes
	// and not per CPU: 1.6 MB at the default sizes.
	spec.Maps[runqMapDirty].MaxEntries = cfg.MaxCgroups
	spec.Maps[runqMapDirtyPairs].MaxEntries = cfg.MaxPairs
	// Where the kernel stamps what the waits need itself, wakeups run no program, and where
	// it stamps a task's enqueue, forks run none: sched_switch reads the stamps
	// (bpf/runq.bpf.c, kernel_stamps and queued_wait).
	stamps, enqueue := errors.New("not asked for"), errors.New("not asked for")
	if !cfg.noKernelStamps {
		stamps, enqueue = features.HaveKernelStamps(), features.HaveSchedInfo()
	}
	for name, err := range map[string]error{"use_kernel_stamps": stamps, "use_enqueue_stamp": enqueue} {
		if err := spec.Variables[name].Set(err == nil); err != nil {
			return nil, fmt.Errorf("setting %s of runq: %w", name, err)
		}
	}
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, fmt.Errorf("counting CPUs: %w", err)
	}
	// Slots need a program at cgroup removal to free them, and the sums one that walks the
	// marked keys, whose helpers older kernels lack: there those do nothing and stay
	// unattached, the maps take every cgroup and the reader reads them whole.
	helpers := errors.New("not asked for")
	if !cfg.noSlots || !cfg.noSums {
		helpers = features.HaveSlotHelpers()
	}
	useSlots := helpers == nil && !cfg.noSlots
	t.summed = helpers == nil && !cfg.noSums
	if err := spec.Variables["use_slots"].Set(useSlots); err != nil {
		return nil, fmt.Errorf("setting use_slots of runq: %w", err)
	}
	stub := asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}
	if !useSlots {
		log.Debug("no per-CPU slots", "reason", cmp.Or(helpers, errors.New("not asked for")))
		spec.Programs[runqProgRunqRmdir].Instructions = stub
	}
	// The aggregator's outputs, and its lists of what to sum again (two halves of an output's
	// size each).
	outputs := map[string]uint32{runqMapCgroupsOut: cfg.MaxCgroups, runqMapPairsOut: cfg.MaxPairs, runqMapOncpuOut: uint32(cpus),
		runqMapAgain: 2 * cfg.MaxCgroups, runqMapAgainPairs: 2 * cfg.MaxPairs}
	if !t.summed {
		log.Debug("reading the per-CPU maps whole", "reason", cmp.Or(helpers, errors.New("not asked for")))
		spec.Programs[runqProgRunqAggregate].Instructions = stub
		outputs = map[string]uint32{runqMapCgroupsOut: 1, runqMapPairsOut: 1, runqMapOncpuOut: 1, runqMapAgain: 2, runqMapAgainPairs: 2}
	}
	for name, n := range outputs {
		spec.Maps[name].MaxEntries = n
	}
	if !t.summed {
		t.totals, t.totalPairs = nil, nil
	}
	spec.Maps[runqMapSlots].MaxEntries = cfg.slots
	spec.Maps[runqMapTaskStamps].MaxEntries = cfg.taskStamps
	for name, v := range map[string]uint32{"slot_mask": cfg.slots - 1, "slot_pairs": cfg.slotPairs, "nr_cpus": uint32(cpus), "task_stamp_mask": cfg.taskStamps - 1,
		"again_half": outputs[runqMapAgain] / 2, "again_pairs_half": outputs[runqMapAgainPairs] / 2} {
		if err := spec.Variables[name].Set(v); err != nil {
			return nil, fmt.Errorf("setting %s of runq: %w", name, err)
		}
	}
	if err := loader.Load(rundir.ProgramRunq, spec, opts, &t.objs, log); err != nil {
		return nil, err
	}
	// runq_mkdir before sched_switch: a cgroup made in between could take the memory of a
	// freed one whose id a CPU's cache holds (bpf/runq.bpf.c, recent_ids).
	// runq_free and runq_exec too: a task freed, or a thread that execs, before they are
	// attached would keep its entry of task_stamps.
	hooks := []loader.Attachment{loader.TpBTF("cgroup_mkdir", t.objs.RunqMkdir), loader.TpBTF("sched_process_free", t.objs.RunqFree),
		loader.TpBTF("sched_process_exec", t.objs.RunqExec), loader.TpBTF("sched_switch", t.objs.RunqSwitch)}
	if useSlots {
		hooks = append(hooks, loader.TpBTF("cgroup_rmdir", t.objs.RunqRmdir))
	}
	if stamps != nil {
		log.Debug("tracing sched_wakeup", "reason", stamps)
		hooks = append(hooks, loader.TpBTF("sched_wakeup", t.objs.RunqWakeup))
	}
	if enqueue != nil {
		log.Debug("no scheduler enqueue time: tracing sched_wakeup_new", "reason", enqueue)
		hooks = append(hooks, loader.TpBTF("sched_wakeup_new", t.objs.RunqWakeupNew))
	}
	t.links, err = loader.Attach(hooks...)
	if err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

// Read sums each cgroup's and pair's entry and slots on every CPU (with Config.ChangedOnly,
// of the entries that changed since the previous Read).
func (t *Tracer) Read() (Stats, error) { return t.read(true) }

// ReadPart is Read for every interval: while the pairs map holds more than Config.PairsBudget
// entries it reads them only every ceil(pairs / PairsBudget) calls, and Pairs is empty in
// between. With ChangedOnly nothing is lost: the next read has every pair that changed since.
func (t *Tracer) ReadPart() (Stats, error) {
	t.parts++
	every := max(1, (t.held+t.budget-1)/t.budget)
	return t.read(t.parts >= every)
}

func (t *Tracer) read(pairs bool) (Stats, error) {
	if t.objs.Latency == nil {
		return Stats{}, errors.New("reading runq maps: tracer closed")
	}
	var st Stats
	var err error
	if t.summed {
		st, err = t.readSums(pairs)
	} else {
		st, err = t.readWhole(pairs)
	}
	if err != nil {
		return Stats{}, err
	}
	if st.Drops, err = loader.Drops(t.objs.Drops, dropReasons); err != nil {
		return Stats{}, fmt.Errorf("reading runq maps: %w", err)
	}
	st.Cost.Calls += uint64(len(dropReasons))
	st.Cost.Bytes += uint64(len(dropReasons)) * 8
	return st, nil
}

// readSums runs runq_aggregate and reads what it handed over: the sums, over the CPUs, of the
// cgroups (and, with pairs, of the pairs) that changed since the last read, and the cgroups
// on a CPU.
func (t *Tracer) readSums(pairs bool) (Stats, error) {
	var flag uint64
	if pairs {
		flag = 1
	}
	if _, err := t.objs.RunqAggregate.Run(&ebpf.RunOptions{Context: []uint64{flag}}); err != nil {
		return Stats{}, fmt.Errorf("summing runq maps: %w", err)
	}
	var cgroups, pairSums, oncpu uint32
	var latencies, held uint64
	for _, v := range []struct {
		v   *ebpf.Variable
		out any
	}{{t.objs.OutCgroups, &cgroups}, {t.objs.OutPairs, &pairSums}, {t.objs.OutOncpu, &oncpu},
		{t.objs.LatencyAdded, &latencies}, {t.objs.PairsAdded, &held}} {
		if err := v.v.Get(v.out); err != nil {
			return Stats{}, fmt.Errorf("reading runq sums: %w", err)
		}
	}
	st := Stats{Latency: make(map[uint64]hist.Log2, cgroups), Cost: Cost{Calls: 1, Bytes: 3*4 + 2*8}}
	sums, err := readOut(t.objs.CgroupsOut, cgroups, &t.sums.cgroup, &t.sums.keys, &st.Cost)
	if err != nil {
		return Stats{}, fmt.Errorf("reading runq sums of cgroups: %w", err)
	}
	for _, s := range sums {
		st.Latency[s.Cgroup] = hist.FromSlots(s.H.Slots[:], s.H.Count, s.H.SumNs)
	}
	if pairs {
		ps, err := readOut(t.objs.PairsOut, pairSums, &t.sums.pairs, &t.sums.keys, &st.Cost)
		if err != nil {
			return Stats{}, fmt.Errorf("reading runq sums of pairs: %w", err)
		}
		// A walk of a hash whose element is freed and taken again meanwhile may see a key
		// twice: once in the read.
		at := make(map[runqPairKey]int, len(ps))
		for _, p := range ps {
			if i, ok := at[p.Key]; ok {
				st.Pairs[i] = pairOf(p.Key, p.Val.Count, p.Val.WaitNs)
				continue
			}
			at[p.Key] = len(st.Pairs)
			st.Pairs = append(st.Pairs, pairOf(p.Key, p.Val.Count, p.Val.WaitNs))
		}
		t.parts = 0
	}
	ids, err := readOut(t.objs.OncpuOut, oncpu, &t.sums.oncpu, &t.sums.keys, &st.Cost)
	if err != nil {
		return Stats{}, fmt.Errorf("reading runq cgroups on CPU: %w", err)
	}
	for _, id := range ids {
		if !slices.Contains(st.OnCPU, id) {
			st.OnCPU = append(st.OnCPU, id)
		}
	}
	t.held = int(held - t.deletedPairs)
	st.Fill = max(loader.Fill(int(latencies-t.deletedLatency), t.objs.Latency), loader.Fill(t.held, t.objs.Pairs))
	if t.totals != nil {
		t.addTotals(&st)
	}
	return st, nil
}

// addTotals keeps st's changes in the totals and makes st them all: Read without ChangedOnly.
func (t *Tracer) addTotals(st *Stats) {
	for id, h := range st.Latency {
		t.totals[id] = h
	}
	for _, p := range st.Pairs {
		t.totalPairs[pairKeyOf(p)] = p
	}
	st.Latency = maps.Clone(t.totals)
	st.Pairs = slices.Collect(maps.Values(t.totalPairs))
}

// readOut reads the first n entries of the array m, one of runq_aggregate's outputs, into buf
// (keys its indexes), adding what it copied to c.
func readOut[V any](m *ebpf.Map, n uint32, buf *[]V, keys *[]uint32, c *Cost) ([]V, error) {
	if n == 0 {
		return nil, nil
	}
	if len(*buf) < int(n) {
		*buf = make([]V, n)
	}
	if len(*keys) < int(n) {
		*keys = make([]uint32, n)
	}
	var cursor ebpf.MapBatchCursor
	got, err := m.BatchLookup(&cursor, (*keys)[:n], (*buf)[:n], nil)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil, err
	}
	c.Calls++
	c.Bytes += uint64(got) * uint64(m.KeySize()+m.ValueSize())
	return (*buf)[:got], nil
}

// readWhole reads the maps whole (the slots of every CPU), passing on with ChangedOnly what
// changed.
func (t *Tracer) readWhole(pairs bool) (Stats, error) {
	st := Stats{Latency: map[uint64]hist.Log2{}}
	before := t.latency.Cost.Add(t.slots.Cost).Add(t.pairs.Cost)

	slots, slotPairs, err := t.readSlots(pairs)
	if err != nil {
		return Stats{}, err
	}
	latencies, err := each(t.changed, &t.latency, t.objs.Latency, func(c runqCell) uint64 { return c.H.Count }, func(id uint64, cs []runqCell) {
		st.Latency[id] = merged(cs[0], slots[id])
	})
	if err != nil {
		return Stats{}, fmt.Errorf("reading runq latency map: %w", err)
	}
	// A cgroup with slots whose latency entry was not read (it has none, or it did not change).
	seen := make(map[uint64]uint64, len(slots))
	for id, sum := range slots {
		n := sum.Count()
		seen[id] = n
		if _, done := st.Latency[id]; done || t.changed && t.slotSeen[id] == n {
			continue
		}
		var c runqCell
		st.Cost.Calls++
		switch err := t.objs.Latency.Lookup(id, &c); {
		case errors.Is(err, ebpf.ErrKeyNotExist):
		case err != nil:
			return Stats{}, fmt.Errorf("reading runq latency of cgroup %d: %w", id, err)
		default:
			st.Cost.Bytes += uint64(t.objs.Latency.ValueSize())
		}
		st.Latency[id] = merged(c, sum)
	}
	t.slotSeen = seen

	if pairs {
		if err := t.readPairs(&st, slotPairs); err != nil {
			return Stats{}, err
		}
	}

	st.Fill = max(loader.Fill(latencies, t.objs.Latency), loader.Fill(t.held, t.objs.Pairs))

	var cur []uint64
	if err := t.objs.Oncpu.Lookup(uint32(0), &cur); err != nil {
		return Stats{}, fmt.Errorf("reading runq oncpu map: %w", err)
	}
	for _, id := range cur {
		if id != 0 && !slices.Contains(st.OnCPU, id) {
			st.OnCPU = append(st.OnCPU, id)
		}
	}
	after := t.latency.Cost.Add(t.slots.Cost).Add(t.pairs.Cost)
	st.Cost.Calls += after.Calls - before.Calls + 1
	st.Cost.Bytes += after.Bytes - before.Bytes + uint64(len(cur))*8
	return st, nil
}

// readPairs adds the pairs to st: those of the pairs map (with ChangedOnly, that changed) with
// their places in slots on every CPU (slots, by readSlots) added, and those only in slots (that
// changed).
func (t *Tracer) readPairs(st *Stats, slots map[runqPairKey]runqPairVal) error {
	seen := make(map[runqPairKey]uint64, len(slots))
	for k, v := range slots {
		seen[k] = v.Count
	}
	add := func(k runqPairKey, v runqPairVal) {
		p := pairOf(k, v.Count, v.WaitNs)
		if s, ok := slots[k]; ok {
			p.Count += s.Count
			p.WaitNs += s.WaitNs
			delete(slots, k)
		}
		st.Pairs = append(st.Pairs, p)
	}
	n, err := each(t.changed, &t.pairs, t.objs.Pairs, func(v runqPairVal) uint64 { return v.Count }, func(k runqPairKey, vs []runqPairVal) { add(k, vs[0]) })
	if err != nil {
		return fmt.Errorf("reading runq pairs map: %w", err)
	}
	// Pairs in slots whose entry was not read (there is none, or it did not change).
	for k, v := range slots {
		if t.changed && t.pairSeen[k] == v.Count {
			continue
		}
		var v runqPairVal
		if err := t.objs.Pairs.Lookup(k, &v); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("reading runq pair %+v: %w", k, err)
		}
		add(k, v)
	}
	t.pairSeen = seen
	t.held, t.parts = n, 0
	return nil
}

// readSlots sums the slots of every CPU by the cgroup holding them, and, with withPairs, the
// pairs in them by pair, leaving out those Forget found removed.
func (t *Tracer) readSlots(withPairs bool) (map[uint64]*loader.HistSum, map[runqPairKey]runqPairVal, error) {
	sums := map[uint64]*loader.HistSum{}
	pairs := map[runqPairKey]runqPairVal{}
	stillGone, pairsStillGone := map[uint64]bool{}, map[runqPairKey]bool{}
	if !withPairs {
		pairsStillGone = t.pairGone
	}
	err := t.slots.Each(t.objs.Slots, func(_ uint32, per []runqSlot) {
		for _, s := range per {
			if t.gone[s.Cgroup] {
				stillGone[s.Cgroup] = true
			}
			if s.Cgroup == 0 || t.gone[s.Cgroup] {
				continue
			}
			sum := sums[s.Cgroup]
			if sum == nil {
				sum = &loader.HistSum{}
				sums[s.Cgroup] = sum
			}
			sum.Add(s.C.H.Slots[:], s.C.H.Count, s.C.H.SumNs)
			if !withPairs {
				continue
			}
			for _, p := range s.Pairs {
				if p.Taken == 0 {
					continue
				}
				k := runqPairKey{Victim: s.Cgroup, Preemptor: p.Preemptor, Kind: p.Kind}
				if t.pairGone[k] {
					pairsStillGone[k] = true
					continue
				}
				v := pairs[k]
				v.Count += p.Val.Count
				v.WaitNs += p.Val.WaitNs
				pairs[k] = v
			}
		}
	})
	if err != nil {
		return nil, nil, fmt.Errorf("reading runq slots: %w", err)
	}
	t.gone, t.pairGone = stillGone, pairsStillGone
	return sums, pairs, nil
}

// merged is a cgroup's histogram: its latency entry and its slots' sum.
func merged(c runqCell, slots *loader.HistSum) hist.Log2 {
	var sum loader.HistSum
	if slots != nil {
		sum = *slots
	}
	sum.Add(c.H.Slots[:], c.H.Count, c.H.SumNs)
	return sum.Log2()
}

// pairOf is the Pair of key k.
func pairOf(k runqPairKey, count, waitNs uint64) Pair {
	return Pair{Victim: k.Victim, Preemptor: k.Preemptor, Woken: runqWaitKind(k.Kind) == runqWaitKindWAIT_WOKEN, Count: count, WaitNs: waitNs}
}

// pairKeyOf is p's key.
func pairKeyOf(p Pair) runqPairKey {
	k := runqPairKey{Victim: p.Victim, Preemptor: p.Preemptor, Kind: uint32(runqWaitKindWAIT_PREEMPTED)}
	if p.Woken {
		k.Kind = uint32(runqWaitKindWAIT_WOKEN)
	}
	return k
}

// Forget deletes the entries of cgroups that live reports gone: latency entries by id, pairs
// whose victim or (real) preemptor is gone. It returns how many entries it deleted.
func (t *Tracer) Forget(live func(id uint64) bool) (int, error) {
	if t.objs.Latency == nil {
		return 0, errors.New("forgetting runq entries: tracer closed")
	}
	gone := func(k runqPairKey) bool { return !live(k.Victim) || !special(k.Preemptor) && !live(k.Preemptor) }
	if t.summed {
		// Batched, as a whole read is: the maps are shared, not per-CPU, so a batch copies
		// each value once, and a sweep of thousands of entries takes a few syscalls where
		// walking the keys took one a key (most of the agent's syscalls in the second a sweep
		// ran at 1,000 cgroups).
		n, err := t.latency.DeleteIf(t.objs.Latency, func(id uint64) bool { return !live(id) })
		t.deletedLatency += uint64(n)
		if err != nil {
			return n, fmt.Errorf("forgetting runq latency entries: %w", err)
		}
		m, err := t.pairs.DeleteIf(t.objs.Pairs, gone)
		t.deletedPairs += uint64(m)
		if err != nil {
			return n + m, fmt.Errorf("forgetting runq pairs: %w", err)
		}
		for id := range t.totals {
			if !live(id) {
				delete(t.totals, id)
			}
		}
		for k := range t.totalPairs {
			if gone(k) {
				delete(t.totalPairs, k)
			}
		}
		return n + m, nil
	}
	n, err := t.latency.DeleteIf(t.objs.Latency, func(id uint64) bool { return !live(id) })
	if err != nil {
		return n, fmt.Errorf("forgetting runq latency entries: %w", err)
	}
	for id := range t.slotSeen {
		if !live(id) {
			t.gone[id] = true
		}
	}
	for k := range t.pairSeen {
		if gone(k) {
			t.pairGone[k] = true
		}
	}
	m, err := t.pairs.DeleteIf(t.objs.Pairs, gone)
	if err != nil {
		return n + m, fmt.Errorf("forgetting runq pairs: %w", err)
	}
	return n + m, nil
}

// Close detaches and unloads everything. It is safe to call more than once.
func (t *Tracer) Close() error {
	err := loader.Close(rundir.ProgramRunq, t.links, &t.objs)
	t.links, t.objs = nil, runqObjects{}
	return err
}

// special reports whether a preemptor id stands for no cgroup.
func special(preemptor uint64) bool {
	return preemptor == PreemptorIdle || preemptor == PreemptorThrottled || preemptor == PreemptorKernel
}

// each reads m through b, whole or its changes (told by sig) as configured, and returns how
// many entries m holds.
func each[K, V comparable](changed bool, b *loader.Batch[K, V], m *ebpf.Map, sig func(V) uint64, fn func(K, []V)) (int, error) {
	if changed {
		return b.Changed(m, sig, fn)
	}
	n := 0
	err := b.Each(m, func(k K, vs []V) { n++; fn(k, vs) })
	return n, err
}

// readPidMax reads the highest pid the kernel hands out, plus one (kernel.pid_max).
func readPidMax() (uint64, error) {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return 0, fmt.Errorf("sizing runq's task stamps: %w", err)
	}
	v, err := fs.SysctlInts("kernel.pid_max")
	if err != nil {
		return 0, fmt.Errorf("sizing runq's task stamps: %w", err)
	}
	if len(v) != 1 || v[0] <= 0 {
		return 0, fmt.Errorf("sizing runq's task stamps: kernel.pid_max reads %v, want one positive number", v)
	}
	return uint64(v[0]), nil
}
