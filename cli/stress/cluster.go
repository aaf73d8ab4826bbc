package stress

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodectl/nodectl/agent/recorded"
	agentv1 "github.com/nodectl/nodectl/api/agent/v1"
	"github.com/nodectl/nodectl/cli/internal/console"
	"github.com/nodectl/nodectl/cli/internal/interrupt"
	"github.com/nodectl/nodectl/cli/internal/podrun"
	"github.com/nodectl/nodectl/cli/internal/remote"
	"github.com/nodectl/nodectl/rundir"
	st "github.com/nodectl/nodectl/stress"
	"github.com/nodectl/nodectl/stress/launch"
)

// Flags of a local run that mean nothing for a run of pods on --node: the node's agent traces
// and samples, and the kubelet makes the cgroups.
var localOnlyFlags = []string{"node-memory", "heartbeat", "daemons", "interval", "runsc-platform", "cgroupfs", "procfs", "sysfs", "tracefs", "scratch-dir", "state-dir"}

// checkClusterFlags refuses the flags that do not apply to a run of pods.
func checkClusterFlags(cmd *cobra.Command) error {
	for _, name := range localOnlyFlags {
		if f := cmd.Flags().Lookup(name); f != nil && f.Changed {
			return fmt.Errorf("--%s: not with --%s (the node's agent records the run, and the kubelet makes its cgroups)", name, remote.FlagNode)
		}
	}
	return nil
}

// runtimeClass is the RuntimeClass of the workload pods: --runtime-class, else GKE's name of
// gVisor's for --runtime runsc, else the cluster's default runtime.
func runtimeClass(rt launch.Runtime, class string) string {
	if class == "" && rt == launch.RuntimeRunsc {
		return "gvisor"
	}
	return class
}

// podSession is a run of pods on --node under way: the cluster, the node's agent, the run's
// namespace, and the run directory it will write.
type podSession struct {
	node     string
	c        *remote.Cluster
	ac       agentv1.AgentClient
	rec      recorded.Recorder // the node agent's flight recorder, through ac
	run      *podrun.Run
	out      string
	ncpu     int
	progress io.Writer
}

// startPods checks the flags of a run of pods, reaches the node's agent (a run it cannot record
// is not started) and makes the run's namespace. The context ends on Ctrl-C; the function
// returned deletes the run's pods and namespace, and must run on every path.
func startPods(cmd *cobra.Command, rf *runFlags, scenario string, extra ...remote.Permission) (context.Context, *podSession, func(), error) {
	if err := checkClusterFlags(cmd); err != nil {
		return nil, nil, nil, err
	}
	s := &podSession{node: remote.FromCommand(cmd).Node, progress: cmd.ErrOrStderr()}
	id := st.NewRunID(scenario)
	s.out = rf.opts.Out
	if s.out == "" {
		s.out = filepath.Join(os.TempDir(), "nodectl-runs", id)
	}
	// Checked now, not after the run: a run directory is made new (or in an empty directory).
	if entries, err := os.ReadDir(s.out); err == nil && len(entries) > 0 {
		return nil, nil, nil, fmt.Errorf("--out %s: not empty", s.out)
	}
	var err error
	if s.c, err = remote.Connect(remote.FromCommand(cmd)); err != nil {
		return nil, nil, nil, err
	}
	ctx, stop := interrupt.SignalContext(cmd.Context(), cmd.ErrOrStderr())
	var closer io.Closer
	fail := func(err error) (context.Context, *podSession, func(), error) {
		if closer != nil {
			closer.Close()
		}
		stop()
		return nil, nil, nil, err
	}
	if s.ac, closer, err = s.c.DialAgent(ctx, s.node); err != nil {
		return fail(err)
	}
	s.rec = recorded.FromAgent(s.ac, nil)
	if s.ncpu, err = s.c.NodeCPUs(ctx, s.node); err != nil {
		return fail(err)
	}
	if s.run, err = podrun.Start(ctx, s.c, s.node, id, s.progress, extra...); err != nil {
		return fail(err)
	}
	finish := func() {
		// Ctrl-C or a failure ended ctx: the pods still go, with a context of their own.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Minute)
		defer cancel()
		if derr := s.run.Delete(dctx); derr != nil {
			fmt.Fprintf(s.progress, "nodectl: %v\n", derr)
		}
		closer.Close()
		stop()
	}
	return ctx, s, finish, nil
}

