package stress

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/nodectl/nodectl/cli/internal/podrun"
	"github.com/nodectl/nodectl/rundir"
	st "github.com/nodectl/nodectl/stress"
)

// clusterWake runs wake as pods on --node (stress.WakeOn on podrun's placement): one start at a
// time at each CPU limit, explained from the node's agent's window: the pods' CFS throttling
// and run-queue waits, read from their cgroups.
func clusterWake(cmd *cobra.Command, rf *runFlags, cfg st.WakeConfig) error {
	return rf.runPods(cmd, rundir.ScenarioWake, cfg.Span(), func(node string) string {
		return fmt.Sprintf("wake on node %s: %d start(s) at each of %s", node, cfg.Count, limitNames(cfg.CPULimits))
	}, func(ctx context.Context, p *podrun.Placement, _ *st.LiveLine) error { return st.WakeOn(ctx, cfg, p) })
}
