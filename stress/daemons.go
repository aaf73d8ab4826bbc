package stress

import (
	"strings"

	"github.com/nodectl/nodectl/internal/badvalue"

	"github.com/nodectl/nodectl/host/daemons"
	"github.com/nodectl/nodectl/rundir"
)

// rundir.KindDaemon is the Workload.Kind of a system daemon the run follows: the host's process in the
// host's cgroup, sampled and traced but never created, started, limited or removed by the run.

// owned says whether the run makes w: its cgroup and its processes, removed at cleanup.
func owned(w rundir.Workload) bool { return w.Kind != rundir.KindDaemon }

// daemonWorkloads finds the daemons of --daemons on the host, one workload per cgroup.
func (r *localPlacement) daemonWorkloads() ([]Planned, error) {
	if len(r.daemons) == 0 {
		return nil, nil
	}
	found, inRoot, err := daemons.Find(r.opts.Paths.Procfs, r.layout, r.daemons)
	if err != nil {
		return nil, err // it names the setting
	}
	if len(inRoot) > 0 {
		r.opts.Log.Warn("not following daemons in the root cgroup: every other task there would be charged to them",
			"daemons", strings.Join(inRoot, ","))
	}
	var out []Planned
	for _, d := range found {
		for _, w := range r.workloads {
			if w.Name == d.Name {
				return nil, badvalue.Errorf(daemons.FieldDaemons, "", "daemon %s has the name of one of the run's workloads; leave it out", d.Name)
			}
		}
		r.opts.Log.Info("following a system daemon", "daemon", d.Name, "cgroup", d.Cgroup, "pids", d.PIDs)
		out = append(out, Planned{Workload: rundir.Workload{Name: d.Name, Kind: rundir.KindDaemon, Cgroup: d.Cgroup}})
	}
	if len(out) == 0 {
		r.opts.Log.Info("no system daemon to follow", "daemons", strings.Join(r.daemons, ","))
	}
	return out, nil
}
