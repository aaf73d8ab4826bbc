package stress

import (
	"github.com/nodectl/nodectl/internal/badvalue"

	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/record/collect"
	"github.com/nodectl/nodectl/record/session"
	"github.com/nodectl/nodectl/rundir"
)

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
		return badvalue.New(FieldTrace, "", err)
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
