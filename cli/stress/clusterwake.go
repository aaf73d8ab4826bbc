package stress

import (
	"github.com/spf13/cobra"

	"github.com/nodectl/nodectl/cli/internal/podrun"
	"github.com/nodectl/nodectl/rundir"
	st "github.com/nodectl/nodectl/stress"
)

// clusterWake runs wake as pods on --node (stress.WakeOn on podrun's placement): one start at a
// time at each CPU limit, explained from the node's agent's window: the pods' CFS throttling
// and run-queue waits, read from their cgroups.
func clusterWake(cmd *cobra.Command, rf *runFlags, cfg st.WakeConfig) error {
	ctx, s, finish, err := startPods(cmd, rf, "wake")
	if err != nil {
		return err
	}
	defer finish()
	p := podrun.NewPlacement(s.run, s.ac, s.rec, s.ncpu, runtimeClass(rf.opts.Runtime, rf.runtimeClass), rundir.ScenarioWake, s.out)
	if err := st.WakeOn(ctx, cfg, p); err != nil {
		return err
	}
	rep, err := analyzeRun(p.Run())
	if err != nil {
		return err
	}
	return rf.report(rep, "wake", func() error { return renderWake(cmd, rf, rep) })
}
