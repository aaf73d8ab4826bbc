package stress

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodectl/nodectl/cli/internal/podrun"
	"github.com/nodectl/nodectl/cli/internal/remote"
	"github.com/nodectl/nodectl/internal/quantity"
	"github.com/nodectl/nodectl/rundir"
	st "github.com/nodectl/nodectl/stress"
)

// maxStormRounds bounds --rounds: storms run one after another, each with a pause.
const maxStormRounds = 100

func fsyncStorm() *cobra.Command {
	var (
		size string
		cfg  = st.StormConfig{RunOptions: st.RunOptions{Paths: st.DefaultPaths()}}
	)
	rf := runFlags{opts: &cfg.RunOptions}
	cmd := &cobra.Command{
		Use:   "fsync-storm",
		Short: "Release many writers at once, each writing a file and fsyncing it, and explain the slowest",
		Long: `A snapshot storm: --writers writers, each in its own cgroup nodectl/<run-id>/fsync-writer-<i>,
each write --size of random data to a fresh file on --target and fsync it, all released at
once; --rounds storms with a pause between. Every writer is started and waits, ready, before a
storm; the go reaches all of them within microseconds. Each writer reports its time to durable
(its first write to its fsync's return), split into the writes and the fsync.

The report has each writer's times, and for each storm the spread of the times to durable and
its tail explained: with --trace, how the device's requests split between waiting in the queue
and being served (eBPF block tracer), which writers held the device (bytes per cgroup), and
what writeback did (the node's dirty memory against its dirty thresholds, sampled through the
storm). A slowest writer well behind the median is reported as disk-contention, the other
writers that held the device its culprits. SIZE uses Kubernetes notation (64Mi, 1Gi).

With --node NODE the writers are pods on that node (fsync-writer-<i>, in a namespace of the
run's own, --runtime-class as for noisy), each writing to its own emptyDir on the node's disk;
nodectl attaches to their standard input through the API server (pods/attach), so that a
storm's go reaches them all at once, and reads their times from their standard output. The
device's side (queue and service time, who held it) is the node's agent's, on the disk the
writers' cgroups wrote the most to. --target is for a local run only.`,
		Example: `  sudo nodectl stress fsync-storm --trace
  sudo nodectl stress fsync-storm --writers 4 --size 64Mi --rounds 2 --trace -o json
  nodectl --node gke-pool-1-abcd stress fsync-storm --writers 16 --size 128Mi --runtime runsc`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := rf.check(); err != nil {
				return err
			}
			if cfg.Writers < 1 || cfg.Writers > st.MaxStormWriters {
				return fmt.Errorf("--writers %d: want an integer from 1 to %d", cfg.Writers, st.MaxStormWriters)
			}
			var err error
			if cfg.Bytes, err = quantity.ParseSize(size); err != nil {
				return fmt.Errorf("--size: %w", err)
			}
			if total := int64(cfg.Writers) * cfg.Bytes; cfg.Bytes > st.MaxStormTotalBytes || total > st.MaxStormTotalBytes {
				return fmt.Errorf("--writers %d × --size %s is more than %s: the storm's page cache must stay well inside the node's memory",
					cfg.Writers, size, quantity.FormatSize(st.MaxStormTotalBytes))
			}
			if cfg.Rounds < 1 || cfg.Rounds > maxStormRounds {
				return fmt.Errorf("--rounds %d: want an integer from 1 to %d", cfg.Rounds, maxStormRounds)
			}
			if cfg.Pause < 0 {
				return fmt.Errorf("--pause %s: must not be negative", cfg.Pause)
			}
			if cfg.Target != "" {
				if fi, err := os.Stat(cfg.Target); err != nil || !fi.IsDir() {
					return fmt.Errorf("--target %s: not an existing directory", cfg.Target)
				}
			}
			if cfg.Timeout < time.Second {
				return fmt.Errorf("--timeout %s: must be at least 1s", cfg.Timeout)
			}
			if remote.FromCommand(cmd).Node != "" {
				return clusterStorm(cmd, &rf, cfg)
			}
			headline := fmt.Sprintf("fsync-storm: %d writer(s) × %s, %d storm(s), runtime %s", cfg.Writers, quantity.FormatSize(cfg.Bytes), cfg.Rounds, cfg.Runtime)
			return rf.runLocal(cmd, "nodectl stress fsync-storm", "creating cgroups and moving the writers into them", headline,
				func(ctx context.Context) (string, error) { return st.Storm(ctx, cfg) })
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Writers, "writers", st.DefaultStormWriters, "writers released at once, each in its own cgroup")
	f.StringVar(&size, "size", quantity.FormatSize(st.DefaultStormBytes), "bytes each writer writes and fsyncs per storm (Kubernetes notation, e.g. 64Mi; at least 1Mi)")
	f.StringVar(&cfg.Target, "target", "", "existing directory the writers write below (its disk is the one under test); default the scratch directory, "+st.DefaultPaths().Scratch+"/<run-id>")
	f.IntVar(&cfg.Rounds, "rounds", st.DefaultStormRounds, "storms, one after another")
	f.DurationVar(&cfg.Pause, "pause", st.DefaultStormPause, "pause between storms, for the device to settle")
	f.DurationVar(&cfg.Timeout, "timeout", st.DefaultStormTimeout, "how long one storm may take")
	rf.register(f, "the writers", "fsync latency and block I/O per cgroup (the device's queue and service time)", true)
	return remote.Supports(cmd)
}

// clusterStorm runs an fsync storm of writer pods on --node (stress.StormOn on podrun's
// placement): each writer's standard input is attached through the API server, so that a
// storm's go reaches them all at once, as a local run's does through their pipes; the device's
// side comes from the node's agent.
func clusterStorm(cmd *cobra.Command, rf *runFlags, cfg st.StormConfig) error {
	if cfg.Target != "" {
		return fmt.Errorf("--target %s: not with --%s (a writer pod writes to its own emptyDir on the node's disk)", cfg.Target, remote.FlagNode)
	}
	return rf.runPods(cmd, rundir.ScenarioFsyncStorm, cfg.Span(), func(node string) string {
		return fmt.Sprintf("fsync-storm on node %s: %d writer pod(s) × %s, %d storm(s)", node, cfg.Writers, quantity.FormatSize(cfg.Bytes), cfg.Rounds)
	}, func(ctx context.Context, p *podrun.Placement, line *st.LiveLine) error {
		return st.StormOn(ctx, cfg, p, line)
	})
}
