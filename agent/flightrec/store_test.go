package flightrec

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

func fp(v float64) *float64 { return &v }

// clock is a settable Options.Now.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}

func open(t testing.TB, o Options) *Store {
	t.Helper()
	s, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// Every record type and label set comes back as it went in, from sealed segments and from
// the journal, through the writer, a reader and a reopened writer.
func TestRoundTrip(t *testing.T) {
	sample := func(metric, cgroup, workload string, labels map[string]string, v *float64, h *hist.Log2) rundir.Record {
		return rundir.Record{Type: rundir.TypeSample, Metric: metric, Cgroup: cgroup, Workload: workload, Labels: labels, Value: v, Hist: h}
	}
	big := &hist.Log2{Count: math.MaxUint64, SumNs: math.MaxUint64 - 1}
	for i := range hist.Slots {
		big.Buckets = append(big.Buckets, math.MaxUint64>>i)
	}
	labels := map[string]string{"": "empty key", "k=v": "a=b", "nul": "x\x00y", "utf8": "été", "empty": ""}
	t1 := []rundir.Record{
		sample(rundir.MetricCPUUsage, "/a", "victim", nil, fp(float64(123456789)*1e-6), nil),
		sample(rundir.MetricCgroupPressure, "/a", "victim", map[string]string{rundir.LabelResource: "cpu", rundir.LabelKind: "some"}, fp(float64(987654)/1e6), nil),
		sample(rundir.MetricSystemPressure, "", "", map[string]string{rundir.LabelResource: "io", rundir.LabelKind: "full"}, fp(0.1+0.2), nil),
		sample("nan", "/b", "", nil, fp(math.NaN()), nil),
		sample("inf", "/b", "", nil, fp(math.Inf(1)), nil),
		sample("neginf", "/b", "", nil, fp(math.Inf(-1)), nil),
		sample("negzero", "/b", "", nil, fp(math.Copysign(0, -1)), nil),
		sample("tiny", "/b", "", nil, fp(5e-324), nil),
		sample("max", "/b", "", nil, fp(math.MaxFloat64), nil),
		sample("int", "/b", "", nil, fp(1<<53), nil),
		sample("odd labels", "/b", "w", labels, fp(-42), nil),
		sample(rundir.MetricRunqLatency, "/a", "victim", nil, nil, &hist.Log2{}),
		sample(rundir.MetricFsyncLatency, "/a", "victim", map[string]string{rundir.LabelSyscall: "fsync"}, nil, &hist.Log2{Buckets: []uint64{0, 0, 5, 0}, Count: 5, SumNs: 1e9}),
		sample(rundir.MetricBlkService, "/a", "", nil, nil, big),
		// The same series name as a value and as a histogram: two series.
		sample("both", "/c", "", nil, fp(1), nil),
		sample("both", "/c", "", nil, nil, &hist.Log2{Buckets: []uint64{1}, Count: 1, SumNs: 1}),
		{Type: rundir.TypeEvent, Time: t0.Add(-time.Hour), Name: rundir.EventOOMKill, Cgroup: "/a", Workload: "victim", Metric: "m",
			Labels: map[string]string{rundir.LabelOOMPID: "42", rundir.LabelOOMComm: "stress"}, Message: "killed", Value: fp(math.NaN()),
			Hist: &hist.Log2{Buckets: []uint64{1, 2}, Count: 3, SumNs: 4}},
		{Type: rundir.TypePhase, Time: t0, Name: rundir.PhaseBaseline, Event: rundir.EventStart},
		{Type: "custom", Time: t0.Add(time.Nanosecond), Message: "a type this store does not know"},
		{Type: rundir.TypeEvent, Message: "zero time"},
	}
	// The next ticks change some values (across float encodings), resend one unchanged, and
	// shrink a histogram.
	t2 := []rundir.Record{
		sample(rundir.MetricCPUUsage, "/a", "victim", nil, fp(float64(123999999)*1e-6), nil),
		sample("nan", "/b", "", nil, fp(7), nil),
		sample("int", "/b", "", nil, fp(0.5), nil),
		sample("negzero", "/b", "", nil, fp(math.Copysign(0, -1)), nil), // unchanged
		sample(rundir.MetricFsyncLatency, "/a", "victim", map[string]string{rundir.LabelSyscall: "fsync"}, nil, &hist.Log2{Buckets: []uint64{1}, Count: 1, SumNs: 3}),
		{Type: rundir.TypePhase, Time: t0.Add(time.Minute), Name: rundir.PhaseBaseline, Event: rundir.EventEnd},
	}
	t3 := []rundir.Record{
		sample("int", "/b", "", nil, fp(math.NaN()), nil),
		sample(rundir.MetricBlkService, "/a", "", nil, nil, &hist.Log2{Buckets: big.Buckets[:3], Count: 1, SumNs: 2}),
		sample("new", "/d", "", nil, fp(3), nil),
	}
	ticks := []tick{{t: t0, recs: t1}, {t: t0.Add(time.Minute), recs: t2}, {t: t0.Add(2 * time.Minute), recs: t3}}
	dir := t.TempDir()
	o := Options{Dir: dir, SegmentSpan: time.Minute, Now: func() time.Time { return t0 }}
	s := open(t, o)
	appendAll(t, s, ticks)
	if st := s.Status(); st.Segments != 2 || st.Ticks != 3 || st.Series != 17 || st.StoredSamples != 16+16+17 {
		t.Fatalf("status %+v", st)
	}

	var want []rundir.Record
	for _, tk := range ticks {
		for _, r := range tk.recs {
			if r.Type == rundir.TypeSample {
				if r.Metric == "negzero" && tk.t != t0 {
					continue // unchanged: not stored again
				}
				r.Time = tk.t
			}
			want = append(want, r)
		}
	}
	all := [2]time.Time{{}, t0.Add(time.Hour)}
	same(t, "store", readAll(t, s, all[0], all[1], 0), want)
	rd, err := OpenReader(dir)
	if err != nil {
		t.Fatal(err)
	}
	same(t, "reader", readAll(t, rd, all[0], all[1], 0), want)
	s.Close()
	s = open(t, o)
	same(t, "reopened", readAll(t, s, all[0], all[1], 0), want)
}

func TestAppendRejects(t *testing.T) {
	s := open(t, Options{Dir: t.TempDir(), Now: func() time.Time { return t0 }})
	ok := []rundir.Record{{Type: rundir.TypeSample, Metric: "m", Value: fp(1)}}
	for name, c := range map[string]struct {
		t    time.Time
		recs []rundir.Record
	}{
		"no value":    {t0, []rundir.Record{{Type: rundir.TypeSample, Metric: "m"}}},
		"both":        {t0, []rundir.Record{{Type: rundir.TypeSample, Metric: "m", Value: fp(1), Hist: &hist.Log2{}}}},
		"long hist":   {t0, []rundir.Record{{Type: rundir.TypeSample, Metric: "m", Hist: &hist.Log2{Buckets: make([]uint64, maxBuckets+1)}}}},
		"before 1970": {time.Unix(-1, 0), ok},
		"after 2262":  {time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC), ok},
	} {
		if err := s.Append(c.t, c.recs); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if err := s.Append(t0, ok); err != nil {
		t.Fatal(err)
	}
	for _, at := range []time.Time{t0, t0.Add(-time.Second)} {
		if err := s.Append(at, ok); err == nil || !strings.Contains(err.Error(), "not after") {
			t.Errorf("tick %v after %v: %v", at, t0, err)
		}
	}
	// Two samples of a series in a tick: the later one counts.
	dup := []rundir.Record{{Type: rundir.TypeSample, Metric: "m", Value: fp(2)}, {Type: rundir.TypeSample, Metric: "m", Value: fp(3)}}
	if err := s.Append(t0.Add(time.Second), dup); err != nil {
		t.Fatal(err)
	}
	got := readAll(t, s, t0, t0.Add(time.Hour), 0)
	if len(got) != 2 || *got[1].Value != 3 {
		t.Fatalf("got %v", got)
	}
	if st := s.Status(); st.WriteFailures != 0 || !st.Writable || st.Ticks != 2 {
		t.Fatalf("rejected ticks count as failures: %+v", st)
	}
}

func TestSecondWriter(t *testing.T) {
	dir := t.TempDir()
	s := open(t, Options{Dir: dir})
	if _, err := Open(Options{Dir: dir}); err == nil || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second writer: %v", err)
	}
	s.Close()
	s2, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatalf("after the first closed: %v", err)
	}
	s2.Close()
	if err := s.Append(t0, nil); err != ErrClosed {
		t.Fatalf("append after close: %v", err)
	}
}

