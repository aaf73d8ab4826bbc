package trace

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nodectl/nodectl/record/trace/blkio"
	"github.com/nodectl/nodectl/record/trace/fsync"
	"github.com/nodectl/nodectl/record/trace/runq"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

// fakeResolver knows cgroups by (controller, id).
type fakeResolver map[string]map[uint64]string

func (r fakeResolver) Path(controller string, id uint64) (string, bool) {
	p, ok := r[controller][id]
	return p, ok
}

// fakeSource serves stats set by the test and records what Forget was asked.
type fakeSource struct {
	runq    runq.Stats
	fsync   fsync.Stats
	blkio   blkio.Stats
	readErr error
	fill    map[string]float64 // by program
	// asked maps program -> id -> what the liveness check answered, at the last forget.
	asked map[string]map[uint64]bool
	// deleteRunq makes forgetting delete run-queue latency entries, as the real maps do.
	deleteRunq bool
}

// tracer returns a tracer over f that forgets at every collection.
func (f *fakeSource) tracer(res Resolver) *Tracer {
	f.asked = map[string]map[uint64]bool{}
	f.fill = map[string]float64{}
	forget := func(program string, ids func() []uint64) func(func(uint64) bool) (int, error) {
		return func(live func(uint64) bool) (int, error) {
			f.asked[program] = map[uint64]bool{}
			n := 0
			for _, id := range ids() {
				f.asked[program][id] = live(id)
				if !live(id) {
					n++
					if program == ProgramRunq && f.deleteRunq {
						delete(f.runq.Latency, id)
					}
				}
			}
			return n, nil
		}
	}
	noClose := func() error { return nil }
	return &Tracer{
		res:         res,
		log:         slog.New(slog.DiscardHandler),
		forgetEvery: 1,
		forgetFill:  DefaultForgetFill,
		status:      map[string]string{},
		sources: []source{
			{program: ProgramRunq, controller: "cpu", close: noClose,
				read: func(n namer) ([]series, float64, error) {
					return runqSeries(f.runq, n), f.fill[ProgramRunq], f.readErr
				},
				forget: forget(ProgramRunq, func() []uint64 {
					var ids []uint64
					for id := range f.runq.Latency {
						ids = append(ids, id)
					}
					return ids
				})},
			{program: ProgramFsync, controller: "blkio", close: noClose,
				read: func(n namer) ([]series, float64, error) {
					return fsyncSeries(f.fsync, n), f.fill[ProgramFsync], nil
				},
				forget: forget(ProgramFsync, func() []uint64 {
					var ids []uint64
					for k := range f.fsync.Latency {
						ids = append(ids, k.Cgroup)
					}
					return ids
				})},
			{program: ProgramBlkio, controller: "blkio", close: noClose,
				read: func(n namer) ([]series, float64, error) {
					return blkioSeries(f.blkio, n), f.fill[ProgramBlkio], nil
				},
				forget: forget(ProgramBlkio, func() []uint64 {
					var ids []uint64
					for k := range f.blkio.IO {
						ids = append(ids, k.Cgroup)
					}
					return ids
				})},
		},
	}
}

func histOf(ns ...uint64) hist.Log2 {
	var slots [hist.Slots]uint64
	var sum uint64
	for _, v := range ns {
		i := 0
		for v>>(i+1) > 0 {
			i++
		}
		slots[i]++
		sum += v
	}
	return hist.FromSlots(slots[:], uint64(len(ns)), sum)
}

// find returns the records of metric for cgroup whose labels include want.
func find(recs []rundir.Record, metric, cgroup string, want map[string]string) []rundir.Record {
	var out []rundir.Record
next:
	for _, r := range recs {
		if r.Metric != metric || r.Cgroup != cgroup {
			continue
		}
		for k, v := range want {
			if r.Labels[k] != v {
				continue next
			}
		}
		out = append(out, r)
	}
	return out
}

func one(t *testing.T, recs []rundir.Record, metric, cgroup string, labels map[string]string) rundir.Record {
	t.Helper()
	got := find(recs, metric, cgroup, labels)
	if len(got) != 1 {
		t.Fatalf("%s{cgroup=%q %v}: %d records, want 1 (all: %+v)", metric, cgroup, labels, len(got), recs)
	}
	return got[0]
}

