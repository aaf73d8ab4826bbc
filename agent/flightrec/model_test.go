package flightrec

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

// tick is what one Append was given.
type tick struct {
	t    time.Time
	recs []rundir.Record
	keys []string // of recs, filled by expect
}

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// randomTicks makes n ticks about a second apart of nseries series of every kind: counters
// made as the samplers make them (integers, usec*1e-6, ns/1e9), floats no mode fits (NaN,
// infinities, -0, tiny and huge ones), histograms that grow, shrink and empty, label sets of
// 0 to 3 labels, series that start late or stop, values resent unchanged, and events and
// phases, some timed before their tick.
func randomTicks(seed uint64, n, nseries int) []tick {
	rng := rand.New(rand.NewPCG(seed, 1))
	type rs struct {
		rec        rundir.Record
		kind       int
		start, end int
		v          float64
		n          uint64
		h          hist.Log2
	}
	odd := []float64{math.NaN(), math.Inf(1), math.Inf(-1), math.Copysign(0, -1), 0, 5e-324, 1e300, -1.5, math.Pi, 0.1, 1e-7, 123456789.123}
	var series []*rs
	for i := range nseries {
		r := rundir.Record{Type: rundir.TypeSample, Metric: fmt.Sprintf("metric_%d", i%7), Cgroup: fmt.Sprintf("/kubepods/pod%d", i%5)}
		if i%3 == 0 {
			r.Workload = fmt.Sprintf("wl-%d", i%4)
		}
		switch i % 4 {
		case 1:
			r.Labels = map[string]string{"op": fmt.Sprint(i)}
		case 2:
			r.Labels = map[string]string{"device": "8:0", "op": fmt.Sprint(i)}
		case 3:
			r.Labels = map[string]string{"a": "1", "b": fmt.Sprint(i), "c": "é\x00x"}
		}
		s := &rs{rec: r, kind: i % 6, start: 0, end: n}
		if i%5 == 4 {
			s.start = rng.IntN(n)
		}
		if i%7 == 6 {
			s.end = rng.IntN(n)
		}
		series = append(series, s)
	}
	ticks := make([]tick, n)
	at := t0
	for i := range ticks {
		at = at.Add(time.Second + time.Duration(rng.IntN(5e6)))
		tk := tick{t: at}
		for _, s := range series {
			if i < s.start || i >= s.end {
				continue
			}
			send := i == s.start || rng.Float64() < 0.3
			resend := rng.Float64() < 0.1
			if !send && !resend {
				continue
			}
			r := s.rec
			if s.kind == 5 {
				if send {
					switch rng.IntN(10) {
					case 0:
						s.h = hist.Log2{} // emptied
					case 1:
						s.h.Buckets = s.h.Buckets[:len(s.h.Buckets)/2] // recreated: goes back
					}
					for range rng.IntN(20) {
						b := rng.IntN(hist.Slots)
						for len(s.h.Buckets) <= b {
							s.h.Buckets = append(s.h.Buckets, 0)
						}
						s.h.Buckets[b] += rng.Uint64N(1000)
						s.h.Count++
						s.h.SumNs += rng.Uint64()
					}
				}
				h := s.h
				h.Buckets = slices.Clone(s.h.Buckets)
				r.Hist = &h
			} else {
				if send {
					switch s.kind {
					case 0:
						s.n += rng.Uint64N(1 << 20)
						s.v = float64(s.n)
					case 1:
						s.n += rng.Uint64N(1e6)
						s.v = float64(s.n) * 1e-6
					case 2:
						s.n += rng.Uint64N(1e9)
						s.v = float64(s.n) / 1e9
					case 3:
						s.v = odd[rng.IntN(len(odd))]
					case 4:
						s.v = float64(rng.Int64N(1<<40) - 1<<39)
					}
				}
				v := s.v
				r.Value = &v
			}
			tk.recs = append(tk.recs, r)
		}
		if rng.Float64() < 0.2 {
			ev := rundir.Record{Type: rundir.TypeEvent, Time: at.Add(-time.Duration(rng.IntN(3)) * time.Second), Name: rundir.EventOOMKill,
				Cgroup: "/kubepods/pod1", Message: fmt.Sprintf("event %d", i),
				Labels: map[string]string{rundir.LabelOOMPID: fmt.Sprint(i), rundir.LabelOOMComm: "stress"}}
			if i%2 == 0 {
				v := float64(i) * 0.5
				ev.Value = &v
				ev.Hist = &hist.Log2{Buckets: []uint64{1, 0, 3}, Count: 4, SumNs: 99}
			}
			if i%10 == 3 {
				ev.Time = t0.Add(-time.Hour) // late news: before every tick
			}
			tk.recs = append(tk.recs, ev)
		}
		if i%25 == 0 {
			tk.recs = append(tk.recs, rundir.Record{Type: rundir.TypePhase, Time: at, Name: rundir.PhaseStress, Event: rundir.EventStart, Workload: "victim"})
		}
		ticks[i] = tk
	}
	return ticks
}

