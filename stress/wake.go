package stress

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nodectl/nodectl/internal/badvalue"
	"github.com/nodectl/nodectl/internal/quantity"

	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/record/sample"
	"github.com/nodectl/nodectl/record/trace"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/stress/launch"
	"github.com/nodectl/nodectl/stress/workload"
)

// WakeConfig configures `nodectl stress wake`.
type WakeConfig struct {
	CPULimits  []int64       // millicores, in the order given (ParseCPULimits)
	Count      int           // starts per limit
	BootRounds int           // size of the sandbox's boot work; 0 = workload.DefaultBootRounds
	Timeout    time.Duration // how long one start may take to answer; 0 = DefaultWakeTimeout

	RunOptions
}

// Defaults of `stress wake`.
const (
	DefaultWakeCount   = 5
	DefaultWakeTimeout = time.Minute
)

// DefaultWakeLimits are the CPU limits a wake run compares when none are given.
var DefaultWakeLimits = []string{"50m", "250m", "1"}

// minWakeCPUMilli is the smallest limit a sandbox can be started at: below it the CFS quota of
// a 100 ms period would be under the kernel's 1 ms minimum.
const minWakeCPUMilli = 10

// wakeRequest is the request pending on the sandbox's standard input from its launch, as a
// request waits for a sleeping sandbox to wake.
const wakeRequest = "wake\n"

// ParseCPULimits parses --cpu-limits values (Kubernetes notation), keeping their order, and
// refuses duplicates and limits below 10m.
func ParseCPULimits(vs []string) ([]int64, error) {
	if len(vs) == 0 {
		return nil, badvalue.Errorf(FieldCPULimits, "", "give at least one CPU limit, e.g. 50m,250m,1")
	}
	var out []int64
	seen := map[int64]string{}
	for _, v := range vs {
		v = strings.TrimSpace(v)
		m, err := quantity.ParseCPU(v)
		if err != nil {
			return nil, badvalue.New(FieldCPULimits, "", err)
		}
		if m < minWakeCPUMilli {
			return nil, badvalue.Errorf(FieldCPULimits, "", "%s is below %s, the smallest CFS quota the kernel takes (1 ms per 100 ms)", v, quantity.FormatCPU(minWakeCPUMilli))
		}
		if prev, ok := seen[m]; ok {
			return nil, badvalue.Errorf(FieldCPULimits, "", "%s and %s are the same limit", prev, v)
		}
		seen[m] = v
		out = append(out, m)
	}
	return out, nil
}

// Wake runs the wake scenario on this host (WakeOn on a local placement): each start in a fresh
// cgroup with its limit, below the run's, by the runtime asked for, recorded by the run's own
// session. It returns the run directory; the caller analyzes it. Everything the run created on
// the host is removed before Wake returns, also when ctx is cancelled (SIGINT, SIGTERM, SIGHUP) or a
// step fails.
func Wake(ctx context.Context, cfg WakeConfig) (dir string, err error) {
	return runOnHost(ctx, &cfg.RunOptions, rundir.ScenarioWake, cfg.check, func(host runHost) onHost {
		p := &localWaker{runHost: host, wakes: map[string][]time.Duration{}}
		return onHost{&p.runHost, func(ctx context.Context) error { return WakeOn(ctx, cfg, p) }, nil}
	})
}

// check refuses a run with nothing to start.
func (cfg WakeConfig) check() error {
	if len(cfg.CPULimits) == 0 || cfg.Count < 1 {
		return errors.New("a wake run needs at least one CPU limit and one start per limit")
	}
	return nil
}

// Waker is a placement that can time a sandbox's wake: the step of the wake scenario (WakeOn)
// that launching a start, awaiting its answer and reading its counters right after make.
type Waker interface {
	Placement
	// Wake launches w with a request pending on it since its launch, waits for the answer (at
	// most timeout, failing with ErrTimeout, or when w ends first), and records the wake time
	// (the launch to the answer, rundir.MetricWake) and w's counters past the answer, leaving
	// w running: the start's phase ends as Wake returns.
	Wake(ctx context.Context, w Planned, timeout time.Duration) error
	// Remove stops w and removes what its start made, before the next start.
	Remove(ctx context.Context, w Planned) error
}

// WakeOn runs the wake scenario on p, written once for every placement: the same sandbox
// started at each CPU limit, Count times each, one start at a time, its limit requested as
// much (a Guaranteed pod's CPU), timing how long it takes to answer the request pending since
// its launch. Each start's boot is a phase named after it, so the analyzer reads each over its
// own boot. The caller owns p: it cleans up and analyzes what p wrote.
func WakeOn(ctx context.Context, cfg WakeConfig, p Waker) error {
	if err := cfg.check(); err != nil {
		return err
	}
	if cfg.BootRounds == 0 {
		cfg.BootRounds = workload.DefaultBootRounds
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultWakeTimeout
	}
	ws, err := p.Place(ctx, planWake(cfg))
	if err != nil {
		return err
	}
	for _, w := range ws {
		if err := p.Mark(w.Name, rundir.EventStart); err != nil {
			return err
		}
		if err := p.Wake(ctx, w, cfg.Timeout); err != nil {
			return err
		}
		if err := p.Mark(w.Name, rundir.EventEnd); err != nil {
			return err
		}
		if err := p.Remove(ctx, w); err != nil {
			return err
		}
	}
	return p.Finish(ctx)
}

