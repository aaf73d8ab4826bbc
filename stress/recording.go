package stress

import (
	"fmt"
	"path/filepath"

	"github.com/nodectl/nodectl/agent/cgroup"
	"github.com/nodectl/nodectl/agent/collect"
	"github.com/nodectl/nodectl/agent/session"
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

	unclaim  func()
	writer   *rundir.Writer
	launcher *launch.Launcher
	session  *session.Session
	created  bool // the run's cgroup was made
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

// recordingSpec is what a scenario records besides what every run does.
type recordingSpec struct {
	cgroups  func() []string           // the cgroups the sampler reads each interval
	priority func(cgroup string) bool  // of those, the ones read in full every interval; nil: none
	devices  func() []string           // the disks whose diskstats are recorded; nil: every whole disk
	sources  map[string]collect.Source // the scenario's own
	resolver *cgroup.Resolver          // names the tracer's cgroup ids; nil: a new one
	programs []string                  // the tracer programs the scenario needs; nil: all
}

// startRecording starts the run's recording session in the background until release: the
// tracer when o.Trace (its programs' status, the workloads and the runtime go to meta.json),
// the samplers and the scenario's sources. A tracefs mount the tracer made is noted in the
// run's state so that `stress clean` can undo it after a kill.
func (h *runHost) startRecording(o RunOptions, workloads []rundir.Workload, spec recordingSpec) error {
	sess, err := session.New(session.Config{Host: o.Paths.FS, Layout: h.layout, Interval: o.Interval,
		Trace: o.Trace, Programs: spec.programs, Resolver: spec.resolver,
		Cgroups: spec.cgroups, Priority: spec.priority, Devices: spec.devices, Sources: spec.sources, Log: o.Log}, h.writer)
	if err != nil {
		return fmt.Errorf("--trace: %w", err)
	}
	h.session = sess
	status := sess.TracerStatus()
	warnUnattached(o.Log, status)
	if dir := sess.MountedTracefs(); dir != "" {
		if err := noteTracefs(o.Paths, h.id, dir); err != nil {
			return err
		}
	}
	if err := h.writer.UpdateMeta(func(m *rundir.Meta) {
		m.Workloads, m.Tracer, m.Runtime = workloads, status, h.launcher.Describe()
	}); err != nil {
		return err
	}
	sess.Background(o.Log)
	return nil
}
