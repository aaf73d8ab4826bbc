package stress

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/nodectl/nodectl/internal/quantity"

	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/stress/workload"
)

// DensityConfig configures `nodectl stress density`.
type DensityConfig struct {
	Step         int           // sandboxes added per step
	Max          int           // the sweep stops after the step that reaches it
	Pace         time.Duration // between two sandbox launches within a step
	StepDuration time.Duration // how long each step holds its density after its sandboxes are ready
	ReadyTimeout time.Duration // how long a sandbox may take to become ready; 0 = DefaultReadyTimeout

	SandboxMemory int64         // anonymous heap of each sandbox
	HotShare      float64       // share of its heap a sandbox's bursts touch; 0 = workload default
	BinaryBytes   int64         // the shared binary's size; 0 = DefaultBinaryBytes
	Activity      time.Duration // between a sandbox's activity bursts; 0 = workload default
	RequestBytes  int64         // each sandbox's memory request (recorded; the scheduler's view)
	LimitBytes    int64         // each sandbox's memory limit; 0 = none
	// CPURequestMilli and CPULimitMilli are each sandbox's CPU request (its cgroup's weight, as
	// the kubelet sets it; what a scheduler books) and limit (its CFS quota); 0 = none.
	CPURequestMilli int64
	CPULimitMilli   int64

	NodeMemory int64  // memory limit of the run's cgroup, the emulated node; 0 = none
	SwapFile   string // swap file to create and enable for the run, or a swap device to turn on; "" = none
	SwapBytes  int64  // the swap file's size; 0 = SwapFile is a block device formatted with mkswap
	// Swappiness and WatermarkScaleFactor set vm.swappiness and vm.watermark_scale_factor for
	// the run (and the run cgroup's memory.swappiness on v1); -1 leaves them.
	Swappiness           int
	WatermarkScaleFactor int

	Criteria DensityCriteria

	RunOptions
}

// DensityCriteria say when a step has collapsed: the first one crossed ends the sweep. A zero
// bound is off.
type DensityCriteria struct {
	ReadinessP99 time.Duration // a step's sandboxes' readiness p99 above this (or one never ready)
	PSIFull      float64       // memory PSI full of the run's cgroup, share of the step's time
	OOMKill      bool          // any OOM kill in the run's cgroup
	TickGap      time.Duration // a sandbox's tick late by more than this
	// LeaseLate: the node's Lease renewed later than its renew interval by more than this (a
	// run of pods on a Kubernetes node only).
	LeaseLate time.Duration
}

// Defaults of `stress density`.
var DefaultDensityCriteria = DensityCriteria{ReadinessP99: 10 * time.Second, PSIFull: 0.10, OOMKill: true, TickGap: 5 * time.Second, LeaseLate: 3 * time.Second}

const (
	DefaultReadyTimeout = time.Minute
	DefaultBinaryBytes  = 64 << 20
	// hostReserve is what a sweep without --node-memory must leave of the machine's memory.
	hostReserve = 4 << 30
)

// Density runs the density sweep on this host (DensityOn on a local placement): each sandbox a
// process, runc or runsc sandbox in its cgroup below the run's, whose memory limit is the
// emulated node's, recorded by the run's own session. It returns the run directory; the caller
// analyzes it. Everything the run made or changed on the host (cgroups, sandboxes, the swap
// file, sysctls, scratch files) is removed or restored before it returns, also when ctx is
// cancelled or a step fails.
func Density(ctx context.Context, cfg DensityConfig) (dir string, err error) {
	check := func() error {
		if cfg.BinaryBytes == 0 {
			cfg.BinaryBytes = DefaultBinaryBytes
		}
		if err := cfg.check(); err != nil {
			return err
		}
		return checkFits(cfg) // reads the host's memory: once the paths are complete
	}
	return runOnHost(ctx, &cfg.RunOptions, rundir.ScenarioDensity, check, func(host runHost) onHost {
		p := &localSweeper{runHost: host, cfg: cfg}
		return onHost{&p.runHost, func(ctx context.Context) error { return DensityOn(ctx, cfg, p, p.progress) }, p.undo}
	})
}