// A series with no sample for SeriesIdle is left out of the segments after; reads from
// before still see it. So is one of a cgroup gone quiet, which the writer packs meanwhile.
func TestSeriesIdle(t *testing.T) {
	s := open(t, Options{Dir: t.TempDir(), SegmentSpan: 10 * time.Second, SeriesIdle: 15 * time.Second, Now: func() time.Time { return t0 }})
	for i := range 60 {
		recs := []rundir.Record{{Type: rundir.TypeSample, Metric: "busy", Value: fp(float64(i))}}
		if i == 0 {
			recs = append(recs, rundir.Record{Type: rundir.TypeSample, Metric: "gone", Value: fp(1)})
		}
		if i <= 5 { // idle from 20 s on, but only just: left out at 30 s
			recs = append(recs, rundir.Record{Type: rundir.TypeSample, Metric: "removed", Cgroup: "/removed", Value: fp(float64(i))})
		}
		if err := s.Append(t0.Add(time.Duration(i)*time.Second), recs); err != nil {
			t.Fatal(err)
		}
	}
	metrics := func(from time.Time) map[string]bool {
		m := map[string]bool{}
		for _, r := range readAll(t, s, from, t0.Add(time.Hour), 0) {
			m[r.Metric] = true
		}
		return m
	}
	if m := metrics(t0.Add(15 * time.Second)); !m["gone"] {
		t.Errorf("a series idle less than SeriesIdle is not read: %v", m)
	}
	if m := metrics(t0.Add(25 * time.Second)); m["gone"] || !m["removed"] {
		t.Errorf("from 25 s: %v, want removed and not gone", m)
	}
	if m := metrics(t0.Add(35 * time.Second)); m["gone"] || m["removed"] || !m["busy"] {
		t.Errorf("a series idle more than SeriesIdle is still read: %v", m)
	}
	if st := s.Status(); st.Series != 1 {
		t.Errorf("series followed: %d, want 1", st.Series)
	}
}