// runPods runs scenario as pods on --node: startPods' checks, the run's namespace and the
// node's agent reached, the headline (the node's name given), run on the pods placement, then
// the run it wrote analyzed and reported. The pods and the namespace go on every path.
func (rf *runFlags) runPods(cmd *cobra.Command, scenario string, span time.Duration, headline func(node string) string,
	run func(context.Context, *podrun.Placement, *st.LiveLine) error, extra ...remote.Permission) error {
	ctx, s, finish, err := startPods(cmd, rf, scenario, extra...)
	if err != nil {
		return err
	}
	defer finish()
	s.run.SetSpan(span)
	fmt.Fprintln(s.progress, headline(s.node))
	p := podrun.NewPlacement(s.run, s.ac, s.rec, s.ncpu, runtimeClass(rf.opts.Runtime, rf.runtimeClass), scenario, s.out)
	line := st.NewLiveLine(s.progress, console.IsTerminal(os.Stderr))
	defer line.Done()
	if err := run(ctx, p, line); err != nil {
		return err
	}
	rep, err := analyzeRun(p.Run())
	if err != nil {
		return err
	}
	return rf.report(cmd, rep)
}

// clusterNoisy runs noisy as pods on --node (stress.NoisyOn on podrun's placement), recorded by
// the node's agent, and explains the run it wrote.
func clusterNoisy(cmd *cobra.Command, rf *runFlags, cfg st.NoisyConfig) error {
	for _, h := range cfg.Hogs {
		if h.Target != "" {
			return fmt.Errorf("--hog %s,target=%s: not with --%s (a pod writes to its own emptyDir on the node's disk)", h.Kind, h.Target, remote.FlagNode)
		}
	}
	cfg.Interval = time.Second
	return rf.runPods(cmd, rundir.ScenarioNoisy, cfg.Span(), func(node string) string {
		return fmt.Sprintf("noisy on node %s: victim alone %s, then next to %d hog pod(s) %s", node, cfg.Baseline, countHogs(cfg.Hogs), cfg.Duration)
	}, func(ctx context.Context, p *podrun.Placement, _ *st.LiveLine) error { return st.NoisyOn(ctx, cfg, p) })
}

// cleanNode deletes what runs of pods left on node.
func cleanNode(cmd *cobra.Command, node string, ids []string, output string) error {
	if len(ids) > 0 {
		return fmt.Errorf("RUN_ID with --%s: it removes every run of pods left on the node", remote.FlagNode)
	}
	for _, name := range []string{"all", "cgroupfs", "procfs", "sysfs", "tracefs", "scratch-dir", "state-dir"} {
		if f := cmd.Flags().Lookup(name); f != nil && f.Changed {
			return fmt.Errorf("--%s: not with --%s", name, remote.FlagNode)
		}
	}
	c, err := remote.Connect(remote.FromCommand(cmd))
	if err != nil {
		return err
	}
	removed, err := podrun.Clean(cmd.Context(), c, node, cmd.ErrOrStderr())
	if output == "json" {
		if removed == nil {
			removed = []string{}
		}
		if jerr := json.NewEncoder(cmd.OutOrStdout()).Encode(map[string][]string{"removed": removed}); jerr != nil {
			return errors.Join(err, jerr)
		}
		return err
	}
	for _, ns := range removed {
		fmt.Fprintf(cmd.OutOrStdout(), "removed namespace %s\n", ns)
	}
	if len(removed) == 0 && err == nil {
		fmt.Fprintln(cmd.OutOrStdout(), "nothing to clean")
	}
	return err
}
