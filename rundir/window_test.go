package rundir

import (
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/nodectl/nodectl/rundir/hist"
)

// openRecords writes recs through a Writer and reads them back.
func openRecords(t *testing.T, meta Meta, recs ...Record) *Run {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "run")
	w, err := Create(dir, meta)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Append(recs...); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	run, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	return run
}

func phase(sec float64, name, event string) Record {
	return Record{Type: TypePhase, Time: at(sec), Name: name, Event: event}
}

func counter(sec float64, metric, cgroup string, v float64, labels ...string) Record {
	r := Record{Type: TypeSample, Time: at(sec), Metric: metric, Cgroup: cgroup, Value: f64(v)}
	for i := 0; i+1 < len(labels); i += 2 {
		if r.Labels == nil {
			r.Labels = map[string]string{}
		}
		r.Labels[labels[i]] = labels[i+1]
	}
	return r
}

func TestPhases(t *testing.T) {
	run := openRecords(t, Meta{Start: at(-1)},
		phase(0, PhaseBaseline, EventStart),
		phase(10, PhaseBaseline, EventEnd),
		phase(10, PhaseStress, EventStart),
		Record{Type: TypeEvent, Time: at(25), Message: "crash soon"},
		phase(3, "ignored", EventEnd), // an end without a start
	)
	want := []Window{
		{Name: PhaseBaseline, Start: at(0), End: at(10)},
		{Name: PhaseStress, Start: at(10), End: at(25)}, // never ended: runs to the last record
	}
	if got := run.Phases(); !reflect.DeepEqual(got, want) {
		t.Errorf("Phases() = %+v, want %+v", got, want)
	}
	if w, ok := run.Phase(PhaseStress); !ok || w.Seconds() != 15 {
		t.Errorf("Phase(stress) = %+v, %v", w, ok)
	}
	if _, ok := run.Phase(PhaseRecovery); ok {
		t.Error("found a recovery phase that was never recorded")
	}
	if got, want := run.Span(), (Window{Name: "run", Start: at(-1), End: at(25)}); !reflect.DeepEqual(got, want) {
		t.Errorf("Span() = %+v, want %+v", got, want)
	}
}

func TestDelta(t *testing.T) {
	// Samples at 2, 4, 6 and 8 s (written out of order); the producer restarted at 8 s.
	run := openRecords(t, Meta{},
		counter(4, MetricCPUUsage, "/a", 30),
		counter(2, MetricCPUUsage, "/a", 10),
		counter(6, MetricCPUUsage, "/a", 70),
		counter(8, MetricCPUUsage, "/a", 5),
	)
	s := run.Series(MetricCPUUsage)
	for name, tc := range map[string]struct {
		start, end float64
		want       float64
	}{
		"before_first_sample":   {start: 0, end: 1, want: 0},
		"from_nothing":          {start: 0, end: 3, want: 10}, // zero before the first sample
		"between_snapshots":     {start: 3, end: 5, want: 20}, // 30 at 4 s minus 10 at 2 s
		"on_sample_times":       {start: 2, end: 6, want: 60}, // at-or-before on both ends
		"after_last":            {start: 9, end: 12, want: 0},
		"across_counter_reset":  {start: 6, end: 8, want: 0},
		"window_inside_one_gap": {start: 4.5, end: 5.5, want: 0},
	} {
		t.Run(name, func(t *testing.T) {
			if got := s.Delta(Window{Start: at(tc.start), End: at(tc.end)}); got != tc.want {
				t.Errorf("Delta = %v, want %v", got, tc.want)
			}
		})
	}
}

// In an agent window the samplers' counters count from before the agent read them: with no
// sample at or before a window's start, Delta starts at the first one in it (a cgroup the
// agent began to follow mid-window is not credited with its whole life); the tracers' count
// from zero, and a stress run's from zero too.
func TestDeltaCountingFromBefore(t *testing.T) {
	recs := []Record{
		counter(4, MetricCPUUsage, "/old", 1000), // CPU time since the cgroup was made
		counter(6, MetricCPUUsage, "/old", 1003),
		counter(4, MetricRunqPreemptWait, "/old", 2, LabelPreemptor, "/hog"), // since the tracer attached
		counter(6, MetricRunqPreemptWait, "/old", 5, LabelPreemptor, "/hog"),
	}
	w := Window{Start: at(0), End: at(6)}
	for scenario, want := range map[string][2]float64{ScenarioAgent: {3, 5}, ScenarioNoisy: {1003, 5}} {
		run := openRecords(t, Meta{Scenario: scenario}, recs...)
		if got := run.Series(MetricCPUUsage).Delta(w); got != want[0] {
			t.Errorf("%s: CPU usage delta %v, want %v", scenario, got, want[0])
		}
		if got := run.Series(MetricRunqPreemptWait).Delta(w); got != want[1] {
			t.Errorf("%s: preemption wait delta %v, want %v", scenario, got, want[1])
		}
		if got := run.Series(MetricCPUUsage).Delta(Window{Start: at(0), End: at(3)}); got != 0 {
			t.Errorf("%s: delta %v over a window before the first sample, want 0", scenario, got)
		}
	}
}

