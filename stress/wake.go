package stress

import (
	"context"
	"errors"
	"fmt"
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

// Wake runs the wake scenario: the same sandbox started at each CPU limit, Count times each,
// one start at a time, each in a fresh cgroup with that limit, timing how long the sandbox takes
// to answer the request pending since its launch. It returns the run directory; the caller
// analyzes it. Everything the run created on the host is removed before Wake returns, also when
// ctx is cancelled (SIGINT, SIGTERM) or a step fails.
func Wake(ctx context.Context, cfg WakeConfig) (dir string, err error) {
	if err := cfg.RunOptions.defaults(); err != nil {
		return "", err
	}
	if cfg.BootRounds == 0 {
		cfg.BootRounds = workload.DefaultBootRounds
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultWakeTimeout
	}
	if len(cfg.CPULimits) == 0 || cfg.Count < 1 {
		return "", errors.New("a wake run needs at least one CPU limit and one start per limit")
	}
	host, err := newRunHost(cfg.RunOptions, rundir.ScenarioWake)
	if err != nil {
		return "", err
	}
	r := &wakeRun{runHost: host, cfg: cfg, wakes: map[string][]time.Duration{}}
	return runScenario(ctx, &r.runHost, r)
}

// run starts the sandbox at each limit in turn, one start at a time.
func (r *wakeRun) run(ctx context.Context) error {
	for i, w := range r.workloads {
		if err := r.start(ctx, i, w); err != nil {
			return err
		}
	}
	return nil
}

// undo has nothing to do: a wake run makes nothing the skeleton does not remove.
func (r *wakeRun) undo() []error { return nil }

type wakeRun struct {
	runHost
	cfg       WakeConfig
	workloads []rundir.Workload // the starts, in the order they run
	limits    map[string]int64  // start name -> its CPU limit in millicores

	wakes map[string][]time.Duration // CPU limit -> wake times so far, for the progress line

	mu      sync.Mutex // guards sampled, which the collector reads
	sampled string     // the cgroup of the start under way; "" between starts
}

func (r *wakeRun) setup(context.Context) error {
	cfg := r.cfg
	r.plan()
	if err := r.createRunCgroup(cgroup.Limits{}); err != nil {
		return err
	}
	if err := r.newLauncher(); err != nil {
		return err // it names the runtime
	}
	// Only the start under way is sampled: a finished sandbox's cgroup has nothing more to say,
	// and its counters are read at its answer. No disk matters here.
	// The run-queue tracer is the one that sees a boot; fsync and block I/O have nothing to say.
	return r.startRecording(cfg.RunOptions, r.workloads, recordingSpec{cgroups: r.sampledCgroups,
		devices: func() []string { return []string{} }, programs: []string{trace.ProgramRunq}})
}

// plan names the starts: wake-<limit>-<i>, the limits taking turns so that a slow spell of
// the machine touches every limit alike instead of all the starts of one.
func (r *wakeRun) plan() {
	r.limits = map[string]int64{}
	for i := range r.cfg.Count {
		for _, m := range r.cfg.CPULimits {
			cpu := quantity.FormatCPU(m)
			name := rundir.WakeName(cpu, i)
			r.workloads = append(r.workloads, rundir.Workload{Name: name, Kind: rundir.KindWake, Cgroup: RunCgroup(r.id) + "/" + name, CPU: cpu, CPURequest: cpu})
			r.limits[name] = m
		}
	}
}

func (r *wakeRun) sampledCgroups() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sampled == "" {
		return nil
	}
	return []string{r.sampled}
}

func (r *wakeRun) setSampled(cg string) {
	r.mu.Lock()
	r.sampled = cg
	r.mu.Unlock()
}

