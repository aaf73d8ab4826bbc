package stress

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nodectl/nodectl/internal/badvalue"
	"github.com/nodectl/nodectl/internal/quantity"

	"github.com/nodectl/nodectl/host/blockdev"
	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/record/trace"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/stress/launch"
	"github.com/nodectl/nodectl/stress/workload"
)

// NoisyConfig configures `nodectl stress noisy`.
type NoisyConfig struct {
	Hogs           []HogSpec
	VictimCPUMilli int64         // 0 = unlimited
	VictimMemBytes int64         // 0 = unlimited
	Heartbeat      time.Duration // period of the heartbeat probe in the system cgroup; 0 = none
	Daemons        []string      // comm names of host daemons to follow (host/daemons); none when empty
	Baseline       time.Duration
	Duration       time.Duration

	// VictimWorkRounds and VictimWriteBytes size the probe's fixed work; 0 means
	// workload.DefaultWorkRounds and workload.DefaultWriteBytes.
	VictimWorkRounds int
	VictimWriteBytes int64

	// VictimCPURequestMilli sets the victim cgroup's CPU weight (see CPURequest); 0 = the
	// kernel's default.
	VictimCPURequestMilli int64

	// NodeMemBytes limits the run's cgroup, above every workload's, as a node's memory bounds its
	// pods: a neighbour that grows there presses the others into reclaim. 0 = unlimited.
	NodeMemBytes int64

	RunOptions
}

func isProbe(kind string) bool { return kind == rundir.KindVictim || kind == rundir.KindHeartbeat }

// Noisy runs the noisy-neighbour scenario: the victim probe alone (baseline), then with the
// hogs (stress). It returns the run directory, which holds everything recorded; the caller
// analyzes it. Everything the run created on the host is removed before Noisy returns, also
// when ctx is cancelled (SIGINT, SIGTERM) or a step fails.
func Noisy(ctx context.Context, cfg NoisyConfig) (dir string, err error) {
	if err := cfg.RunOptions.defaults(); err != nil {
		return "", err
	}
	if cfg.Baseline <= 0 || cfg.Duration <= 0 {
		return "", errors.New("the baseline and stress phases must last longer than zero")
	}
	if cfg.VictimWorkRounds == 0 {
		cfg.VictimWorkRounds = workload.DefaultWorkRounds
	}
	if cfg.VictimWriteBytes == 0 {
		cfg.VictimWriteBytes = workload.DefaultWriteBytes
	}
	host, err := newRunHost(cfg.RunOptions, rundir.ScenarioNoisy)
	if err != nil {
		return "", err
	}
	r := &noisyRun{runHost: host, cfg: cfg, last: map[string]float64{}}
	return runScenario(ctx, &r.runHost, r)
}

type noisyRun struct {
	runHost
	cfg NoisyConfig

	resolver  *cgroup.Resolver // the tracer's; nil untraced
	workloads []rundir.Workload
	specs     map[string]HogSpec       // hog workload name -> the --hog it came from
	limits    map[string]cgroup.Limits // workload name -> its cgroup's limits
	local     *launch.Launcher         // the heartbeat's: a plain process, as a host daemon is; runHost.launcher runs the victim and the hogs

	mu       sync.Mutex
	last     map[string]float64 // latest probe values, for the progress line
	curPhase string
	phaseEnd time.Time
}

func (r *noisyRun) setup(context.Context) error {
	cfg := r.cfg
	if err := r.planWorkloads(); err != nil {
		return err
	}
	if err := r.createRunCgroup(cgroup.Limits{MemoryBytes: cfg.NodeMemBytes}); err != nil {
		return err
	}
	for i, w := range r.workloads {
		if !owned(w) {
			continue // the host's cgroup: never created, limited or removed here
		}
		r.limits[w.Name] = r.place(&r.workloads[i], r.limits[w.Name])
		if err := r.layout.Create(w.Cgroup, r.limits[w.Name]); err != nil {
			return fmt.Errorf("creating cgroup of %s: %w", w.Name, err)
		}
	}

	if err := r.newLaunchers(); err != nil {
		return err
	}
	if cfg.Trace {
		// Kept for the churn hog: its sandboxes' cgroups may come and go between collections.
		r.resolver = cgroup.NewResolver(r.layout)
	}
	return r.startRecording(cfg.RunOptions, r.workloads, recordingSpec{cgroups: r.cgroupPaths, devices: r.devices, resolver: r.resolver})
}