// expect is what Read must return for ticks, computed the obvious way: the state of every
// series at every tick.
func expect(ticks []tick, from, to time.Time, step time.Duration) []rundir.Record {
	type st struct {
		rec     rundir.Record
		changed bool
	}
	state := map[string]*st{}
	var order []string
	var out []rundir.Record
	started := false
	var next, lastT time.Time
	lastSel := false
	emit := func(t time.Time, all bool) {
		for _, k := range order {
			s := state[k]
			if all || s.changed {
				r := s.rec
				r.Time = t
				out = append(out, r)
			}
			s.changed = false
		}
	}
	for i := range ticks {
		tk := &ticks[i]
		if tk.t.After(to) {
			break
		}
		if tk.keys == nil {
			for _, r := range tk.recs {
				tk.keys = append(tk.keys, key(r))
			}
		}
		for j, r := range tk.recs {
			if r.Type != rundir.TypeSample {
				continue
			}
			k := tk.keys[j]
			s := state[k]
			if s == nil {
				s = &st{}
				state[k] = s
				order = append(order, k)
				s.changed = true
			} else if !sameValue(s.rec, r) {
				s.changed = true
			}
			s.rec = r
		}
		if tk.t.Before(from) {
			continue
		}
		lastT = tk.t
		lastSel = !started || step == 0 || !tk.t.Before(next)
		if lastSel {
			emit(tk.t, !started)
			started, next = true, tk.t.Add(step)
		}
	}
	if started && !lastSel {
		emit(lastT, false)
	}
	for _, tk := range ticks {
		for _, r := range tk.recs {
			if r.Type != rundir.TypeSample && !r.Time.Before(from) && !r.Time.After(to) {
				out = append(out, r)
			}
		}
	}
	return out
}

func key(r rundir.Record) string {
	kind := "v"
	if r.Hist != nil {
		kind = "h"
	}
	return kind + "\x01" + r.Workload + "\x01" + rundir.SeriesKey(r.Metric, r.Cgroup, r.Labels)
}

func sameValue(a, b rundir.Record) bool {
	if a.Value != nil && b.Value != nil {
		return math.Float64bits(*a.Value) == math.Float64bits(*b.Value)
	}
	return a.Hist != nil && b.Hist != nil && a.Hist.Count == b.Hist.Count && a.Hist.SumNs == b.Hist.SumNs && slices.Equal(a.Hist.Buckets, b.Hist.Buckets)
}

// show is a record as a line, every field of it, for comparing.
func show(r rundir.Record) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %s|%s|%s", r.Time.UTC().Format(time.RFC3339Nano), r.Type, r.Metric, r.Cgroup, r.Workload)
	for _, k := range slices.Sorted(maps.Keys(r.Labels)) {
		fmt.Fprintf(&b, " %q=%q", k, r.Labels[k])
	}
	if r.Value != nil {
		fmt.Fprintf(&b, " v=%g(%x)", *r.Value, math.Float64bits(*r.Value))
	}
	if r.Hist != nil {
		fmt.Fprintf(&b, " h=%d/%d/%v", r.Hist.Count, r.Hist.SumNs, append([]uint64{}, r.Hist.Buckets...))
	}
	if r.Name+r.Event+r.Message != "" {
		fmt.Fprintf(&b, " name=%q event=%q msg=%q", r.Name, r.Event, r.Message)
	}
	return b.String()
}

// same checks that got holds want's records, in time order (the order within one time is
// free).
func same(t *testing.T, what string, got, want []rundir.Record) {
	t.Helper()
	for i := 1; i < len(got); i++ {
		if got[i].Time.Before(got[i-1].Time) {
			t.Fatalf("%s: record %d out of time order:\n%s\nafter\n%s", what, i, show(got[i]), show(got[i-1]))
		}
	}
	type keyed struct {
		r rundir.Record
		k string
	}
	canon := func(rs []rundir.Record) []keyed {
		out := make([]keyed, len(rs))
		for i, r := range rs {
			out[i] = keyed{r, r.Type + "\x02" + key(r) + "\x02" + r.Name + "\x02" + r.Event + "\x02" + r.Message}
		}
		slices.SortFunc(out, func(a, b keyed) int {
			if c := a.r.Time.Compare(b.r.Time); c != 0 {
				return c
			}
			return strings.Compare(a.k, b.k)
		})
		return out
	}
	g, w := canon(got), canon(want)
	for i := 0; i < max(len(g), len(w)); i++ {
		if i < len(g) && i < len(w) && g[i].k == w[i].k && equalRecords(g[i].r, w[i].r) {
			continue
		}
		var gi, wi string
		if i < len(g) {
			gi = show(g[i].r)
		}
		if i < len(w) {
			wi = show(w[i].r)
		}
		t.Fatalf("%s: %d records, want %d; first difference at %d:\n got %s\nwant %s", what, len(g), len(w), i, gi, wi)
	}
}

