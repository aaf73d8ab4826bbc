package stress

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"time"

	"github.com/nodectl/nodectl/agent/cgroup"
	"github.com/nodectl/nodectl/agent/collect"
	"github.com/nodectl/nodectl/agent/trace"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/stress/launch"
)

// runHost is what every scenario's run makes on the host, and undoes on every exit path: its
// claim in the state directory, its cgroup, its recording, its tracer and its launcher.
type runHost struct {
	paths  Paths
	id     string
	dir    string // the run directory
	layout *cgroup.Layout
	cpus   CPUPartition

	unclaim   func()
	writer    *rundir.Writer
	launcher  *launch.Launcher
	tracer    *trace.Tracer
	collector *collect.Collector
	stopColl  func()
	created   bool // the run's cgroup was made
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
	return runHost{paths: o.Paths, id: id, dir: dir, layout: layout, cpus: o.CPUs}, nil
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
	if h.collector != nil {
		h.stopColl()
		if err := h.collector.Snapshot(time.Now()); err != nil {
			errs = append(errs, err)
		}
	}
	if h.tracer != nil {
		if err := h.tracer.Close(); err != nil {
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

// startTracer loads the tracer programs a run asked for (nil: all of them), warns about those
// that did not attach, and notes a tracefs mount it made in the run's state so that `stress
// clean` can undo it after a kill. The status lists the requested programs only: one left out
// on purpose is no missing evidence.
func startTracer(p Paths, id string, layout *cgroup.Layout, res *cgroup.Resolver, programs []string, log *slog.Logger) (*trace.Tracer, map[string]string, error) {
	t, err := trace.New(trace.Config{CgroupV1: layout.V1, Programs: programs, Sysfs: p.Sysfs, Tracefs: p.Tracefs},
		res, log.With("component", "trace"))
	if err != nil {
		return nil, nil, fmt.Errorf("--trace: %w", err)
	}
	status := t.Status()
	if programs != nil {
		maps.DeleteFunc(status, func(prog, _ string) bool { return !slices.Contains(programs, prog) })
	}
	warnUnattached(log, status)
	if dir := t.MountedTracefs(); dir != "" {
		if err := noteTracefs(p, id, dir); err != nil {
			_ = t.Close()
			return nil, nil, err
		}
	}
	return t, status, nil
}

// startRecording starts the run's recording: the tracer (programs; nil = all) when o.Trace,
// its status, the workloads and the runtime in meta.json, and the collector sampling sources
// (and the tracer) every interval in the background until release. res resolves the tracer's
// cgroup ids; nil makes one.
func (h *runHost) startRecording(o RunOptions, sources map[string]collect.Source, workloads []rundir.Workload,
	res *cgroup.Resolver, programs []string) error {
	status := map[string]string{}
	if o.Trace {
		if res == nil {
			res = cgroup.NewResolver(h.layout)
		}
		var err error
		if h.tracer, status, err = startTracer(o.Paths, h.id, h.layout, res, programs, o.Log); err != nil {
			return err
		}
		sources["trace"] = collect.SourceFunc(h.tracer.Collect)
	}
	if err := h.writer.UpdateMeta(func(m *rundir.Meta) {
		m.Workloads, m.Tracer, m.Runtime = workloads, status, h.launcher.Describe()
	}); err != nil {
		return err
	}
	h.collector = collect.New(sources, h.writer, o.Interval, nil, o.Log.With("component", "collect"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := h.collector.Run(ctx); err != nil {
			o.Log.Error("recording stopped", "err", err)
		}
	}()
	h.stopColl = func() { cancel(); <-done }
	return nil
}