// The series of a cgroup gone quiet, which the writer packs, are left out each by its own last
// sample, however many segments carried them packed.
func TestPackedSeriesIdle(t *testing.T) {
	s := open(t, Options{Dir: t.TempDir(), SegmentSpan: 10 * time.Second, SeriesIdle: 25 * time.Second, Now: func() time.Time { return t0 }})
	for i := range 60 {
		recs := []rundir.Record{{Type: rundir.TypeSample, Metric: "busy", Value: fp(float64(i))}}
		for _, m := range []string{"early", "later"} {
			if i <= 1 || i <= 5 && m == "later" {
				recs = append(recs, rundir.Record{Type: rundir.TypeSample, Metric: m, Cgroup: "/removed", Value: fp(float64(i))})
			}
		}
		if err := s.Append(t0.Add(time.Duration(i)*time.Second), recs); err != nil {
			t.Fatal(err)
		}
	}
	for from, want := range map[time.Duration]string{25 * time.Second: "busy early later", 35 * time.Second: "busy later", 45 * time.Second: "busy"} {
		var got []string
		for _, r := range readAll(t, s, t0.Add(from), t0.Add(time.Hour), 0) {
			if !slices.Contains(got, r.Metric) {
				got = append(got, r.Metric)
			}
		}
		if slices.Sort(got); strings.Join(got, " ") != want {
			t.Errorf("from %v: %v, want %s", from, got, want)
		}
	}
}