// planWake names the starts wake-<limit>-<i>, the limits taking turns so that a slow spell of
// the machine touches every limit alike instead of all the starts of one.
func planWake(cfg WakeConfig) []Planned {
	var out []Planned
	for i := range cfg.Count {
		for _, m := range cfg.CPULimits {
			cpu := quantity.FormatCPU(m)
			out = append(out, Planned{Workload: rundir.Workload{Name: rundir.WakeName(cpu, i), Kind: rundir.KindWake, CPU: cpu, CPURequest: cpu},
				Limits: cgroup.Limits{CPUMilli: m, CPURequestMilli: m}, Config: &workload.WakeConfig{BootRounds: cfg.BootRounds}})
		}
	}
	return out
}

// localWaker starts the wake sandboxes on this host: each start in a fresh cgroup below the
// run's, made just before it, the request on its standard input, and only the start under way
// sampled (a finished one's cgroup has nothing more to say).
type localWaker struct {
	runHost
	starts []rundir.Workload // as meta.json lists them
	cur    *launch.Process   // the start under way

	wakes map[string][]time.Duration // CPU limit -> wake times so far, for the progress line

	mu      sync.Mutex // guards sampled, which the collector reads
	sampled string     // the cgroup of the start under way; "" between starts
}

func (p *localWaker) ID() string { return p.id }

func (p *localWaker) CPUs() int { return runtime.NumCPU() }

// Place gives each start its cgroup below the run's (on the CPUs a tuned partition gives
// sandboxes), makes the run's cgroup and starts the recording: the run-queue tracer, which sees
// a boot, and the sampler of the start under way. No disk matters here.
func (p *localWaker) Place(_ context.Context, planned []Planned) ([]Planned, error) {
	for i := range planned {
		w := &planned[i]
		w.Cgroup = RunCgroup(p.id) + "/" + w.Name
		w.Limits = p.place(&w.Workload, w.Limits)
		p.starts = append(p.starts, w.Workload)
	}
	if err := p.createRunCgroup(cgroup.Limits{}); err != nil {
		return nil, err
	}
	if err := p.newLauncher(); err != nil {
		return nil, err // it names the runtime
	}
	err := p.startRecording(p.opts, p.starts, recordingSpec{cgroups: p.sampledCgroups,
		devices: func() []string { return []string{} }, programs: []string{trace.ProgramRunq}})
	return planned, err
}

// Mark snapshots every source and records the phase's edge at the same time: at a start's end,
// the boot's counters.
func (p *localWaker) Mark(phase, event string) error { return p.mark(phase, event) }

// Finish has nothing left to do: each start noted its host processes at its answer.
func (p *localWaker) Finish(context.Context) error {
	p.progress.Done()
	return nil
}

func (p *localWaker) sampledCgroups() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sampled == "" {
		return nil
	}
	return []string{p.sampled}
}

func (p *localWaker) setSampled(cg string) {
	p.mu.Lock()
	p.sampled = cg
	p.mu.Unlock()
}

