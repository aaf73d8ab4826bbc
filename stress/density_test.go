package stress

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/stress/workload"
)

// logSweeper is a logPlacement whose sandboxes are ready as soon as they are added, taking
// readiness each; from the sandbox count crossAt on, each Watch reports the crossings given.
type logSweeper struct {
	logPlacement
	readiness time.Duration
	crossAt   int
	crossings []Crossing
	notes     []rundir.Record
	ready     map[string]time.Duration
}

func (p *logSweeper) Describe(c *rundir.DensityConfig) { c.NodeMemoryBytes = 8 << 30 }

func (p *logSweeper) Add(_ context.Context, w Planned) (time.Time, error) {
	c, _ := w.Config.(*workload.SandboxConfig)
	p.steps = append(p.steps, fmt.Sprintf("add %s heap=%d limit=%d request=%d", w.Name, c.HeapBytes, w.Limits.MemoryBytes, w.MemoryRequest))
	if p.ready == nil {
		p.ready = map[string]time.Duration{}
	}
	p.ready[w.Name] = p.readiness
	return time.Now(), nil
}

func (p *logSweeper) Watch(context.Context, bool) (SweepState, error) {
	st := SweepState{Ready: maps.Clone(p.ready)}
	if len(p.ready) >= p.crossAt {
		st.Crossings = p.crossings
	}
	return st, nil
}

func (p *logSweeper) Settled(step string) error {
	p.steps = append(p.steps, "settled "+step)
	return nil
}

func (p *logSweeper) MemoryFullShare(context.Context, time.Time) (float64, bool, error) {
	return 0.01, true, nil
}

func (p *logSweeper) Note(recs ...rundir.Record) error {
	p.notes = append(p.notes, recs...)
	return nil
}

// collapse is the sweep's collapse record, if it has one.
func (p *logSweeper) collapse() (rundir.Collapse, bool) {
	for _, r := range p.notes {
		if r.Name == rundir.EventCollapse {
			return rundir.ParseCollapse(r), true
		}
	}
	return rundir.Collapse{}, false
}

// A sweep is one sequence on any placement: its node placed and described, sandboxes added a
// step at a time, each step marked around its hold; it stops at the first criterion crossed,
// rated against the sweep's own bounds.
func TestDensityOnAPlacement(t *testing.T) {
	cfg := DensityConfig{Step: 2, Max: 5, SandboxMemory: 16 << 20, LimitBytes: 32 << 20, RequestBytes: 8 << 20, StepDuration: 20 * time.Millisecond,
		Criteria: DefaultDensityCriteria}
	p := &logSweeper{crossAt: 99}
	if err := DensityOn(context.Background(), cfg, p, NewLiveLine(nil, false)); err != nil {
		t.Fatal(err)
	}
	want := []string{"place node"}
	for _, step := range []struct {
		name string
		adds []int
	}{{"step-2", []int{0, 1}}, {"step-4", []int{2, 3}}, {"step-5", []int{4}}} {
		want = append(want, "mark "+step.name+" start")
		for _, i := range step.adds {
			want = append(want, fmt.Sprintf("add sandbox-%d heap=%d limit=%d request=%d", i, 16<<20, 32<<20, 8<<20))
		}
		want = append(want, "settled "+step.name, "mark "+step.name+" end")
	}
	want = append(want, "finish")
	if !slices.Equal(p.steps, want) {
		t.Errorf("steps:\n got %q\nwant %q", p.steps, want)
	}
	if _, ok := p.collapse(); ok {
		t.Errorf("a quiet sweep collapsed: %+v", p.notes)
	}
	config := rundir.ParseDensityConfig(p.notes[0].Labels)
	if p.notes[0].Name != rundir.EventDensityConfig || config.NodeMemoryBytes != 8<<30 || config.CPUs != 4 || config.CriterionLeaseLate != 0 {
		t.Errorf("config %+v: want the node described by the placement, no lease criterion off a cluster", config)
	}

	now := time.Now()
	for name, tc := range map[string]struct {
		crossings []Crossing
		readiness time.Duration
		want      string // the collapse's signal; "" none
		density   int
	}{
		"lease_late_within_its_bound": {crossings: []Crossing{{rundir.SignalLeaseLate, 2, 0, now}}},
		"lease_late_past_its_bound":   {crossings: []Crossing{{rundir.SignalLeaseLate, 4, 0, now}}, want: rundir.SignalLeaseLate, density: 4},
		"first_seen_wins": {crossings: []Crossing{{rundir.SignalEvicted, 1, 0, now.Add(time.Second)}, {rundir.SignalAdmission, 1, 0, now}},
			want: rundir.SignalAdmission, density: 4},
		"slow_readiness": {readiness: time.Minute, want: rundir.SignalReadiness, density: 2},
	} {
		t.Run(name, func(t *testing.T) {
			p := &logSweeper{crossAt: 3, crossings: tc.crossings, readiness: tc.readiness}
			if err := DensityOn(context.Background(), cfg, p, NewLiveLine(nil, false)); err != nil {
				t.Fatal(err)
			}
			c, ok := p.collapse()
			if tc.want == "" {
				if ok {
					t.Errorf("collapsed: %+v", c)
				}
				return
			}
			if !ok || c.Signal != tc.want || c.Density != tc.density {
				t.Errorf("collapse %+v (%v), want %s at %d", c, ok, tc.want, tc.density)
			}
			if last := p.steps[len(p.steps)-1]; last != "finish" || strings.Contains(strings.Join(p.steps, ","), fmt.Sprintf("sandbox-%d", tc.density)) {
				t.Errorf("steps after the collapse: %q", p.steps)
			}
		})
	}
}