// Retention removes the oldest segments past MaxBytes and those past MaxAge, but not what a
// pin keeps, across reopens, until it is unpinned.
func TestRetention(t *testing.T) {
	dir := t.TempDir()
	c := &clock{now: t0}
	ticks := randomTicks(4, 120, 40)
	for i := range ticks { // without late events: they would pin every segment holding one
		ticks[i].recs = slices.DeleteFunc(ticks[i].recs, func(r rundir.Record) bool { return r.Type != rundir.TypeSample && r.Time.Before(t0) })
	}
	o := Options{Dir: dir, SegmentSpan: 10 * time.Second, MaxBytes: 10 << 10, MaxAge: time.Hour, Now: c.Now}
	s := open(t, o)
	appendAll(t, s, ticks[:30])
	pinned := [2]time.Time{ticks[12].t, ticks[14].t}
	if err := s.Pin("incident", pinned[0], pinned[1]); err != nil {
		t.Fatal(err)
	}
	if err := s.Pin("bad", t0, t0.Add(-time.Second)); err == nil {
		t.Error("a pin ending before it starts")
	}
	for _, tk := range ticks[30:] {
		if err := s.Append(tk.t, tk.recs); err != nil {
			t.Fatal(err)
		}
		if st := s.Status(); st.Bytes-st.PinnedBytes > o.MaxBytes {
			t.Fatalf("%d bytes, %d pinned, over %d", st.Bytes, st.PinnedBytes, o.MaxBytes)
		}
	}
	st := s.Status()
	if st.Evicted == 0 || st.PinnedBytes == 0 || len(st.Pins) != 1 {
		t.Fatalf("status %+v", st)
	}
	if !st.Oldest.After(ticks[0].t) || st.Oldest.After(pinned[0]) {
		t.Errorf("oldest tick %v: want the pinned segment's, before %v", st.Oldest, pinned[0])
	}
	same(t, "pinned window", readAll(t, s, pinned[0], pinned[1], 0), expect(ticks, pinned[0], pinned[1], 0))
	// What is left is the pinned segment and the newest ones.
	var sealed []int64 // spans of the sealed segments, oldest first
	for _, tk := range ticks {
		if b := tk.t.UnixNano() / int64(o.SegmentSpan); len(sealed) == 0 || sealed[len(sealed)-1] != b {
			sealed = append(sealed, b)
		}
	}
	sealed = sealed[:len(sealed)-1] // the last is the journal's
	pinnedSpan := pinned[0].UnixNano() / int64(o.SegmentSpan)
	left := segNames(t, dir)
	var kept []int64
	for _, name := range left {
		var first int64
		fmt.Sscanf(name, segPrefix+"%d", &first)
		if b := first / int64(o.SegmentSpan); b != pinnedSpan {
			kept = append(kept, b)
		}
	}
	if len(kept) == 0 || !slices.Equal(kept, sealed[len(sealed)-len(kept):]) || len(left) == len(sealed) {
		t.Fatalf("segments left %v: want the pinned one (span %d) and the newest of %v", left, pinnedSpan, sealed)
	}

	// Pins persist; age retention keeps the pinned segment too.
	s.Close()
	b, err := os.ReadFile(filepath.Join(dir, pinsName))
	if err != nil {
		t.Fatal(err)
	}
	var pins []Pin
	if err := json.Unmarshal(b, &pins); err != nil || len(pins) != 1 || pins[0].ID != "incident" || !pins[0].From.Equal(pinned[0]) {
		t.Fatalf("pins.json: %s (%v)", b, err)
	}
	c.set(ticks[len(ticks)-1].t.Add(2 * time.Hour))
	s = open(t, o)
	if st := s.Status(); st.Segments != 1 || len(st.Pins) != 1 {
		t.Fatalf("after MaxAge: %d segments (want the pinned one), pins %v", st.Segments, st.Pins)
	}
	same(t, "pinned window after MaxAge", readAll(t, s, pinned[0], pinned[1], 0), expect(ticks, pinned[0], pinned[1], 0))
	if err := s.Unpin("nope"); err == nil {
		t.Error("unpinning an unknown pin")
	}
	if err := s.Unpin("incident"); err != nil {
		t.Fatal(err)
	}
	if st := s.Status(); st.Segments != 0 || st.PinnedBytes != 0 {
		t.Fatalf("after unpin: %+v", st)
	}
}

func segNames(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, segPrefix+"*"+segSuffix))
	if err != nil {
		t.Fatal(err)
	}
	for i := range m {
		m[i] = filepath.Base(m[i])
	}
	return m
}

// The bound, on a smaller node than the benchmark's: at most 2 bytes a logical
// sample, journal counted.
func TestCompact(t *testing.T) {
	const cgroups, minutes = 50, 25
	now := t0
	s := open(t, Options{Dir: t.TempDir(), Now: func() time.Time { return now }})
	g := newGen(cgroups, 7)
	for i := range minutes * 60 {
		now = t0.Add(time.Duration(i) * time.Second)
		if err := s.Append(now, g.tick()); err != nil {
			t.Fatal(err)
		}
	}
	st := s.Status()
	if want := int64(minutes * 60 * cgroups * seriesPerCgroup); st.StoredSamples != want {
		t.Fatalf("stored samples %d, want %d", st.StoredSamples, want)
	}
	perSample := float64(st.Bytes) / float64(st.StoredSamples)
	t.Logf("%d cgroups, %d min: %.3f bytes/sample (%d bytes, %d segments)", cgroups, minutes, perSample, st.Bytes, st.Segments)
	if perSample > 2 {
		t.Errorf("%.3f bytes/sample, more than 2", perSample)
	}
}