// equalRecords compares every field; no buckets and empty buckets are alike, as are no
// labels and empty labels.
func equalRecords(a, b rundir.Record) bool {
	if !a.Time.Equal(b.Time) || a.Type != b.Type || a.Metric != b.Metric || a.Cgroup != b.Cgroup || a.Workload != b.Workload ||
		a.Name != b.Name || a.Event != b.Event || a.Message != b.Message || !maps.Equal(a.Labels, b.Labels) {
		return false
	}
	if (a.Value == nil) != (b.Value == nil) || a.Value != nil && math.Float64bits(*a.Value) != math.Float64bits(*b.Value) {
		return false
	}
	if (a.Hist == nil) != (b.Hist == nil) {
		return false
	}
	return a.Hist == nil || a.Hist.Count == b.Hist.Count && a.Hist.SumNs == b.Hist.SumNs && slices.Equal(a.Hist.Buckets, b.Hist.Buckets)
}

type reader interface {
	Read(from, to time.Time, step time.Duration, fn func(rundir.Record) error) error
}

func readAll(t *testing.T, r reader, from, to time.Time, step time.Duration) []rundir.Record {
	t.Helper()
	var out []rundir.Record
	if err := r.Read(from, to, step, func(rec rundir.Record) error { out = append(out, rec); return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

func appendAll(t testing.TB, s *Store, ticks []tick) {
	t.Helper()
	for _, tk := range ticks {
		if err := s.Append(tk.t, tk.recs); err != nil {
			t.Fatal(err)
		}
	}
}

// Reads of random windows and steps, from the writer, from a reader and after a reopen, all
// match the model.
func TestReadMatchesModel(t *testing.T) {
	ticks := randomTicks(1, 300, 60)
	dir := t.TempDir()
	opts := Options{Dir: dir, SegmentSpan: 20 * time.Second, Now: func() time.Time { return ticks[len(ticks)-1].t }}
	s, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	appendAll(t, s, ticks)
	if st := s.Status(); st.Segments < 10 || st.JournalBytes <= journalHeader {
		t.Fatalf("want many segments and an open one: %+v", st)
	}
	rd, err := OpenReader(dir)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(2, 2))
	first, last := ticks[0].t, ticks[len(ticks)-1].t
	windows := [][2]time.Time{
		{first.Add(-time.Hour), last.Add(time.Hour)}, // everything
		{first, last},
		{ticks[10].t, ticks[10].t}, // one tick
		{ticks[10].t.Add(time.Nanosecond), ticks[11].t},  // from just after a tick
		{ticks[10].t, ticks[11].t.Add(-time.Nanosecond)}, // to just before one
		{first.Add(-time.Hour), first.Add(-time.Minute)}, // before: late events only
		{last.Add(time.Nanosecond), last.Add(time.Hour)}, // after
		{ticks[19].t, ticks[21].t},                       // across a segment boundary
	}
	for range 16 {
		a, b := rng.IntN(len(ticks)), rng.IntN(len(ticks))
		windows = append(windows, [2]time.Time{ticks[min(a, b)].t.Add(-time.Duration(rng.IntN(2e9))), ticks[max(a, b)].t})
	}
	steps := []time.Duration{0, time.Second, 3 * time.Second, 7500 * time.Millisecond, time.Hour}
	for i, w := range windows {
		for _, step := range steps {
			want := expect(ticks, w[0], w[1], step)
			what := fmt.Sprintf("window %d [%v, %v] step %v", i, w[0].Sub(first), w[1].Sub(first), step)
			same(t, what+" (store)", readAll(t, s, w[0], w[1], step), want)
			same(t, what+" (reader)", readAll(t, rd, w[0], w[1], step), want)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	same(t, "after reopen", readAll(t, s, first, last, 0), expect(ticks, first, last, 0))
}

// A cgroup that sends nothing for a while, a removed pod's or an idle one's, is packed and
// unpacked when it sends again: reads match the model across seals, silences longer than a
// segment, and a reopen in the middle of one.
func TestQuietCgroups(t *testing.T) {
	ticks := randomTicks(4, 300, 60)
	quiet := func(cgroup string, i int) bool {
		var k int
		fmt.Sscanf(cgroup, "/kubepods/pod%d", &k)
		start := 30 + 50*k
		return i >= start && i < start+15+10*k || k == 4 && i >= 250 // pod4 is removed
	}
	for i := range ticks {
		ticks[i].recs = slices.DeleteFunc(ticks[i].recs, func(r rundir.Record) bool {
			return r.Type == rundir.TypeSample && quiet(r.Cgroup, i)
		})
	}
	dir := t.TempDir()
	opts := Options{Dir: dir, SegmentSpan: 20 * time.Second, Now: func() time.Time { return ticks[len(ticks)-1].t }}
	s := open(t, opts)
	packed := 0
	for i, tk := range ticks {
		if i == 140 { // pod2 is quiet, pod1 was
			s.Close()
			s = open(t, opts)
		}
		if err := s.Append(tk.t, tk.recs); err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(s.c.cgs, func(g wcgroup) bool { return g.cold != nil }) {
			packed++
		}
	}
	if packed < 100 {
		t.Fatalf("a cgroup was packed after %d ticks of 300", packed)
	}
	rd, err := OpenReader(dir)
	if err != nil {
		t.Fatal(err)
	}
	first, last := ticks[0].t, ticks[len(ticks)-1].t
	windows := [][2]time.Time{{first, last}, {ticks[299].t, last}}
	for k := range 4 { // each silence, and from its middle on
		start := 30 + 50*k
		windows = append(windows, [2]time.Time{ticks[start-3].t, ticks[start+18+10*k].t}, [2]time.Time{ticks[start+7].t, last})
	}
	for i, w := range windows {
		for _, step := range []time.Duration{0, 3 * time.Second} {
			want := expect(ticks, w[0], w[1], step)
			what := fmt.Sprintf("window %d [%v, %v] step %v", i, w[0].Sub(first), w[1].Sub(first), step)
			same(t, what+" (store)", readAll(t, s, w[0], w[1], step), want)
			same(t, what+" (reader)", readAll(t, rd, w[0], w[1], step), want)
		}
	}
	alive := slices.DeleteFunc(expect(ticks, last, last, 0), func(r rundir.Record) bool { return r.Type != rundir.TypeSample })
	if st, n := s.Status(), len(alive); st.Series != n {
		t.Errorf("%d series followed, want %d", st.Series, n)
	}
}

// A read of some series (ReadSeries) gives what the model gives of those series, events
// whole, from the writer and from a reader.
func TestReadSeriesMatchesModel(t *testing.T) {
	ticks := randomTicks(5, 200, 60)
	dir := t.TempDir()
	s := open(t, Options{Dir: dir, SegmentSpan: 20 * time.Second, Now: func() time.Time { return ticks[len(ticks)-1].t }})
	appendAll(t, s, ticks)
	rd, err := OpenReader(dir)
	if err != nil {
		t.Fatal(err)
	}
	keep := func(cgroup, metric string) bool { return cgroup == "/kubepods/pod1" || metric == "metric_2" }
	kept := make([]tick, len(ticks))
	for i, tk := range ticks {
		kept[i] = tick{t: tk.t, recs: slices.DeleteFunc(slices.Clone(tk.recs), func(r rundir.Record) bool {
			return r.Type == rundir.TypeSample && !keep(r.Cgroup, r.Metric)
		})}
	}
	first, last := ticks[0].t, ticks[len(ticks)-1].t
	for _, w := range [][2]time.Time{{first, last}, {ticks[30].t, ticks[90].t}, {ticks[150].t, last}} {
		for _, step := range []time.Duration{0, 5 * time.Second} {
			want := expect(kept, w[0], w[1], step)
			what := fmt.Sprintf("[%v, %v] step %v", w[0].Sub(first), w[1].Sub(first), step)
			for name, src := range map[string]interface {
				ReadSeries(from, to time.Time, step time.Duration, keep Keep, fn func(rundir.Record) error) error
			}{"store": s, "reader": rd} {
				var got []rundir.Record
				if err := src.ReadSeries(w[0], w[1], step, keep, func(r rundir.Record) error { got = append(got, r); return nil }); err != nil {
					t.Fatal(err)
				}
				same(t, what+" ("+name+")", got, want)
			}
		}
	}
}