func newFake() (*fakeSource, fakeResolver) {
	res := fakeResolver{
		"cpu":   {1: "/", 10: "/nodectl/r/victim", 11: "/nodectl/r/cpu-hog-0"},
		"blkio": {1: "/", 20: "/nodectl/r/victim", 21: "/nodectl/r/disk-hog-0"},
	}
	f := &fakeSource{
		runq: runq.Stats{
			Latency: map[uint64]hist.Log2{10: histOf(1000, 3000), 99: histOf(5)},
			Pairs: []runq.Pair{
				{Victim: 10, Preemptor: 11, Count: 7, WaitNs: 1_500_000_000},
				{Victim: 10, Preemptor: runq.PreemptorIdle, Count: 1, WaitNs: 10},
				{Victim: 10, Preemptor: runq.PreemptorThrottled, Count: 2, WaitNs: 250_000_000},
				{Victim: 10, Preemptor: runq.PreemptorKernel, Count: 5, WaitNs: 2_000_000},
				{Victim: 10, Preemptor: 11, Woken: true, Count: 4, WaitNs: 40_000_000},
				{Victim: 10, Preemptor: runq.PreemptorThrottled, Woken: true, Count: 6, WaitNs: 500_000_000},
				{Victim: 10, Preemptor: runq.PreemptorKernel, Woken: true, Count: 8, WaitNs: 3000},
				{Victim: 1, Preemptor: 99, Count: 3, WaitNs: 30},
			},
			Drops: map[string]uint64{"latency_map_full": 0, "pairs_map_full": 4},
		},
		fsync: fsync.Stats{
			Latency: map[fsync.Key]hist.Log2{
				{Cgroup: 20, Dev: "254:0", Syscall: "fsync"}: histOf(2_000_000),
				{Cgroup: 20, Dev: "", Syscall: "fdatasync"}:  histOf(100),
			},
			Drops: map[string]uint64{"latency_map_full": 0},
		},
		blkio: blkio.Stats{
			Queue:   map[blkio.Key]hist.Log2{{Cgroup: 21, Dev: "254:0", Op: "write"}: histOf(50_000)},
			Service: map[blkio.Key]hist.Log2{{Cgroup: 21, Dev: "254:0", Op: "write"}: histOf(900_000)},
			IO:      map[blkio.Key]blkio.Counters{{Cgroup: 21, Dev: "254:0", Op: "write"}: {Bytes: 4096, Requests: 1}},
			Drops:   map[string]uint64{},
		},
	}
	return f, res
}

// collectAll is one snapshot's samples and events together.
func collectAll(tr *Tracer, now time.Time) ([]rundir.Record, error) {
	s, err := tr.Snapshot(now)
	return append(s.Samples, s.Events...), err
}

