package recorded

import (
	"errors"
	"testing"
	"time"

	"github.com/nodectl/nodectl/rundir"
)

// ticks is a recorder of one counter at every second, read at the step asked for (the last
// tick at or before to always included), as the flight recorder reads.
type ticks struct{ reads []time.Duration }

func (tk *ticks) Read(from, to time.Time, step time.Duration, fn func(rundir.Record) error) error {
	tk.reads = append(tk.reads, step)
	first := from.Truncate(time.Second)
	if first.Before(from) {
		first = first.Add(time.Second)
	}
	last := to.Truncate(time.Second)
	prev := time.Time{}
	for t := first; !t.After(last); t = t.Add(time.Second) {
		if !prev.IsZero() && t.Sub(prev) < step && !t.Equal(last) {
			continue
		}
		prev = t
		v := float64(t.Unix())
		if err := fn(rundir.Record{Type: rundir.TypeSample, Time: t, Metric: rundir.MetricCPUUsage, Cgroup: "/a", Value: &v}); err != nil {
			return err
		}
	}
	return nil
}

func TestWindowReadsEachPhaseWithinItsTicks(t *testing.T) {
	meta := rundir.Meta{Interval: rundir.Duration(time.Second)}
	w := Window{BaselineFrom: tick(0).Add(500 * time.Millisecond), From: tick(120), To: tick(3720), Cgroup: "/a"}
	src := &ticks{}
	run, err := w.Run(src, meta)
	if err != nil {
		t.Fatal(err)
	}
	// Each phase at most analysisTicks (60): the baseline's two minutes every 2 s, the hour
	// every minute.
	if len(src.reads) != 2 || src.reads[0] != 2*time.Second || src.reads[1] != time.Minute {
		t.Errorf("phases read at steps %v, want 2s then 1m", src.reads)
	}
	phases := map[string]rundir.Window{}
	for _, p := range run.Phases() {
		phases[p.Name] = p
	}
	if b := phases[rundir.PhaseBaseline]; !b.Start.Equal(tick(1)) || !b.End.Equal(tick(120)) {
		t.Errorf("baseline %v to %v, want its first tick to the window's start", b.Start, b.End)
	}
	if wn := phases[rundir.PhaseWindow]; !wn.Start.Equal(tick(120)) || !wn.End.Equal(tick(3720)) {
		t.Errorf("window %v to %v", wn.Start, wn.End)
	}
	// Counters stay exact at the phases' edges whatever the step.
	ss := run.Series(rundir.MetricCPUUsage).Cgroup("/a")
	if got := ss.Delta(phases[rundir.PhaseWindow]); got != 3600 {
		t.Errorf("window delta %v, want 3600", got)
	}
	if got := ss.Delta(phases[rundir.PhaseBaseline]); got != 119 {
		t.Errorf("baseline delta %v, want 119", got)
	}
	if run.Meta.Scenario != rundir.ScenarioAgent || len(run.Meta.Workloads) != 1 || run.Meta.Workloads[0].Kind != rundir.KindObserved {
		t.Errorf("meta %+v", run.Meta)
	}
}

func TestWindowStops(t *testing.T) {
	stop := make(chan struct{})
	close(stop)
	w := Window{BaselineFrom: tick(0), From: tick(60), To: tick(120), Stop: stop}
	if _, err := w.Run(&ticks{}, rundir.Meta{Interval: rundir.Duration(time.Second)}); !errors.Is(err, ErrStopped) {
		t.Errorf("a stopped read returned %v", err)
	}
}

func TestWindowWithNothingRecorded(t *testing.T) {
	w := Window{BaselineFrom: tick(0).Add(100 * time.Millisecond), From: tick(0).Add(200 * time.Millisecond), To: tick(1).Add(500 * time.Millisecond)}
	if _, err := w.Run(&ticks{}, rundir.Meta{Interval: rundir.Duration(time.Second)}); err == nil {
		t.Error("a window with no tick in its baseline was analyzed")
	}
}
