package stress

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/stress/workload"
)

// logPlacement records what a scenario asks of its placement; the real placements are tested
// by the runs they make (cli/nodectl's local runs, testcluster's runs of pods).
type logPlacement struct {
	steps []string
	ws    map[string]Planned
}

func (p *logPlacement) ID() string { return "noisy-20261205-000000-abcdef" }
func (p *logPlacement) CPUs() int  { return 4 }
func (p *logPlacement) Place(_ context.Context, planned []Planned) ([]Planned, error) {
	p.ws = map[string]Planned{}
	for i := range planned {
		planned[i].Target = "/work/" + planned[i].Name
	}
	p.steps = append(p.steps, "place "+strings.Join(names(planned), ","))
	return planned, nil
}
func (p *logPlacement) Start(_ context.Context, ws ...Planned) error {
	for _, w := range ws {
		p.ws[w.Name] = w
	}
	p.steps = append(p.steps, "start "+strings.Join(names(ws), ","))
	return nil
}
func (p *logPlacement) Mark(phase, event string) error {
	p.steps = append(p.steps, "mark "+phase+" "+event)
	return nil
}
func (p *logPlacement) Hold(_ context.Context, phase string, d time.Duration) error {
	p.steps = append(p.steps, fmt.Sprintf("hold %s %s", phase, d))
	return nil
}
func (p *logPlacement) Finish(context.Context) error {
	p.steps = append(p.steps, "finish")
	return nil
}

// Noisy is one sequence on any placement: the probes alone through the baseline, the hogs
// started before the stress phase is marked, each workload's body writing where it was placed.
func TestNoisyOnAPlacement(t *testing.T) {
	cpu, err := ParseHog("cpu,count=2,cpu=1500m")
	if err != nil {
		t.Fatal(err)
	}
	disk, err := ParseHog("disk")
	if err != nil {
		t.Fatal(err)
	}
	p := &logPlacement{}
	cfg := NoisyConfig{Hogs: []HogSpec{cpu, disk}, Heartbeat: time.Second, Baseline: 3 * time.Second, Duration: 5 * time.Second,
		RunOptions: RunOptions{Interval: 2 * time.Second}}
	if err := NoisyOn(context.Background(), cfg, p); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"place victim,heartbeat,cpu-hog-0,cpu-hog-1,disk-hog-0",
		"start victim,heartbeat",
		"hold warm-up 2s",
		"mark baseline start", "hold baseline 3s", "mark baseline end",
		"start cpu-hog-0,cpu-hog-1,disk-hog-0",
		"mark stress start", "hold stress 5s", "mark stress end",
		"finish",
	}
	if !slices.Equal(p.steps, want) {
		t.Errorf("steps:\n got %q\nwant %q", p.steps, want)
	}
	if c, ok := p.ws["cpu-hog-1"].Config.(*workload.CPUHogConfig); !ok || c.Threads != 2 || p.ws["cpu-hog-1"].Limits.CPUMilli != 1500 {
		t.Errorf("cpu-hog-1: %+v", p.ws["cpu-hog-1"])
	}
	if c, ok := p.ws[rundir.WorkloadVictim].Config.(*workload.VictimConfig); !ok || c.Dir != "/work/victim" || c.Interval != 2*time.Second {
		t.Errorf("victim: %+v", p.ws[rundir.WorkloadVictim])
	}
	if c, ok := p.ws["disk-hog-0"].Config.(*workload.DiskHogConfig); !ok || c.Dir != "/work/disk-hog-0" {
		t.Errorf("disk-hog-0: %+v", p.ws["disk-hog-0"])
	}
}

// logWaker is a logPlacement that wakes; its Wake fails at the start named in fail.
type logWaker struct {
	logPlacement
	fail string
}

func (p *logWaker) Wake(_ context.Context, w Planned, timeout time.Duration) error {
	c, _ := w.Config.(*workload.WakeConfig)
	p.steps = append(p.steps, fmt.Sprintf("wake %s %dm %s rounds=%d", w.Name, w.Limits.CPUMilli, timeout, c.BootRounds))
	if w.Name == p.fail {
		return ErrTimeout
	}
	return nil
}

func (p *logWaker) Remove(_ context.Context, w Planned) error {
	p.steps = append(p.steps, "remove "+w.Name)
	return nil
}

// Wake is one sequence on any placement: each start's phase around its wake, the start removed
// before the next, the limits taking turns; a failed wake ends the run there, its start left
// to the placement's cleanup.
func TestWakeOnAPlacement(t *testing.T) {
	cfg := WakeConfig{CPULimits: []int64{50, 1000}, Count: 2}
	p := &logWaker{}
	if err := WakeOn(context.Background(), cfg, p); err != nil {
		t.Fatal(err)
	}
	var want []string
	want = append(want, "place wake-50m-0,wake-1-0,wake-50m-1,wake-1-1")
	for _, s := range []struct {
		name  string
		milli int
	}{{"wake-50m-0", 50}, {"wake-1-0", 1000}, {"wake-50m-1", 50}, {"wake-1-1", 1000}} {
		want = append(want, "mark "+s.name+" start",
			fmt.Sprintf("wake %s %dm %s rounds=%d", s.name, s.milli, DefaultWakeTimeout, workload.DefaultBootRounds),
			"mark "+s.name+" end", "remove "+s.name)
	}
	want = append(want, "finish")
	if !slices.Equal(p.steps, want) {
		t.Errorf("steps:\n got %q\nwant %q", p.steps, want)
	}

	p = &logWaker{fail: "wake-1-0"}
	if err := WakeOn(context.Background(), cfg, p); !errors.Is(err, ErrTimeout) {
		t.Fatalf("WakeOn = %v, want the failed wake's error", err)
	}
	if last := p.steps[len(p.steps)-1]; !strings.HasPrefix(last, "wake wake-1-0") {
		t.Errorf("steps after a failed wake: %q", p.steps)
	}
}