func TestSnapshotConverts(t *testing.T) {
	f, res := newFake()
	tr := f.tracer(res)
	now := time.Unix(1700000000, 0)
	recs, err := collectAll(tr, now)
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	for _, r := range recs {
		if r.Type != rundir.TypeSample || !r.Time.Equal(now) {
			t.Errorf("record %+v: want type sample at %v", r, now)
		}
		if (r.Value == nil) == (r.Hist == nil) {
			t.Errorf("record %+v: want exactly one of value and hist", r)
		}
	}

	victim := "/nodectl/r/victim"
	if h := one(t, recs, rundir.MetricRunqLatency, victim, nil).Hist; h.Count != 2 || h.SumNs != 4000 {
		t.Errorf("victim runq latency %+v, want 2 waits summing 4000 ns", h)
	}
	one(t, recs, rundir.MetricRunqLatency, "<unknown:99>", nil)

	preempted := []string{rundir.MetricRunqPreemptions, rundir.MetricRunqPreemptWait}
	woken := []string{rundir.MetricRunqWakeupWaits, rundir.MetricRunqWakeupWait}
	for _, c := range []struct {
		name      string
		metrics   []string // count, wait
		preemptor string
		count     float64
		wait      float64
	}{
		{"neighbour", preempted, "/nodectl/r/cpu-hog-0", 7, 1.5},
		{"idle", preempted, rundir.CgroupIdle, 1, 1e-8},
		{"throttled", preempted, rundir.CgroupThrottled, 2, 0.25},
		{"kernel", preempted, rundir.CgroupKernel, 5, 0.002},
		{"woken_neighbour", woken, "/nodectl/r/cpu-hog-0", 4, 0.04},
		{"woken_throttled", woken, rundir.CgroupThrottled, 6, 0.5},
		{"woken_kernel", woken, rundir.CgroupKernel, 8, 3e-6},
	} {
		l := map[string]string{rundir.LabelPreemptor: c.preemptor}
		if v := *one(t, recs, c.metrics[0], victim, l).Value; v != c.count {
			t.Errorf("%s: %s %v, want %v", c.name, c.metrics[0], v, c.count)
		}
		if v := *one(t, recs, c.metrics[1], victim, l).Value; v != c.wait {
			t.Errorf("%s: %s %v, want %v", c.name, c.metrics[1], v, c.wait)
		}
	}
	one(t, recs, rundir.MetricRunqPreemptions, "/", map[string]string{rundir.LabelPreemptor: "<unknown:99>"})

	one(t, recs, rundir.MetricFsyncLatency, victim, map[string]string{rundir.LabelSyscall: "fsync", rundir.LabelDevice: "254:0"})
	if r := one(t, recs, rundir.MetricFsyncLatency, victim, map[string]string{rundir.LabelSyscall: "fdatasync"}); r.Labels[rundir.LabelDevice] != "" {
		t.Errorf("unknown device labelled %q", r.Labels[rundir.LabelDevice])
	}

	hog := "/nodectl/r/disk-hog-0"
	w := map[string]string{rundir.LabelDevice: "254:0", rundir.LabelOp: "write"}
	one(t, recs, rundir.MetricBlkQueue, hog, w)
	one(t, recs, rundir.MetricBlkService, hog, w)
	if v := *one(t, recs, rundir.MetricBlkBytes, hog, w).Value; v != 4096 {
		t.Errorf("bytes %v, want 4096", v)
	}
	if v := *one(t, recs, rundir.MetricBlkRequests, hog, w).Value; v != 1 {
		t.Errorf("requests %v, want 1", v)
	}

	if v := *one(t, recs, rundir.MetricBPFDrops, "", map[string]string{rundir.LabelProgram: ProgramRunq, rundir.LabelReason: "pairs_map_full"}).Value; v != 4 {
		t.Errorf("runq pairs_map_full drops %v, want 4", v)
	}
	one(t, recs, rundir.MetricBPFDrops, "", map[string]string{rundir.LabelProgram: ProgramFsync, rundir.LabelReason: "latency_map_full"})
}