// check refuses a sweep with no step in it.
func (cfg DensityConfig) check() error {
	if cfg.Step < 1 || cfg.Max < cfg.Step || cfg.SandboxMemory < 1<<20 || cfg.StepDuration <= 0 {
		return errors.New("a density run needs a step of at least 1, a max of at least the step, sandboxes of at least 1Mi and a step duration")
	}
	return nil
}

// Sweeper is a placement that can fill a node with sandboxes: the steps of DensityOn, the
// sweep written once.
type Sweeper interface {
	Placement
	// Describe fills in what the node the sandboxes fill is: its memory, its swap and
	// sysctls, the shared binary's size, its name on a cluster.
	Describe(c *rundir.DensityConfig)
	// Add launches sandbox w with its body's binary, not waiting for it to be ready, records
	// its readiness once it says it is ready, and returns when it was launched.
	Add(ctx context.Context, w Planned) (time.Time, error)
	// Watch reads the sandboxes and the node: which are ready and how long each took, which
	// ended (refused, evicted, OOM-killed), their worst tick since the step began (Mark) and
	// the collapse signals seen in the step (one may come again: the sweep keeps its first).
	// It fails when a sandbox ended for a reason that is no collapse. With full it also reads
	// what is too costly to read at every poll (a pod's measurements).
	Watch(ctx context.Context, full bool) (SweepState, error)
	// Settled marks that the step's sandboxes are up and settled: its pressure window begins.
	Settled(step string) error
	// MemoryFullShare is the node's memory PSI full since the step settled, as a share of the
	// time to to; ok is false where the node has no such reading.
	MemoryFullShare(ctx context.Context, to time.Time) (share float64, ok bool, err error)
	// Note records the sweep's own records: its configuration, the sandbox count, the collapse.
	Note(recs ...rundir.Record) error
}

// SweepState is what a Sweeper saw of its sandboxes and its node in the step under way.
type SweepState struct {
	Ready     map[string]time.Duration // sandbox -> launch to its ready line, once it said it
	Ended     map[string]string        // sandboxes gone for a collapse's reason -> how they ended
	WorstTick float64                  // the worst tick lateness, in seconds, and when it came
	TickAt    time.Time
	// Crossings are the collapse signals seen, bound 0: any is a collapse, but a lateness
	// (rundir.SignalLeaseLate), which the sweep rates against its criterion.
	Crossings []Crossing
}

// Crossing is a collapse criterion crossed, and when it was seen.
type Crossing struct {
	Signal       string
	Value, Bound float64
	At           time.Time
}

// sweepPoll is how often a sweep reads its sandboxes and its node while it waits.
const sweepPoll = 500 * time.Millisecond

// DensityOn runs the density sweep on p, written once for every placement: it adds sandboxes
// in steps until a step collapses (DensityCriteria) or Max is reached, each step a phase
// step-<density>, and records the first criterion crossed as the collapse. line shows
// progress. The caller owns p: it cleans up and analyzes what p wrote.
func DensityOn(ctx context.Context, cfg DensityConfig, p Sweeper, line *LiveLine) error {
	if err := cfg.check(); err != nil {
		return err
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = DefaultReadyTimeout
	}
	if _, err := p.Place(ctx, []Planned{{Workload: rundir.Workload{Name: rundir.WorkloadNode, Kind: rundir.KindNode}}}); err != nil {
		return err
	}
	c := rundir.DensityConfig{Step: cfg.Step, Max: cfg.Max, CPUs: p.CPUs(), SandboxMemoryBytes: cfg.SandboxMemory,
		RequestBytes: cfg.RequestBytes, LimitBytes: cfg.LimitBytes, CPURequestMilli: cfg.CPURequestMilli, CPULimitMilli: cfg.CPULimitMilli,
		Swappiness: -1, WatermarkScaleFactor: -1,
		CriterionReadinessP99: cfg.Criteria.ReadinessP99.Seconds(), CriterionPSIFullShare: cfg.Criteria.PSIFull,
		CriterionOOMKill: cfg.Criteria.OOMKill, CriterionTickGap: cfg.Criteria.TickGap.Seconds()}
	p.Describe(&c)
	if c.Node != "" {
		c.CriterionLeaseLate = cfg.Criteria.LeaseLate.Seconds()
	}
	s := &sweep{cfg: cfg, p: p, line: line, launched: map[string]time.Time{}, told: map[string]bool{}}
	if err := p.Note(c.Record(time.Now()), s.count(time.Now())); err != nil {
		return err
	}
	defer line.Done()
	n := 0
	for n < cfg.Max {
		d := min(n+cfg.Step, cfg.Max)
		c, err := s.step(ctx, n, d)
		if err != nil {
			return err
		}
		n = d
		if c != nil {
			msg := fmt.Sprintf("density %d collapsed: %s %.3g over its bound %.3g", d, c.Signal, c.Value, c.Bound)
			line.Done()
			s.progress(msg)
			if err := p.Note(rundir.Collapse{Density: d, Signal: c.Signal, Value: c.Value, Bound: c.Bound}.Record(c.At, msg)); err != nil {
				return err
			}
			return p.Finish(ctx)
		}
	}
	line.Done()
	s.progress(fmt.Sprintf("no collapse up to %d sandboxes", n))
	return p.Finish(ctx)
}

