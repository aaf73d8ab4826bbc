package stress

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/internal/badvalue"
	"github.com/nodectl/nodectl/record/session"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/stress/launch"
)

// The skeleton every scenario (noisy, wake, fsync-storm, density) runs on: it claims the run,
// makes its directory, scratch and cgroup, records, marks phases, watches the workloads, notes
// their host processes, shows progress, and undoes everything on every exit path, an interrupt
// included. Each scenario's file keeps only its plan and its phases.

// ErrInterrupted is returned when a run was stopped by a signal; it was cleaned up all the same.
var ErrInterrupted = errors.New("interrupted")

// ErrTimeout is returned, wrapped, when a run's part did not finish within its time limit.
var ErrTimeout = errors.New("timed out")

// DefaultRunsDir is where runs are written when no run directory is given.
const DefaultRunsDir = "/var/lib/nodectl/runs"

// stopGrace is how long a workload gets to exit after SIGTERM before it is killed.
const stopGrace = 5 * time.Second

// scenario is what a scenario adds to the skeleton.
type scenario interface {
	// setup plans the workloads, makes their cgroups and starts the recording; the skeleton
	// has claimed the run and made its directory and scratch directory.
	setup(ctx context.Context) error
	// run runs the phases.
	run(ctx context.Context) error
	// undo removes what only the scenario made, once the workloads are stopped and the run's
	// cgroups removed, before the recording is closed.
	undo() []error
}

// runScenario runs s on h and returns the run directory; whatever happens, everything the run
// made is removed before it returns. A run refused for its input (a bad flag's value found
// only once it set up, as a hog's target without a disk) recorded nothing: its directory goes
// too, and none is returned.
func runScenario(ctx context.Context, h *runHost, s scenario) (dir string, err error) {
	defer func() {
		if cerr := h.cleanup(s); cerr != nil {
			err = errors.Join(err, cerr)
		}
		if bad := (*badvalue.Error)(nil); errors.As(err, &bad) && !h.marked {
			if rerr := h.removeDir(); rerr != nil {
				err = errors.Join(err, rerr)
			} else {
				dir = ""
			}
		}
	}()
	if err := h.begin(); err != nil {
		return h.dir, err
	}
	if err := s.setup(ctx); err != nil {
		return h.dir, err
	}
	return h.dir, s.run(ctx)
}

// runHost is what every scenario's run makes on the host, and undoes on every exit path: its
// claim in the state directory, its cgroup, its recording, its tracer and its launcher.
type runHost struct {
	paths    Paths
	scenario string // rundir's name of it
	id       string
	dir      string // the run directory
	layout   *cgroup.Layout
	cpus     CPUPartition

	opts    RunOptions
	scratch string // the run's scratch directory: files its workloads write

	unclaim  func()
	writer   *rundir.Writer
	launcher *launch.Launcher
	session  *session.Session
	created  bool // the run's cgroup was made
	marked   bool // a phase was recorded
	madeDir  bool // the run directory did not exist before the run

	progress *LiveLine
	procs    []*launch.Process // the workloads running; stopped at cleanup
	logs     []*os.File        // their standard error
}

// newRunHost names a new run of scenario and finds the host's cgroup layout; nothing is made yet.
func newRunHost(o RunOptions, scenario string) (runHost, error) {
	layout, err := cgroup.DetectProcfs(o.Paths.Cgroupfs, o.Paths.Procfs)
	if err != nil {
		return runHost{}, err
	}
	id := NewRunID(scenario)
	dir := o.Out
	if dir == "" {
		dir = filepath.Join(DefaultRunsDir, id)
	}
	return runHost{paths: o.Paths, scenario: scenario, id: id, dir: dir, layout: layout, cpus: o.CPUs, opts: o,
		scratch: filepath.Join(o.Paths.Scratch, id), progress: NewLiveLine(o.Progress, o.ProgressTTY)}, nil
}

// place gives w's cgroup the CPUs a tuned partition gives its kind, as a kubelet with reserved
// system CPUs places pods and systemd places daemons: the heartbeat, which stands in for a
// node daemon, on the system's CPUs and every other workload on the rest. It notes them in w
// for meta.json and returns lim with them.
func (h *runHost) place(w *rundir.Workload, lim cgroup.Limits) cgroup.Limits {
	if h.cpus.Workloads == "" {
		return lim
	}
	lim.CPUs = h.cpus.Workloads
	if w.Kind == rundir.KindHeartbeat {
		lim.CPUs = h.cpus.System
	}
	w.CPUs = lim.CPUs
	return lim
}