// Readers while the writer appends and seals see a whole prefix of the ticks, each once.
func TestReadWhileWriting(t *testing.T) {
	dir := t.TempDir()
	const n, nseries = 400, 12
	value := func(j, i int) float64 { return float64(i / (j + 1)) }
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
	s := open(t, Options{Dir: dir, SegmentSpan: 7 * time.Second, Now: func() time.Time { return t0 }})
	rd, err := OpenReader(dir)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	check := func(name string, r reader) {
		defer wg.Done()
		for reads := 0; ; reads++ {
			select {
			case <-done:
				if reads == 0 {
					t.Errorf("%s: no read", name)
				}
				return
			default:
			}
			var ticks []int
			err := r.Read(t0, at(n), 0, func(rec rundir.Record) error {
				i := int(rec.Time.Sub(t0) / time.Second)
				var j int
				fmt.Sscanf(rec.Metric, "s%d", &j)
				if *rec.Value != value(j, i) {
					return fmt.Errorf("series %d at tick %d: %v, want %v", j, i, *rec.Value, value(j, i))
				}
				if j == 0 {
					ticks = append(ticks, i)
				}
				return nil
			})
			if err != nil {
				t.Errorf("%s: %v", name, err)
				return
			}
			for k, i := range ticks {
				if i != k {
					t.Errorf("%s: ticks read %v..., not 0, 1, 2, ...", name, ticks[:k+1])
					return
				}
			}
		}
	}
	wg.Add(2)
	go check("store", s)
	go check("reader", rd)
	for i := range n {
		var recs []rundir.Record
		for j := range nseries {
			recs = append(recs, rundir.Record{Type: rundir.TypeSample, Metric: fmt.Sprintf("s%d", j), Value: fp(value(j, i))})
		}
		if err := s.Append(at(i), recs); err != nil {
			t.Fatal(err)
		}
		s.Status()
	}
	close(done)
	wg.Wait()
}

// A read copies the journal without holding the store: an Append made while the copy is due
// goes through at once, and a seal made then (the journal's bytes rewritten) makes the read
// take its copy again, so it still reads every tick once.
func TestAppendWhileAReadCopiesTheJournal(t *testing.T) {
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
	for name, ticks := range map[string]int{"append": 1, "append_and_seal": 12} {
		t.Run(name, func(t *testing.T) {
			s := open(t, Options{Dir: t.TempDir(), SegmentSpan: 10 * time.Second, Now: func() time.Time { return t0 }})
			tick := func(i int) error {
				return s.Append(at(i), []rundir.Record{{Type: rundir.TypeSample, Metric: "m", Value: fp(float64(i))}})
			}
			for i := range 3 {
				if err := tick(i); err != nil {
					t.Fatal(err)
				}
			}
			var once sync.Once
			beforeJournalCopy = func() {
				once.Do(func() {
					done := make(chan error, 1)
					go func() {
						var err error
						for i := 3; i < 3+ticks && err == nil; i++ {
							err = tick(i)
						}
						done <- err
					}()
					select {
					case err := <-done:
						if err != nil {
							t.Error(err)
						}
					case <-time.After(10 * time.Second):
						t.Error("Append waited for a read copying the journal")
					}
				})
			}
			defer func() { beforeJournalCopy = nil }()
			var got []int
			err := s.Read(t0, at(100), 0, func(rec rundir.Record) error {
				got = append(got, int(*rec.Value))
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range got {
				if v != k {
					t.Fatalf("read %v: want each tick once, in order", got)
				}
			}
			if segs := s.Status().Segments; len(got) < 3 || ticks > 10 && segs == 0 {
				t.Errorf("read %d ticks, %d segments sealed", len(got), segs)
			}
			t.Logf("read %d ticks, %d segments sealed", len(got), s.Status().Segments)
		})
	}
}