// sweep is a density sweep under way.
type sweep struct {
	cfg      DensityConfig
	p        Sweeper
	line     *LiveLine
	launched map[string]time.Time
	state    SweepState
	told     map[string]bool // the sandboxes whose end was shown
}

// progress writes a line of its own below the live line.
func (s *sweep) progress(msg string) {
	if s.line.w != nil {
		fmt.Fprintln(s.line.w, msg)
	}
}

// count is the sandbox count sample at t.
func (s *sweep) count(t time.Time) rundir.Record {
	v := float64(len(s.launched))
	return rundir.Record{Type: rundir.TypeSample, Time: t, Metric: rundir.MetricDensitySandboxes, Value: &v}
}

// step brings the density from n to d sandboxes (paced), waits for them to be ready, holds the
// density for StepDuration, and says which collapse criterion it crossed first, if any. A step
// ends early once one is crossed.
func (s *sweep) step(ctx context.Context, n, d int) (*Crossing, error) {
	cfg, crit := s.cfg, s.cfg.Criteria
	name := rundir.StepPhase(d)
	start := time.Now()
	if err := s.p.Mark(name, rundir.EventStart); err != nil {
		return nil, err
	}
	var found []Crossing
	cross := func(c Crossing) {
		if !slices.ContainsFunc(found, func(f Crossing) bool { return f.Signal == c.Signal }) {
			found = append(found, c)
		}
	}
	watch := func(full bool) error {
		st, err := s.p.Watch(ctx, full)
		if err != nil {
			return fmt.Errorf("during %s: %w", name, err)
		}
		s.state = st
		for _, w := range slices.Sorted(maps.Keys(st.Ended)) {
			if !s.told[w] {
				s.told[w] = true
				s.line.Done()
				s.progress(fmt.Sprintf("%s ended: %s", w, st.Ended[w]))
			}
		}
		for _, c := range st.Crossings {
			switch c.Signal {
			case rundir.SignalOOMKill:
				if !crit.OOMKill {
					continue
				}
			case rundir.SignalLeaseLate:
				if crit.LeaseLate <= 0 || c.Value <= crit.LeaseLate.Seconds() {
					continue
				}
				c.Bound = crit.LeaseLate.Seconds()
			}
			cross(c)
		}
		if crit.TickGap > 0 && st.WorstTick > crit.TickGap.Seconds() {
			cross(Crossing{rundir.SignalTickGap, st.WorstTick, crit.TickGap.Seconds(), st.TickAt})
		}
		s.line.Update(fmt.Sprintf("%-10s %5s | %d sandboxes, %d ready, %d ended | worst tick lateness %s", name,
			time.Since(start).Round(time.Second), len(s.launched), len(st.Ready), len(st.Ended), fmtSecs(st.WorstTick)))
		return nil
	}
	crossed := func() bool { return len(found) > 0 }
	// hold waits dur, watching every sweepPoll, until done says so.
	hold := func(dur time.Duration, done func() bool) error {
		end := time.Now().Add(dur)
		for {
			if err := watch(false); err != nil {
				return err
			}
			left := time.Until(end)
			if left <= 0 || done != nil && done() {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%w during %s: %v", ErrInterrupted, name, context.Cause(ctx))
			case <-time.After(min(sweepPoll, left)):
			}
		}
	}
	// Launch this step's sandboxes, paced.
	var names []string
	for i := n; i < d; i++ {
		if i > n && cfg.Pace > 0 {
			if err := hold(cfg.Pace, nil); err != nil {
				return nil, err
			}
		}
		w := planSandbox(cfg, i)
		at, err := s.p.Add(ctx, w)
		if err != nil {
			return nil, err
		}
		s.launched[w.Name] = at
		names = append(names, w.Name)
		if err := s.p.Note(s.count(at)); err != nil {
			return nil, err
		}
	}
	// Wait until they are ready (or ended, or time out), then hold the density.
	allReady := func() bool {
		for _, w := range names {
			if _, ok := s.state.Ready[w]; !ok && s.state.Ended[w] == "" {
				return false
			}
		}
		return true
	}
	readyBy := time.Now().Add(cfg.ReadyTimeout)
	for !allReady() && !crossed() && time.Now().Before(readyBy) {
		if err := hold(sweepPoll, func() bool { return allReady() || crossed() }); err != nil {
			return nil, err
		}
	}
	// Memory pressure counts over the second half of the hold only: a new sandbox's start-up
	// reclaim, and the others faulting back what it pushed out, are the price of density and
	// settle; pressure that stays is the collapse ("past the point of recovery").
	settle := cfg.StepDuration / 2
	if !crossed() {
		if err := hold(settle, crossed); err != nil {
			return nil, err
		}
	}
	if err := s.p.Settled(name); err != nil {
		return nil, err
	}
	if !crossed() {
		if err := hold(cfg.StepDuration-settle, crossed); err != nil {
			return nil, err
		}
	}
	if err := watch(true); err != nil {
		return nil, err
	}
	end := time.Now()
	if crit.ReadinessP99 > 0 {
		var secs []float64
		for _, w := range names {
			if r, ok := s.state.Ready[w]; ok {
				secs = append(secs, r.Seconds())
			} else if s.state.Ended[w] == "" {
				secs = append(secs, end.Sub(s.launched[w]).Seconds()) // never ready: at least this long
			}
		}
		if p99 := p99Of(secs); p99 > crit.ReadinessP99.Seconds() {
			cross(Crossing{rundir.SignalReadiness, p99, crit.ReadinessP99.Seconds(), end})
		}
	}
	if crit.PSIFull > 0 {
		share, ok, err := s.p.MemoryFullShare(ctx, end)
		if err != nil {
			return nil, err
		}
		if ok && share > crit.PSIFull {
			cross(Crossing{rundir.SignalPSIFull, share, crit.PSIFull, end})
		}
	}
	if err := s.p.Mark(name, rundir.EventEnd); err != nil {
		return nil, err
	}
	if len(found) == 0 {
		return nil, nil
	}
	slices.SortStableFunc(found, func(a, b Crossing) int { return a.At.Compare(b.At) })
	return &found[0], nil
}

