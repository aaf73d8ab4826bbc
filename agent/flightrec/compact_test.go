package flightrec

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

// A churn of 1,500 cgroups, each with a series of a shape of its own, leaves the catalogue's
// tables as small as what stays once their series went idle; the series that stay (busy ones,
// histograms, a cgroup packed while it is quiet) read as the model says before, across and
// after the compaction, from the writer, a reader and after a reopen.
func TestChurnIsCompacted(t *testing.T) {
	const churned, n = 1500, 70
	ticks := make([]tick, n)
	for i := range ticks {
		tk := tick{t: t0.Add(time.Duration(i) * time.Second)}
		for k := range 4 {
			cg := fmt.Sprintf("/kubepods/pod%d", k)
			if k == 3 && i >= 25 && i < 34 { // quiet: packed at 30 while the tables move
				continue
			}
			tk.recs = append(tk.recs,
				rundir.Record{Type: rundir.TypeSample, Metric: "busy", Cgroup: cg, Workload: "wl", Value: fp(float64(i * k))},
				rundir.Record{Type: rundir.TypeSample, Metric: "steady", Cgroup: cg, Labels: map[string]string{"op": "read"}, Value: fp(float64(k))},
				rundir.Record{Type: rundir.TypeSample, Metric: "wait", Cgroup: cg, Hist: &hist.Log2{Buckets: []uint64{uint64(i), uint64(k)}, Count: uint64(i + k), SumNs: uint64(1000 * i)}})
		}
		if i >= 5 && i <= 7 { // the churn: idle from 8 s, left out at the segment of 30 s
			for c := range churned {
				tk.recs = append(tk.recs, rundir.Record{Type: rundir.TypeSample, Metric: "pair", Cgroup: fmt.Sprintf("/churn/c%d", c),
					Labels: map[string]string{"preemptor": fmt.Sprintf("/churn/c%d", (c+1)%churned)}, Value: fp(float64(i))})
			}
		}
		ticks[i] = tk
	}
	dir := t.TempDir()
	opts := Options{Dir: dir, SegmentSpan: 10 * time.Second, SeriesIdle: 15 * time.Second, Now: func() time.Time { return ticks[n-1].t }}
	s := open(t, opts)
	var peak int
	for _, tk := range ticks {
		if err := s.Append(tk.t, tk.recs); err != nil {
			t.Fatal(err)
		}
		peak = max(peak, len(s.c.cgs))
	}
	if c := &s.c; peak < churned || len(c.cgs) > 8 || c.nws > wsPage || len(c.shapes) > 8 || len(c.cgIdx) != 8 {
		t.Errorf("after the churn: %d cgroup slots (peak %d), %d series slots, %d shape slots, %d cgroups indexed; want the 8 left (4 pods, with and without a workload)",
			len(c.cgs), peak, c.nws, len(c.shapes), len(c.cgIdx))
	}
	if st := s.Status(); st.Series != 12 {
		t.Errorf("%d series followed, want 12", st.Series)
	}

	rd, err := OpenReader(dir)
	if err != nil {
		t.Fatal(err)
	}
	stayed := make([]tick, n) // the model without the churn, for windows after it was left out
	for i, tk := range ticks {
		stayed[i] = tick{t: tk.t, recs: slices.DeleteFunc(slices.Clone(tk.recs), func(r rundir.Record) bool { return strings.HasPrefix(r.Cgroup, "/churn/") })}
	}
	at := func(i int) time.Time { return ticks[i].t }
	for _, w := range [][2]int{{0, 25}, {6, 12}, {0, n - 1}, {28, 36}, {30, n - 1}, {33, 41}, {45, 52}} {
		model := ticks // the churned series read until the segment that left them out
		if w[0] >= 30 {
			model = stayed
		}
		for _, step := range []time.Duration{0, 4 * time.Second} {
			want := expect(model, at(w[0]), at(w[1]), step)
			what := fmt.Sprintf("[%d, %d] step %v", w[0], w[1], step)
			same(t, what+" (store)", readAll(t, s, at(w[0]), at(w[1]), step), want)
			same(t, what+" (reader)", readAll(t, rd, at(w[0]), at(w[1]), step), want)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, opts)
	same(t, "after reopen", readAll(t, s, at(40), at(n-1), 0), expect(stayed, at(40), at(n-1), 0))
}