// release deletes the launcher's containers, takes the last snapshot, closes the tracer and
// removes the run's cgroup (and the shared parent when no other run is under it). Stop the
// workloads first.
func (h *runHost) release() []error {
	var errs []error
	if h.launcher != nil {
		if err := h.launcher.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if h.session != nil {
		if err := h.session.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if h.created {
		if err := h.layout.Remove(RunCgroup(h.id)); err != nil {
			errs = append(errs, err)
		}
		if err := h.layout.Prune(cgroup.Parent); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// finish closes the recording and gives up the run's claim; the last step of a cleanup.
func (h *runHost) finish() []error {
	var errs []error
	if h.writer != nil {
		if err := h.writer.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if h.unclaim != nil {
		h.unclaim()
	}
	pruneDirs(h.paths)
	return errs
}

// begin claims the run, makes its scratch directory and starts its run directory.
func (h *runHost) begin() error {
	unclaim, err := claim(h.paths, h.id)
	if err != nil {
		return err
	}
	h.unclaim = unclaim
	if err := os.MkdirAll(h.scratch, 0o755); err != nil {
		return fmt.Errorf("making scratch directory: %w", err)
	}
	meta := rundir.NewMeta(h.id, h.scenario, h.paths.Procfs, h.layout.V1, h.opts.Interval, h.opts.Args)
	_, serr := os.Stat(h.dir)
	h.madeDir = errors.Is(serr, fs.ErrNotExist)
	h.writer, err = rundir.Create(h.dir, meta)
	return err
}

// removeDir removes the run directory's files, and the directory when the run made it; a
// directory that was not made by rundir.Create (it refused one in use) is left alone.
func (h *runHost) removeDir() error {
	if h.writer == nil {
		return nil
	}
	if h.madeDir {
		return os.RemoveAll(h.dir)
	}
	entries, err := os.ReadDir(h.dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		errs = append(errs, os.RemoveAll(filepath.Join(h.dir, e.Name())))
	}
	return errors.Join(errs...)
}

// createRunCgroup makes the run's cgroup, the parent of its workloads', with lim.
func (h *runHost) createRunCgroup(lim cgroup.Limits) error {
	h.created = true
	if err := h.layout.Create(RunCgroup(h.id), lim); err != nil {
		return fmt.Errorf("creating the run's cgroup: %w", err)
	}
	return nil
}

// newLauncher is the launcher of the runtime the run was asked for.
func (h *runHost) newLauncher() error {
	var err error
	h.launcher, err = launch.New(launch.Config{Runtime: h.opts.Runtime, Exe: h.opts.Exe, Cgroups: h.layout, Procfs: h.paths.Procfs,
		StateDir: RuntimeState(h.paths, h.id), RunscPlatform: h.opts.RunscPlatform, Log: h.opts.Log.With("component", "launch")})
	return err
}

// mark snapshots every source and records a phase's start or end at the same time, so the
// phase's window has exact counters at both edges.
func (h *runHost) mark(name, event string) error {
	now := time.Now()
	if err := h.session.Snapshot(now); err != nil {
		return err
	}
	h.marked = true
	return h.writer.Append(rundir.Record{Type: rundir.TypePhase, Time: now, Name: name, Event: event})
}

// logPath is where a workload's standard error goes.
func (h *runHost) logPath(name string) string {
	return filepath.Join(h.dir, "workloads", name+".log")
}

// openLog creates a workload's log; cleanup closes it.
func (h *runHost) openLog(name string) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(h.logPath(name)), 0o755); err != nil {
		return nil, fmt.Errorf("making the workload log directory: %w", err)
	}
	f, err := os.Create(h.logPath(name))
	if err != nil {
		return nil, fmt.Errorf("creating log of %s: %w", name, err)
	}
	h.logs = append(h.logs, f)
	return f, nil
}

// exited is the watchdog: a workload that died is an error naming it and its log, as a run
// would otherwise wait for it or measure without it.
func (h *runHost) exited() error {
	for _, p := range h.procs {
		select {
		case <-p.Done():
			return fmt.Errorf("workload %s exited: %v (see %s)", p.Name, p.Err(), h.logPath(p.Name))
		default:
		}
	}
	return nil
}

// watchTick is how often a waiting run looks at its workloads and shows progress.
const watchTick = 250 * time.Millisecond

// wait lets d pass in phase, calling tick every watchTick: tick shows progress and checks
// the workloads, and may end the wait early (done) or fail it. A cancelled ctx ends it with
// ErrInterrupted.
func (h *runHost) wait(ctx context.Context, phase string, d time.Duration, tick func(now time.Time) (done bool, err error)) error {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	ticker := time.NewTicker(watchTick)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			h.progress.Done()
			return fmt.Errorf("%w during %s: %v", ErrInterrupted, phase, context.Cause(ctx))
		case <-deadline.C:
			return nil
		case now := <-ticker.C:
			done, err := tick(now)
			if err != nil {
				h.progress.Done()
				return fmt.Errorf("during %s: %w", phase, err)
			}
			if done {
				return nil
			}
		}
	}
}

// noteHostProcesses records in meta.json which host processes run each of workloads (a runsc
// sandbox's Sentry, gofer and stubs, a runc container's processes), asking the launcher that
// started it; one it did not start (launcherOf returns nil) is left as it is.
func (h *runHost) noteHostProcesses(workloads []rundir.Workload, launcherOf func(rundir.Workload) *launch.Launcher) {
	for i, w := range workloads {
		l := launcherOf(w)
		if l == nil {
			continue
		}
		procs, err := l.HostProcesses(w.Cgroup)
		if err != nil {
			h.opts.Log.Debug("listing host processes", "workload", w.Name, "err", err)
			continue
		}
		workloads[i].Runtime = string(l.Runtime())
		workloads[i].HostProcesses = procs
	}
	if err := h.writer.UpdateMeta(func(m *rundir.Meta) { m.Workloads = workloads }); err != nil {
		h.opts.Log.Warn("recording host processes", "err", err)
	}
}

// cleanup stops the workloads, releases the host (containers, the last snapshot, the tracer,
// the cgroups), closes the logs, has the scenario undo what only it made, removes the scratch
// directory and closes the recording. It runs on every exit path.
func (h *runHost) cleanup(s scenario) error {
	h.progress.Done()
	launch.StopAll(h.procs, stopGrace)
	errs := h.release()
	for _, f := range h.logs {
		f.Close()
	}
	errs = append(errs, s.undo()...)
	if err := os.RemoveAll(h.scratch); err != nil {
		errs = append(errs, fmt.Errorf("removing scratch %s: %w", h.scratch, err))
	}
	errs = append(errs, h.finish()...)
	return errors.Join(errs...)
}