func TestHistDelta(t *testing.T) {
	h := func(slots ...uint64) *hist.Log2 {
		var count, sum uint64
		for i, c := range slots {
			count += c
			sum += c << i
		}
		v := hist.FromSlots(slots, count, sum)
		return &v
	}
	run := openRecords(t, Meta{},
		Record{Type: TypeSample, Time: at(1), Metric: MetricRunqLatency, Cgroup: "/a", Hist: h(1, 2)},
		Record{Type: TypeSample, Time: at(2), Metric: MetricRunqLatency, Cgroup: "/a", Hist: h(1, 5, 4)},
		Record{Type: TypeSample, Time: at(2), Metric: MetricRunqLatency, Cgroup: "/b", Hist: h(0, 0, 0, 8)},
	)
	got := run.Series(MetricRunqLatency).Cgroup("/a").HistDelta(Window{Start: at(1), End: at(3)})
	if want := *h(0, 3, 4); !reflect.DeepEqual(got, want) {
		t.Errorf("HistDelta(/a) = %+v, want %+v", got, want)
	}
	all := run.Series(MetricRunqLatency).HistDelta(Window{Start: at(0), End: at(3)})
	if want := *h(1, 5, 4, 8); !reflect.DeepEqual(all, want) {
		t.Errorf("HistDelta(all) = %+v, want %+v", all, want)
	}
}

func TestSelection(t *testing.T) {
	run := openRecords(t, Meta{},
		counter(1, MetricBlkBytes, "/a", 100, LabelDevice, "254:0", LabelOp, "write"),
		counter(1, MetricBlkBytes, "/a", 10, LabelDevice, "254:0", LabelOp, "read"),
		counter(1, MetricBlkBytes, "/a", 1000, LabelDevice, "8:0", LabelOp, "write"),
		counter(1, MetricBlkBytes, "/b", 7, LabelDevice, "254:0", LabelOp, "write"),
		counter(1, MetricCPUUsage, "/a", 3),
	)
	w := Window{Start: at(0), End: at(2)}
	bytes := run.Series(MetricBlkBytes)
	if got := bytes.Cgroup("/a").Label(LabelDevice, "254:0").Delta(w); got != 110 {
		t.Errorf("/a on 254:0 = %v, want 110", got)
	}
	perCgroup := map[string]float64{}
	for cg, ss := range bytes.Label(LabelDevice, "254:0").ByCgroup() {
		perCgroup[cg] = ss.Delta(w)
	}
	if want := map[string]float64{"/a": 110, "/b": 7}; !reflect.DeepEqual(perCgroup, want) {
		t.Errorf("per cgroup = %v, want %v", perCgroup, want)
	}
	if got := len(bytes.ByLabel(LabelOp)["write"]); got != 3 {
		t.Errorf("write series = %d, want 3", got)
	}
	if got := run.Series("nothing").Delta(w); got != 0 {
		t.Errorf("absent metric delta = %v", got)
	}
	delta := func(ss SeriesSet) float64 { return ss.Delta(w) }
	if got := bytes.Busiest(LabelDevice, delta); got != "8:0" {
		t.Errorf("busiest device = %q, want 8:0", got)
	}
	if got := bytes.CgroupIn("/b", "/c").Busiest(LabelDevice, delta); got != "254:0" {
		t.Errorf("busiest device of /b and /c = %q, want 254:0", got)
	}
	if got := bytes.Busiest(LabelDevice, func(SeriesSet) float64 { return 0 }); got != "" {
		t.Errorf("busiest device when none weighs anything = %q, want none", got)
	}
	if got := bytes.Busiest("missing", delta); got != "" {
		t.Errorf("busiest by a label no series has = %q, want none", got)
	}
}

func TestValues(t *testing.T) {
	run := openRecords(t, Meta{},
		counter(1, MetricProbeFsync, "/v", 0.1),
		counter(2, MetricProbeFsync, "/v", 0.2),
		counter(3, MetricProbeFsync, "/v", 0.3),
		counter(2.5, MetricProbeFsync, "/other", 9),
	)
	// (Start, End]: a reading at the boundary belongs to the window that ends there.
	got := run.Series(MetricProbeFsync).Cgroup("/v").Values(Window{Start: at(1), End: at(3)})
	if want := []float64{0.2, 0.3}; !reflect.DeepEqual(got, want) {
		t.Errorf("Values = %v, want %v", got, want)
	}
	merged := run.Series(MetricProbeFsync).Values(Window{Start: at(0), End: at(time.Minute.Seconds())})
	if want := []float64{0.1, 0.2, 9, 0.3}; !reflect.DeepEqual(merged, want) {
		t.Errorf("merged Values = %v, want %v (time order)", merged, want)
	}
}

// A recording writes a counter only when it changed: the gaps between its samples, less the
// sampling interval, are how long it stood still.
func TestLongestFlat(t *testing.T) {
	t0 := time.Unix(1000, 0)
	s := &Series{}
	for _, tv := range [][2]float64{{0, 1}, {1, 2}, {2, 3}, {9, 4}, {10, 5}} {
		v := tv[1]
		s.Samples = append(s.Samples, Record{Time: t0.Add(time.Duration(tv[0] * float64(time.Second))), Value: &v})
	}
	w := func(from, to float64) Window {
		return Window{Start: t0.Add(time.Duration(from * float64(time.Second))), End: t0.Add(time.Duration(to * float64(time.Second)))}
	}
	for _, c := range []struct {
		w    Window
		want time.Duration
	}{
		{w(0, 10), 6 * time.Second},  // 2 s to 9 s, less the 1 s interval
		{w(0, 2), 0},                 // grew every second
		{w(4, 10), 4 * time.Second},  // from the window's start to 9 s
		{w(9, 15), 4 * time.Second},  // from the last growth (10 s) to the window's end
		{w(20, 30), 9 * time.Second}, // no sample in the window at all
	} {
		if got := s.LongestFlat(c.w, time.Second); got != c.want {
			t.Errorf("LongestFlat(%v..%v) = %v, want %v", c.w.Start.Sub(t0), c.w.End.Sub(t0), got, c.want)
		}
	}
}