// planWorkloads names the victim and every hog and decides their cgroups, limits and targets.
func (r *noisyRun) planWorkloads() error {
	cfg := r.cfg
	base := RunCgroup(r.id)
	victim := rundir.Workload{Name: rundir.WorkloadVictim, Kind: rundir.KindVictim, Cgroup: base + "/" + rundir.WorkloadVictim,
		CPU: quantity.FormatCPU(cfg.VictimCPUMilli), CPURequest: quantity.FormatCPU(cfg.VictimCPURequestMilli), Memory: quantity.FormatSize(cfg.VictimMemBytes),
		Target: filepath.Join(r.scratch, rundir.WorkloadVictim)}
	// The victim and the hogs without a target= write below the scratch directory.
	scratchDev, err := blockdev.ForPath(cfg.Paths.Sysfs, cfg.Paths.Scratch)
	if err != nil {
		cfg.Log.Warn("no block device behind the scratch directory", "err", err)
	}
	victim.Device = scratchDev
	r.workloads = []rundir.Workload{victim}
	r.limits = map[string]cgroup.Limits{victim.Name: {CPUMilli: cfg.VictimCPUMilli, CPURequestMilli: cfg.VictimCPURequestMilli, MemoryBytes: cfg.VictimMemBytes}}
	if cfg.Heartbeat > 0 {
		// The heartbeat stands in for a node daemon, so it lives where those do: a system cgroup
		// beside the workloads, as the kubelet's system slice is beside the pods.
		hb := rundir.Workload{Name: rundir.WorkloadHeartbeat, Kind: rundir.KindHeartbeat, Cgroup: base + "/" + rundir.CgroupHeartbeat, Period: rundir.Duration(cfg.Heartbeat)}
		r.workloads = append(r.workloads, hb)
	}
	seen := map[string]int{}
	r.specs = map[string]HogSpec{}
	for _, h := range cfg.Hogs {
		for range h.Count {
			i := seen[h.Kind]
			seen[h.Kind]++
			name := rundir.HogName(h.Kind, i)
			w := rundir.Workload{Name: name, Kind: h.Kind, Cgroup: base + "/" + name,
				CPU: quantity.FormatCPU(h.CPUMilli), CPURequest: quantity.FormatCPU(h.CPURequestMilli), Memory: quantity.FormatSize(h.MemBytes)}
			if h.Kind == rundir.KindDisk || h.Kind == rundir.KindFsync {
				w.Target, w.Device = filepath.Join(r.scratch, name), scratchDev
				if h.Target != "" {
					dir, err := TargetDir(cfg.Paths, r.id, h.Target)
					if err != nil {
						return err
					}
					w.Target = filepath.Join(dir, name)
					if w.Device, err = blockdev.ForPath(cfg.Paths.Sysfs, h.Target); err != nil {
						return badvalue.Errorf(FieldHogs, strconv.Quote(h.raw), "target=%s: %w", h.Target, err)
					}
				}
			}
			if h.Kind == rundir.KindMemory && memoryHogBytes(h.MemBytes, cfg.Runtime) < h.MemBytes/4 {
				return badvalue.Errorf(FieldHogs, strconv.Quote(h.raw), "memory=%s leaves too little for the hog in a gVisor sandbox, whose limit also holds the Sentry (~%s): give at least %s",
					quantity.FormatSize(h.MemBytes), quantity.FormatSize(sentryReserve), quantity.FormatSize(2*sentryReserve))
			}
			r.workloads = append(r.workloads, w)
			r.specs[name] = h
			r.limits[name] = cgroup.Limits{CPUMilli: h.CPUMilli, CPURequestMilli: h.CPURequestMilli, MemoryBytes: h.MemBytes}
		}
	}
	daemons, err := r.daemonWorkloads()
	if err != nil {
		return err
	}
	r.workloads = append(r.workloads, daemons...)
	return nil
}

// warnUnattached says which BPF programs did not attach and why: the run goes on without them,
// and the analyzer has less evidence.
func warnUnattached(log *slog.Logger, status map[string]string) {
	for _, p := range slices.Sorted(maps.Keys(status)) {
		if status[p] != trace.StatusAttached {
			log.Warn("tracer program not attached; the run continues without it", "program", p, "reason", status[p])
		}
	}
}

func (r *noisyRun) cgroupPaths() []string {
	paths := make([]string, 0, len(r.workloads))
	for _, w := range r.workloads {
		paths = append(paths, w.Cgroup)
	}
	return paths
}

