package stress

import (
	"context"
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

// localPlacement runs a scenario's workloads on this host: each in a cgroup below the run's, by
// the runtime asked for (a plain process, runc or runsc), the heartbeat as a plain process as a
// host daemon is, recorded by the run's own session into its run directory as they go. The run
// skeleton (runHost) removes what it made on every exit path.
type localPlacement struct {
	runHost
	nodeMemBytes int64    // the run's cgroup's memory limit: the node's memory, as its pods see it
	daemons      []string // comm names of host daemons to follow

	resolver  *cgroup.Resolver // the tracer's; nil untraced
	workloads []Planned
	local     *launch.Launcher // the heartbeat's: a plain process, as a host daemon is; runHost.launcher runs the rest

	mu       sync.Mutex
	last     map[string]float64 // latest probe values, for the progress line
	curPhase string
	phaseEnd time.Time
}

// onHost is a scenario as it runs on this host: on the run's skeleton (host), the scenario run
// on its local placement, and what only that placement made, removed at cleanup (nil: nothing).
type onHost struct {
	host     *runHost
	scenario func(ctx context.Context) error
	clean    func() []error
}

func (s onHost) setup(context.Context) error   { return nil } // Place does, once planned
func (s onHost) run(ctx context.Context) error { return s.scenario(ctx) }
func (s onHost) undo() []error {
	if s.clean == nil {
		return nil
	}
	return s.clean()
}

// runOnHost runs a scenario on this host: o completed, the scenario's own checks, a run of
// scenario named, and what place makes of its skeleton run and cleaned up on every path. It
// returns the run directory.
func runOnHost(ctx context.Context, o *RunOptions, scenario string, check func() error, place func(runHost) onHost) (string, error) {
	if err := o.defaults(); err != nil {
		return "", err
	}
	if err := check(); err != nil {
		return "", err
	}
	host, err := newRunHost(*o, scenario)
	if err != nil {
		return "", err
	}
	s := place(host)
	return runScenario(ctx, s.host, s)
}

func (p *localPlacement) ID() string { return p.id }

func (p *localPlacement) CPUs() int { return runtime.NumCPU() }

// Place gives each workload its cgroup below the run's (limited as planned, on the CPUs a tuned
// partition gives its kind), a directory below the scratch directory or the hog's target=,
// follows the daemons asked for, and starts the recording.
func (p *localPlacement) Place(_ context.Context, planned []Planned) ([]Planned, error) {
	o := p.opts
	base := RunCgroup(p.id)
	// The victim and the hogs without a target= write below the scratch directory.
	scratchDev, err := blockdev.ForPath(o.Paths.Sysfs, o.Paths.Scratch)
	if err != nil {
		o.Log.Warn("no block device behind the scratch directory", "err", err)
	}
	for i := range planned {
		w := &planned[i]
		w.Cgroup = base + "/" + w.Name
		switch w.Kind {
		case rundir.KindHeartbeat:
			// The heartbeat stands in for a node daemon, so it lives where those do: a system
			// cgroup beside the workloads, as the kubelet's system slice is beside the pods.
			w.Cgroup = base + "/" + rundir.CgroupHeartbeat
		case rundir.KindVictim:
			w.Target, w.Device = filepath.Join(p.scratch, w.Name), scratchDev
		case rundir.KindDisk, rundir.KindFsync:
			w.Target, w.Device = filepath.Join(p.scratch, w.Name), scratchDev
			if h := w.Hog; h.Target != "" {
				dir, err := TargetDir(o.Paths, p.id, h.Target)
				if err != nil {
					return nil, err
				}
				w.Target = filepath.Join(dir, w.Name)
				if w.Device, err = blockdev.ForPath(o.Paths.Sysfs, h.Target); err != nil {
					return nil, badvalue.Errorf(FieldHogs, strconv.Quote(h.raw), "target=%s: %w", h.Target, err)
				}
			}
		case rundir.KindMemory:
			if h := w.Hog; memoryHogBytes(h.MemBytes, o.Runtime) < h.MemBytes/4 {
				return nil, badvalue.Errorf(FieldHogs, strconv.Quote(h.raw), "memory=%s leaves too little for the hog in a gVisor sandbox, whose limit also holds the Sentry (~%s): give at least %s",
					quantity.FormatSize(h.MemBytes), quantity.FormatSize(sentryReserve), quantity.FormatSize(2*sentryReserve))
			}
		}
	}
	p.workloads = planned
	daemons, err := p.daemonWorkloads()
	if err != nil {
		return nil, err
	}
	p.workloads = append(p.workloads, daemons...)

	if err := p.createRunCgroup(cgroup.Limits{MemoryBytes: p.nodeMemBytes}); err != nil {
		return nil, err
	}
	for i, w := range p.workloads {
		if !owned(w.Workload) {
			continue // the host's cgroup: never created, limited or removed here
		}
		p.workloads[i].Limits = p.place(&p.workloads[i].Workload, w.Limits)
		if err := p.layout.Create(w.Cgroup, p.workloads[i].Limits); err != nil {
			return nil, fmt.Errorf("creating cgroup of %s: %w", w.Name, err)
		}
	}
	if err := p.newLaunchers(); err != nil {
		return nil, err
	}
	if o.Trace {
		// Kept for the churn hog: its sandboxes' cgroups may come and go between collections.
		p.resolver = cgroup.NewResolver(p.layout)
	}
	if err := p.startRecording(o, p.meta(), recordingSpec{cgroups: p.cgroupPaths, devices: p.devices, resolver: p.resolver}); err != nil {
		return nil, err
	}
	return slices.Clone(p.workloads), nil
}

// meta is the run's workloads as meta.json lists them.
func (p *localPlacement) meta() []rundir.Workload {
	out := make([]rundir.Workload, 0, len(p.workloads))
	for _, w := range p.workloads {
		out = append(out, w.Workload)
	}
	return out
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

func (p *localPlacement) cgroupPaths() []string {
	paths := make([]string, 0, len(p.workloads))
	for _, w := range p.workloads {
		paths = append(paths, w.Cgroup)
	}
	return paths
}

func (p *localPlacement) devices() []string {
	var devs []string
	for _, w := range p.workloads {
		if w.Device != "" && !slices.Contains(devs, w.Device) {
			devs = append(devs, w.Device)
		}
	}
	return devs
}

// newLaunchers prepares the runtime that runs the victim and the hogs, and the plain-process one
// that runs the heartbeat.
func (p *localPlacement) newLaunchers() error {
	var err error
	p.local, err = launch.New(launch.Config{Exe: p.opts.Exe, Cgroups: p.layout, Procfs: p.opts.Paths.Procfs, Log: p.opts.Log})
	if err != nil {
		return err
	}
	return p.newLauncher()
}

// launcherOf is the launcher that started w: the heartbeat's own, else the run's; nil for a
// daemon of the host, which the run did not start.
func (p *localPlacement) launcherOf(w rundir.Workload) *launch.Launcher {
	switch {
	case !owned(w):
		return nil
	case w.Kind == rundir.KindHeartbeat:
		return p.local
	}
	return p.launcher
}

// Start launches each workload in its cgroup; its measurements become samples of the run.
func (p *localPlacement) Start(_ context.Context, ws ...Planned) error {
	for _, w := range ws {
		if err := p.start(w); err != nil {
			return err
		}
	}
	return nil
}

func (p *localPlacement) start(w Planned) error {
	logf, err := p.openLog(w.Name)
	if err != nil {
		return err
	}
	onMeasure := func(name string, m workload.Measurement) {
		v := m.Value
		rec := rundir.Record{Type: rundir.TypeSample, Time: m.T, Metric: m.Metric, Cgroup: w.Cgroup, Workload: name, Value: &v}
		if err := p.writer.Append(rec); err != nil {
			p.opts.Log.Warn("recording a measurement", "workload", name, "err", err)
		}
		p.mu.Lock()
		p.last[m.Metric] = m.Value
		p.mu.Unlock()
	}
	l := p.launcherOf(w.Workload)
	var mounts []string
	if w.Target != "" {
		mounts = []string{w.Target}
	}
	if w.Kind == rundir.KindChurn && l.Runtime() != launch.RuntimeProcess {
		// Under a container runtime, churn is of sandboxes: their start-up is the load.
		c := &sandboxChurn{name: w.Name, cgroup: w.Cgroup, parallel: threadsFor(w.Hog, p.CPUs()),
			launcher: l, layout: p.layout, log: logf, onMeasure: onMeasure, resolver: p.resolver}
		p.procs = append(p.procs, launch.Go(w.Name, c.run))
		return nil
	}
	proc, err := l.Start(launch.Spec{Name: w.Name, Cgroup: w.Cgroup, Limits: w.Limits, Args: workload.Command{Run: p.id, Config: w.Config}.Args(), Mounts: mounts, Log: logf}, onMeasure)
	if err != nil {
		return err
	}
	p.procs = append(p.procs, proc)
	return nil
}

// Mark snapshots every source and records the phase's edge at the same time.
func (p *localPlacement) Mark(phase, event string) error { return p.mark(phase, event) }

// Hold lets d pass in phase while showing progress; it fails when ctx is cancelled or a
// workload died.
func (p *localPlacement) Hold(ctx context.Context, phase string, d time.Duration) error {
	p.mu.Lock()
	p.curPhase, p.phaseEnd = phase, time.Now().Add(d)
	p.mu.Unlock()
	err := p.wait(ctx, phase, d, func(time.Time) (bool, error) {
		p.showProgress()
		return false, p.exited()
	})
	if err == nil {
		p.showProgress()
	}
	return err
}

// Finish notes, while every workload still runs, which host processes run each one; the
// recording is written as it goes, and closed at cleanup.
func (p *localPlacement) Finish(context.Context) error {
	p.noteHostProcesses(p.meta(), p.launcherOf)
	return nil
}

func (p *localPlacement) showProgress() {
	p.mu.Lock()
	defer p.mu.Unlock()
	left := max(0, time.Until(p.phaseEnd).Round(time.Second))
	line := fmt.Sprintf("%-8s %4s left | %d workloads | victim cpu-work %s  write+fsync %s",
		p.curPhase, left, len(p.procs), fmtSecs(p.last[rundir.MetricProbeCPUWork]),
		fmtSecs(p.last[rundir.MetricProbeWrite]+p.last[rundir.MetricProbeFsync]))
	p.progress.Update(line)
}

func fmtSecs(s float64) string {
	if s == 0 {
		return "-"
	}
	return time.Duration(s * float64(time.Second)).Round(time.Millisecond).String()
}

// undo removes what the run made inside the user's target directories.
func (p *localPlacement) undo() []error {
	var errs []error
	for _, w := range p.workloads {
		if w.Target != "" && !isUnder(w.Target, p.scratch) {
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