// planSandbox is sandbox-<i> with the sweep's requests and limits.
func planSandbox(cfg DensityConfig, i int) Planned {
	w := Planned{Workload: rundir.Workload{Name: rundir.SandboxName(i), Kind: rundir.KindSandbox, Memory: quantity.FormatSize(cfg.LimitBytes)},
		Limits:        cgroup.Limits{MemoryBytes: cfg.LimitBytes, CPUMilli: cfg.CPULimitMilli, CPURequestMilli: cfg.CPURequestMilli},
		MemoryRequest: cfg.RequestBytes, Config: sandboxBody(cfg)}
	if cfg.CPULimitMilli > 0 {
		w.CPU = quantity.FormatCPU(cfg.CPULimitMilli)
	}
	if cfg.CPURequestMilli > 0 {
		w.CPURequest = quantity.FormatCPU(cfg.CPURequestMilli)
	}
	return w
}

// sandboxBody is a sandbox's workload; its placement gives it the binary it maps.
func sandboxBody(cfg DensityConfig) *workload.SandboxConfig {
	sandbox := workload.DefaultSandboxConfig()
	sandbox.HeapBytes = cfg.SandboxMemory
	if cfg.HotShare > 0 {
		sandbox.HotShare = cfg.HotShare
	}
	if cfg.Activity > 0 {
		sandbox.Activity = cfg.Activity
	}
	return &sandbox
}

// p99Of is the nearest-rank 99th percentile.
func p99Of(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	i := (99*len(s)+99)/100 - 1
	return s[min(max(i, 0), len(s)-1)]
}