func (r *noisyRun) devices() []string {
	var devs []string
	for _, w := range r.workloads {
		if w.Device != "" && !slices.Contains(devs, w.Device) {
			devs = append(devs, w.Device)
		}
	}
	return devs
}

// run runs baseline then stress, marking each in the records with a snapshot at its edges.
func (r *noisyRun) run(ctx context.Context) error {
	// The probes run in both phases, the hogs only in the stress phase.
	startAll := func(probes bool) error {
		for _, w := range r.workloads {
			if owned(w) && isProbe(w.Kind) == probes {
				if err := r.start(w, r.config(w)); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := startAll(true); err != nil {
		return err
	}
	// Let the probes finish one iteration before the baseline counts, so start-up is not in it.
	if err := r.waitPhase(ctx, "warm-up", r.cfg.Interval); err != nil {
		return err
	}
	if err := r.phase(ctx, rundir.PhaseBaseline, r.cfg.Baseline, nil); err != nil {
		return err
	}
	return r.phase(ctx, rundir.PhaseStress, r.cfg.Duration, func() error { return startAll(false) })
}

// sentryReserve is what a gVisor sandbox's own memory takes of its cgroup's limit besides the
// application's: the Sentry and the gofer. Measured here: ~20 MiB steady, more while booting.
const sentryReserve = 64 << 20

// hogReserve is what a memory hog's own process takes of its cgroup's limit besides what it
// holds: the Go runtime and the packages' init, page tables and kernel memory. Measured: a hog
// holding 60 MiB under 64 MiB was OOM-killed at 63.9 MiB of anonymous memory (2026-12-02).
const hogReserve = 12 << 20

// memoryHogBytes is what a memory hog with limit size holds: a sixteenth under the limit, at
// least hogReserve, and under runsc also the Sentry's share, since the sandbox's cgroup holds
// the Sentry too.
func memoryHogBytes(size int64, rt launch.Runtime) int64 {
	n := size - max(size/16, hogReserve)
	if rt == launch.RuntimeRunsc {
		n -= sentryReserve
	}
	return n
}

// newLaunchers prepares the runtime that runs the victim and the hogs, and the plain-process one
// that runs the heartbeat.
func (r *noisyRun) newLaunchers() error {
	var err error
	r.local, err = launch.New(launch.Config{Exe: r.cfg.Exe, Cgroups: r.layout, Procfs: r.cfg.Paths.Procfs, Log: r.cfg.Log})
	if err != nil {
		return err
	}
	return r.newLauncher()
}

// launcherOf is the launcher that started w: the heartbeat's own, else the run's; nil for a
// daemon of the host, which the run did not start.
func (r *noisyRun) launcherOf(w rundir.Workload) *launch.Launcher {
	switch {
	case !owned(w):
		return nil
	case w.Kind == rundir.KindHeartbeat:
		return r.local
	}
	return r.launcher
}

// phase marks a phase start, runs before (starting its workloads), waits d, and marks its end.
func (r *noisyRun) phase(ctx context.Context, name string, d time.Duration, before func() error) error {
	if err := r.mark(name, rundir.EventStart); err != nil {
		return err
	}
	if before != nil {
		if err := before(); err != nil {
			return err
		}
	}
	if err := r.waitPhase(ctx, name, d); err != nil {
		return err
	}
	if name == rundir.PhaseStress {
		// While every workload runs: which host processes run each one.
		r.noteHostProcesses(r.workloads, r.launcherOf)
	}
	return r.mark(name, rundir.EventEnd)
}

// waitPhase lets d pass in phase while showing progress; it fails when ctx is cancelled or a
// workload died.
func (r *noisyRun) waitPhase(ctx context.Context, phase string, d time.Duration) error {
	r.mu.Lock()
	r.curPhase, r.phaseEnd = phase, time.Now().Add(d)
	r.mu.Unlock()
	err := r.wait(ctx, phase, d, func(time.Time) (bool, error) {
		r.showProgress()
		return false, r.exited()
	})
	if err == nil {
		r.showProgress()
	}
	return err
}

func (r *noisyRun) showProgress() {
	r.mu.Lock()
	defer r.mu.Unlock()
	left := max(0, time.Until(r.phaseEnd).Round(time.Second))
	line := fmt.Sprintf("%-8s %4s left | %d workloads | victim cpu-work %s  write+fsync %s",
		r.curPhase, left, len(r.procs), fmtSecs(r.last[rundir.MetricProbeCPUWork]),
		fmtSecs(r.last[rundir.MetricProbeWrite]+r.last[rundir.MetricProbeFsync]))
	r.progress.Update(line)
}

func fmtSecs(s float64) string {
	if s == 0 {
		return "-"
	}
	return time.Duration(s * float64(time.Second)).Round(time.Millisecond).String()
}

// start launches a workload in its cgroup; its measurements become samples of the run.
func (r *noisyRun) start(w rundir.Workload, cfg workload.Config) error {
	logf, err := r.openLog(w.Name)
	if err != nil {
		return err
	}
	onMeasure := func(name string, m workload.Measurement) {
		v := m.Value
		rec := rundir.Record{Type: rundir.TypeSample, Time: m.T, Metric: m.Metric, Cgroup: w.Cgroup, Workload: name, Value: &v}
		if err := r.writer.Append(rec); err != nil {
			r.cfg.Log.Warn("recording a measurement", "workload", name, "err", err)
		}
		r.mu.Lock()
		r.last[m.Metric] = m.Value
		r.mu.Unlock()
	}
	l := r.launcher
	if w.Kind == rundir.KindHeartbeat {
		l = r.local
	}
	var mounts []string
	if w.Target != "" {
		mounts = []string{w.Target}
	}
	if w.Kind == rundir.KindChurn && l.Runtime() != launch.RuntimeProcess {
		// Under a container runtime, churn is of sandboxes: their start-up is the load.
		c := &sandboxChurn{name: w.Name, cgroup: w.Cgroup, parallel: threadsFor(r.specs[w.Name], runtime.NumCPU()),
			launcher: l, layout: r.layout, log: logf, onMeasure: onMeasure, resolver: r.resolver}
		r.procs = append(r.procs, launch.Go(w.Name, c.run))
		return nil
	}
	p, err := l.Start(launch.Spec{Name: w.Name, Cgroup: w.Cgroup, Limits: r.limits[w.Name], Args: workload.Command{Run: r.id, Config: cfg}.Args(), Mounts: mounts, Log: logf}, onMeasure)
	if err != nil {
		return err
	}
	r.procs = append(r.procs, p)
	return nil
}

// config is the workload that runs w.
func (r *noisyRun) config(w rundir.Workload) workload.Config {
	return NoisyWorkload(r.cfg, w.Kind, r.specs[w.Name], w.Target, runtime.NumCPU())
}

// NoisyWorkload is the body of a noisy run's workload of kind (its hog spec, for a hog),
// writing below dir, on a node of ncpu CPUs; nil for an unknown kind.
func NoisyWorkload(cfg NoisyConfig, kind string, spec HogSpec, dir string, ncpu int) workload.Config {
	switch kind {
	case rundir.KindVictim:
		return &workload.VictimConfig{Dir: dir, Interval: cfg.Interval, WorkRounds: cfg.VictimWorkRounds, WriteBytes: cfg.VictimWriteBytes}
	case rundir.KindHeartbeat:
		return &workload.HeartbeatConfig{Period: cfg.Heartbeat}
	case rundir.KindCPU:
		return &workload.CPUHogConfig{Threads: threadsFor(spec, ncpu)}
	case rundir.KindDisk:
		return &workload.DiskHogConfig{Dir: dir, FileBytes: workload.DefaultDiskHogFileBytes}
	case rundir.KindFsync:
		return &workload.FsyncHogConfig{Dir: dir, BlockBytes: workload.DefaultFsyncHogBlockBytes}
	case rundir.KindChurn:
		return &workload.ChurnConfig{Parallel: threadsFor(spec, ncpu)}
	case rundir.KindMemory:
		// Stay under the limit: the hog is to hold memory, not to be OOM-killed.
		return &workload.MemoryHogConfig{Bytes: memoryHogBytes(spec.MemBytes, cfg.Runtime)}
	}
	return nil
}

// undo removes what the run made inside the user's target directories.
func (r *noisyRun) undo() []error {
	var errs []error
	for _, w := range r.workloads {
		if w.Target != "" && !isUnder(w.Target, r.scratch) {
			if err := os.RemoveAll(filepath.Dir(w.Target)); err != nil {
				errs = append(errs, fmt.Errorf("removing files of %s: %w", w.Name, err))
			}
		}
	}
	return errs
}

func isUnder(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}