// start runs one start of the sandbox: a fresh cgroup with the limit, the launch with the
// request pending, the wait for the answer, and right after it the boot's counters. Its boot is
// a phase named after it, so the analyzer reads each start over its own boot.
func (r *wakeRun) start(ctx context.Context, n int, w rundir.Workload) error {
	// Requested as much as the limit, as a Guaranteed pod is: the kubelet's weight for it.
	limits := r.place(&r.workloads[n], cgroup.Limits{CPUMilli: r.limits[w.Name], CPURequestMilli: r.limits[w.Name]})
	if err := r.layout.Create(w.Cgroup, limits); err != nil {
		return fmt.Errorf("creating cgroup of %s: %w", w.Name, err)
	}
	logf, err := r.openLog(w.Name)
	if err != nil {
		return err
	}

	answered := make(chan time.Time, 1)
	onMeasure := func(name string, m workload.Measurement) {
		at := time.Now() // first: the answer's arrival stops the clock
		v := m.Value
		if err := r.writer.Append(rundir.Record{Type: rundir.TypeSample, Time: m.T, Metric: m.Metric, Cgroup: w.Cgroup, Workload: name, Value: &v}); err != nil {
			r.cfg.Log.Warn("recording a measurement", "workload", name, "err", err)
		}
		if m.Metric == rundir.MetricWakeBoot {
			select {
			case answered <- at:
			default:
			}
		}
	}
	r.setSampled(w.Cgroup)
	defer r.setSampled("")
	if err := r.writer.Append(rundir.Record{Type: rundir.TypePhase, Time: time.Now(), Name: w.Name, Event: rundir.EventStart}); err != nil {
		return err
	}
	args := workload.Command{Run: r.id, Config: &workload.WakeConfig{BootRounds: r.cfg.BootRounds}}.Args()
	launched := time.Now()
	p, err := r.launcher.Start(launch.Spec{Name: w.Name, Cgroup: w.Cgroup, Limits: limits, Args: args,
		Stdin: strings.NewReader(wakeRequest), Log: logf}, onMeasure)
	if err != nil {
		return err
	}
	defer p.Stop(stopGrace)
	at, err := r.await(ctx, n, w, p, answered, launched)
	if err != nil {
		return err
	}

	// The cgroup is fresh, so its counters now are the boot's: read them before the sandbox
	// does anything else, and end the boot's phase at the snapshot.
	wake := at.Sub(launched).Seconds()
	recs := []rundir.Record{{Type: rundir.TypeSample, Time: at, Metric: rundir.MetricWake, Cgroup: w.Cgroup, Workload: w.Name, Value: &wake}}
	procs, perr := r.launcher.HostProcesses(w.Cgroup)
	var delay time.Duration
	if perr == nil {
		delay, perr = sample.RunDelay(r.cfg.Paths.Procfs, pids(procs))
	}
	now := time.Now()
	if err := r.session.Snapshot(now); err != nil {
		return err
	}
	if perr != nil {
		r.cfg.Log.Warn("reading the run-queue wait of the sandbox's processes", "workload", w.Name, "err", perr)
	} else {
		v := delay.Seconds()
		recs = append(recs, rundir.Record{Type: rundir.TypeSample, Time: now, Metric: rundir.MetricSchedRunDelay, Cgroup: w.Cgroup, Workload: w.Name, Value: &v})
	}
	recs = append(recs, rundir.Record{Type: rundir.TypePhase, Time: now, Name: w.Name, Event: rundir.EventEnd})
	if err := r.writer.Append(recs...); err != nil {
		return err
	}
	r.workloads[n].Runtime, r.workloads[n].HostProcesses = string(r.launcher.Runtime()), procs
	if err := r.writer.UpdateMeta(func(m *rundir.Meta) { m.Workloads = r.workloads }); err != nil {
		r.cfg.Log.Warn("recording host processes", "workload", w.Name, "err", err)
	}
	r.wakes[w.CPU] = append(r.wakes[w.CPU], at.Sub(launched))
	return nil
}

// await waits for the sandbox's answer and returns when it arrived, showing progress meanwhile.
func (r *wakeRun) await(ctx context.Context, n int, w rundir.Workload, p *launch.Process, answered <-chan time.Time, launched time.Time) (time.Time, error) {
	timeout := time.NewTimer(r.cfg.Timeout)
	defer timeout.Stop()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case at := <-answered:
			r.showProgress(n, w, at.Sub(launched))
			return at, nil
		case <-p.Done():
			select {
			case at := <-answered: // it answered, then exited: the answer counts
				return at, nil
			default:
			}
			r.progress.Done()
			return time.Time{}, fmt.Errorf("sandbox %s exited before answering: %v (see %s)", w.Name, p.Err(), r.logPath(w.Name))
		case <-ctx.Done():
			r.progress.Done()
			return time.Time{}, fmt.Errorf("%w during %s: %v", ErrInterrupted, w.Name, context.Cause(ctx))
		case <-timeout.C:
			r.progress.Done()
			return time.Time{}, badvalue.Errorf(FieldTimeout, r.cfg.Timeout.String(), "sandbox %s did not answer in time (see %s)", w.Name, r.logPath(w.Name))
		case <-tick.C:
			r.showProgress(n, w, time.Since(launched))
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

func (r *wakeRun) showProgress(n int, w rundir.Workload, elapsed time.Duration) {
	var done []string
	for _, m := range r.cfg.CPULimits {
		cpu := quantity.FormatCPU(m)
		if ws := r.wakes[cpu]; len(ws) > 0 {
			s := slices.Clone(ws)
			slices.Sort(s)
			done = append(done, fmt.Sprintf("%s %s", cpu, s[(len(s)-1)/2].Round(time.Millisecond)))
		}
	}
	line := fmt.Sprintf("wake %d/%d %-14s %6s", n+1, len(r.workloads), w.Name, elapsed.Round(10*time.Millisecond))
	if len(done) > 0 {
		line += " | p50 " + strings.Join(done, ", ")
	}
	r.progress.Update(line)
}

// cleanup stops the recording and removes the cgroups and the run's state. It runs on every
// exit path; the sandbox under way was stopped by its start.