// A snapshot is full every time: deciding what changed is the recorder's (collect.Changes).
func TestSnapshotIsFull(t *testing.T) {
	f, res := newFake()
	tr := f.tracer(res)
	first, err := collectAll(tr, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	f.runq.Latency[10] = f.runq.Latency[10].Add(histOf(8000))
	again, err := collectAll(tr, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(again) != len(first) {
		t.Errorf("second snapshot has %d samples, the first %d", len(again), len(first))
	}
	if h := one(t, again, rundir.MetricRunqLatency, "/nodectl/r/victim", nil).Hist; h.Count != 3 {
		t.Errorf("victim runq latency %+v after a new wait, want 3 waits", h)
	}
}

func TestCollectForgetsUnknown(t *testing.T) {
	f, res := newFake()
	tr := f.tracer(res)
	if _, err := collectAll(tr, time.Now()); err != nil {
		t.Fatal(err)
	}
	// Liveness is asked in each source's own hierarchy: 20 is a blkio id, unknown to cpu.
	f.runq.Latency[20] = histOf(1)
	if _, err := collectAll(tr, time.Now()); err != nil {
		t.Fatal(err)
	}
	for program, want := range map[string]map[uint64]bool{
		ProgramRunq:  {10: true, 99: false, 20: false},
		ProgramFsync: {20: true},
		ProgramBlkio: {21: true},
	} {
		for id, live := range want {
			if got, ok := f.asked[program][id]; !ok || got != live {
				t.Errorf("%s: liveness of %d = %v (asked %v), want %v", program, id, got, ok, live)
			}
		}
	}
}

// Forgetting walks every map and asks the resolver about every id, so it runs every
// forgetEvery collections, or at once when a map fills past forgetFill. Whenever it runs, the
// entries it deletes were emitted by the same collection, with their last values.
func TestCollectForgetSchedule(t *testing.T) {
	f, res := newFake()
	tr := f.tracer(res)
	tr.forgetEvery = 3
	f.deleteRunq = true
	const gone = 99 // unknown to the resolver: a removed cgroup
	collect := func(i int) []rundir.Record {
		t.Helper()
		f.asked = map[string]map[uint64]bool{}
		recs, err := collectAll(tr, time.Now())
		if err != nil {
			t.Fatalf("collect %d: %v", i, err)
		}
		return recs
	}
	for i := 1; i <= 2; i++ {
		collect(i)
		if len(f.asked) != 0 {
			t.Fatalf("collect %d of every %d forgot: asked %v", i, tr.forgetEvery, f.asked)
		}
		// The removed cgroup's entry keeps changing until it is forgotten.
		f.runq.Latency[gone] = f.runq.Latency[gone].Add(histOf(7))
	}
	recs := collect(3)
	for _, src := range tr.sources {
		if _, ok := f.asked[src.program]; !ok {
			t.Errorf("collect 3 of every 3: %s not forgotten", src.program)
		}
	}
	last := one(t, recs, rundir.MetricRunqLatency, "<unknown:99>", nil).Hist
	if last.Count != 3 {
		t.Errorf("removed cgroup last emitted with %d waits, want its final 3", last.Count)
	}
	if _, ok := f.runq.Latency[gone]; ok {
		t.Fatal("removed cgroup's entry not deleted")
	}
	if recs := collect(4); len(find(recs, rundir.MetricRunqLatency, "<unknown:99>", nil)) != 0 {
		t.Errorf("removed cgroup emitted again after it was forgotten")
	}

	// A map past the fill threshold is swept at the next collection, alone.
	f.fill[ProgramRunq] = 0.9
	collect(5)
	if _, ok := f.asked[ProgramRunq]; !ok || len(f.asked) != 1 {
		t.Errorf("runq %.0f%% full: forgot %v, want runq alone", 100*f.fill[ProgramRunq], f.asked)
	}
	// Still as full (of live cgroups): not swept again at every collection, only once fuller.
	if collect(6); f.asked[ProgramRunq] != nil {
		t.Errorf("runq still 90%% full: forgot %v again, want runq left until it grows", f.asked)
	}
	f.fill[ProgramRunq] = 0.96
	collect(7)
	if _, ok := f.asked[ProgramRunq]; !ok {
		t.Errorf("runq grew to 96%%: forgot %v, want runq", f.asked)
	}
	f.fill[ProgramRunq] = 0.1
	collect(8)
	collect(9) // the others' third since their last sweep, runq's second
	if _, ok := f.asked[ProgramRunq]; ok || len(f.asked) != 2 {
		t.Errorf("collect 9: forgot %v, want fsync and blkio only", f.asked)
	}
}

func TestNewRejectsBadForget(t *testing.T) {
	for _, cfg := range []Config{{ForgetEvery: -1}, {ForgetFill: -0.1}, {ForgetFill: 1.5}} {
		if _, err := New(cfg, fakeResolver{}, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "forgetting") {
			t.Errorf("New(%+v) = %v, want a forget setting error", cfg, err)
		}
	}
}

func TestCollectReadError(t *testing.T) {
	f, res := newFake()
	tr := f.tracer(res)
	if _, err := collectAll(tr, time.Now()); err != nil {
		t.Fatal(err)
	}
	f.readErr = errors.New("map gone")
	f.blkio.IO[blkio.Key{Cgroup: 21, Dev: "254:0", Op: "write"}] = blkio.Counters{Bytes: 8192, Requests: 2}
	f.asked = map[string]map[uint64]bool{}
	recs, err := collectAll(tr, time.Now())
	if err == nil {
		t.Fatal("Collect hid the read error")
	}
	if len(find(recs, rundir.MetricBlkBytes, "/nodectl/r/disk-hog-0", nil)) != 1 {
		t.Errorf("a failing source stopped the others: %+v", recs)
	}
	if _, ok := f.asked[ProgramRunq]; ok {
		t.Errorf("forgot entries of a source that could not be read")
	}
	// The failed read left the entries alone: the next snapshot has them.
	f.readErr = nil
	recs, err = collectAll(tr, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(find(recs, rundir.MetricRunqLatency, "/nodectl/r/victim", nil)) != 1 {
		t.Errorf("the run-queue series are missing after a failed read: %+v", recs)
	}
}

func TestCloseTwiceAndCollectAfter(t *testing.T) {
	f, res := newFake()
	tr := f.tracer(res)
	for i := range 2 {
		if err := tr.Close(); err != nil {
			t.Fatalf("Close #%d: %v", i+1, err)
		}
	}
	if _, err := tr.Snapshot(time.Now()); err == nil {
		t.Error("Snapshot after Close succeeded")
	}
}

func TestNewRejectsUnknownProgram(t *testing.T) {
	if _, err := New(Config{Programs: []string{"runq", "oom"}}, fakeResolver{}, slog.New(slog.DiscardHandler)); err == nil {
		t.Error("New accepted an unknown program")
	}
}
