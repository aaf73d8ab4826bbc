package stress

import (
	"context"
	"time"

	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/stress/workload"
)

// Placement is where a scenario's workloads run and who records them, so that a scenario is
// written once: on this host (processes, runc or runsc in the run's own cgroups, recorded by
// the run's session) or on a node of a cluster (pods through the API server, recorded by the
// node's agent: cli/internal/podrun). The scenario plans its workloads and marks its phases;
// the placement makes what they need, records, writes the run, and removes what it made on
// every exit path (its owner's to close). Each scenario adds the steps only it takes: Holder
// (noisy), Waker (wake), Stormer (fsync-storm).
type Placement interface {
	// ID is the run's id, which its workloads carry (workload.Command.Run).
	ID() string
	// CPUs is the CPU count of the node the workloads run on: it sizes the hogs' threads.
	CPUs() int
	// Place gives each planned workload what this placement runs it with (its cgroup, the
	// directory it writes below and the device under it), adds the workloads it follows
	// without running them (a host's daemons), and makes what they need before the first
	// starts (cgroups, the recording). A workload or setting it cannot place is refused,
	// naming the setting. It returns the run's workloads, as meta.json lists them.
	Place(ctx context.Context, planned []Planned) ([]Planned, error)
	// Mark records that phase starts or ends now (rundir.EventStart, rundir.EventEnd).
	Mark(phase, event string) error
	// Finish completes the run's recording once its last phase ended.
	Finish(ctx context.Context) error
}

// Holder is a placement that runs workloads through phases of a set length: the steps of the
// noisy scenario (NoisyOn).
type Holder interface {
	Placement
	// Start starts workloads and returns once each runs.
	Start(ctx context.Context, ws ...Planned) error
	// Hold lets d pass in phase, failing early when a workload ended, or with ErrInterrupted
	// when ctx ends.
	Hold(ctx context.Context, phase string, d time.Duration) error
}

// Planned is a workload of a scenario: what the run records of it, the limits it runs under and
// the body that runs it.
type Planned struct {
	rundir.Workload
	Limits cgroup.Limits
	// MemoryRequest is what the scheduler reserves for it (a pod's memory request); no cgroup
	// setting, so a local placement only records it.
	MemoryRequest int64
	// Hog is the --hog it came from; zero for a probe.
	Hog HogSpec
	// Config is its body, set once the workload is placed (it writes below Target).
	Config workload.Config
}

// names are the workloads' names, in order.
func names(ws []Planned) []string {
	out := make([]string, 0, len(ws))
	for _, w := range ws {
		out = append(out, w.Name)
	}
	return out
}