// Wake makes the start's cgroup, launches the sandbox with the request on its standard input,
// waits for the answer and records, right after it, the wait of the sandbox's host processes
// for a CPU (schedstat's run_delay) and which processes they are; the cgroup being fresh, the
// counters Mark reads next are the boot's.
func (p *localWaker) Wake(ctx context.Context, w Planned, timeout time.Duration) error {
	if err := p.layout.Create(w.Cgroup, w.Limits); err != nil {
		return fmt.Errorf("creating cgroup of %s: %w", w.Name, err)
	}
	logf, err := p.openLog(w.Name)
	if err != nil {
		return err
	}
	answered := make(chan time.Time, 1)
	onMeasure := func(name string, m workload.Measurement) {
		at := time.Now() // first: the answer's arrival stops the clock
		v := m.Value
		if err := p.writer.Append(rundir.Record{Type: rundir.TypeSample, Time: m.T, Metric: m.Metric, Cgroup: w.Cgroup, Workload: name, Value: &v}); err != nil {
			p.opts.Log.Warn("recording a measurement", "workload", name, "err", err)
		}
		if m.Metric == rundir.MetricWakeBoot {
			select {
			case answered <- at:
			default:
			}
		}
	}
	p.setSampled(w.Cgroup)
	launched := time.Now()
	proc, err := p.launcher.Start(launch.Spec{Name: w.Name, Cgroup: w.Cgroup, Limits: w.Limits, Args: workload.Command{Run: p.id, Config: w.Config}.Args(),
		Stdin: strings.NewReader(wakeRequest), Log: logf}, onMeasure)
	if err != nil {
		return err
	}
	p.cur = proc
	p.procs = append(p.procs, proc) // stopped at cleanup if the run ends before Remove
	at, err := p.await(ctx, w, proc, answered, launched, timeout)
	if err != nil {
		return err
	}
	wake := at.Sub(launched).Seconds()
	recs := []rundir.Record{{Type: rundir.TypeSample, Time: at, Metric: rundir.MetricWake, Cgroup: w.Cgroup, Workload: w.Name, Value: &wake}}
	procs, perr := p.launcher.HostProcesses(w.Cgroup)
	var delay time.Duration
	if perr == nil {
		delay, perr = sample.RunDelay(p.opts.Paths.Procfs, pids(procs))
	}
	if perr != nil {
		p.opts.Log.Warn("reading the run-queue wait of the sandbox's processes", "workload", w.Name, "err", perr)
	} else {
		v := delay.Seconds()
		recs = append(recs, rundir.Record{Type: rundir.TypeSample, Time: time.Now(), Metric: rundir.MetricSchedRunDelay, Cgroup: w.Cgroup, Workload: w.Name, Value: &v})
	}
	if err := p.writer.Append(recs...); err != nil {
		return err
	}
	if i := slices.IndexFunc(p.starts, func(s rundir.Workload) bool { return s.Name == w.Name }); i >= 0 {
		p.starts[i].Runtime, p.starts[i].HostProcesses = string(p.launcher.Runtime()), procs
	}
	p.wakes[w.CPU] = append(p.wakes[w.CPU], at.Sub(launched))
	p.showProgress(w, at.Sub(launched))
	return nil
}

// Remove stops the start's sandbox (its cgroup goes with the run's) and notes in meta.json the
// host processes it ran as, once its boot's counters are read.
func (p *localWaker) Remove(_ context.Context, w Planned) error {
	if p.cur != nil {
		p.cur.Stop(stopGrace)
		p.cur = nil
	}
	p.setSampled("")
	if err := p.writer.UpdateMeta(func(m *rundir.Meta) { m.Workloads = p.starts }); err != nil {
		p.opts.Log.Warn("recording host processes", "workload", w.Name, "err", err)
	}
	return nil
}

// await waits for the sandbox's answer and returns when it arrived, showing progress meanwhile.
func (p *localWaker) await(ctx context.Context, w Planned, proc *launch.Process, answered <-chan time.Time, launched time.Time, timeout time.Duration) (time.Time, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case at := <-answered:
			return at, nil
		case <-proc.Done():
			select {
			case at := <-answered: // it answered, then exited: the answer counts
				return at, nil
			default:
			}
			p.progress.Done()
			return time.Time{}, fmt.Errorf("sandbox %s exited before answering: %v (see %s)", w.Name, proc.Err(), p.logPath(w.Name))
		case <-ctx.Done():
			p.progress.Done()
			return time.Time{}, fmt.Errorf("%w during %s: %v", ErrInterrupted, w.Name, context.Cause(ctx))
		case <-deadline.C:
			p.progress.Done()
			return time.Time{}, badvalue.Errorf(FieldTimeout, timeout.String(), "sandbox %s did not answer in time (see %s)", w.Name, p.logPath(w.Name))
		case <-tick.C:
			p.showProgress(w, time.Since(launched))
		}
	}
}

func pids(procs []rundir.HostProcess) []int {
	out := make([]int, len(procs))
	for i, hp := range procs {
		out[i] = hp.PID
	}
	return out
}

// showProgress shows the start under way, its place in the run, and the median wake of each
// limit so far.
func (p *localWaker) showProgress(w Planned, elapsed time.Duration) {
	var done []string
	for _, s := range p.starts {
		if s.Name != rundir.WakeName(s.CPU, 0) {
			continue // each limit once, in the run's order
		}
		if ws := p.wakes[s.CPU]; len(ws) > 0 {
			sorted := slices.Clone(ws)
			slices.Sort(sorted)
			done = append(done, fmt.Sprintf("%s %s", s.CPU, sorted[(len(sorted)-1)/2].Round(time.Millisecond)))
		}
	}
	n := slices.IndexFunc(p.starts, func(s rundir.Workload) bool { return s.Name == w.Name })
	line := fmt.Sprintf("wake %d/%d %-14s %6s", n+1, len(p.starts), w.Name, elapsed.Round(10*time.Millisecond))
	if len(done) > 0 {
		line += " | p50 " + strings.Join(done, ", ")
	}
	p.progress.Update(line)
}
