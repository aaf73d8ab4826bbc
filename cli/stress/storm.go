package stress

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodectl/nodectl/analyzer"
	"github.com/nodectl/nodectl/cli/internal/clix"
	st "github.com/nodectl/nodectl/stress"
	"github.com/nodectl/nodectl/stress/launch"
)

// maxStormRounds bounds --rounds: storms run one after another, each with a pause.
const maxStormRounds = 100

func fsyncStorm() *cobra.Command {
	var (
		size    string
		runtime string
		cfg     = st.StormConfig{Paths: st.DefaultPaths()}
		output  string
		verbose bool
	)
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
writers that held the device its culprits. SIZE uses Kubernetes notation (64Mi, 1Gi).`,
		Example: `  sudo nodectl stress fsync-storm --trace
  sudo nodectl stress fsync-storm --writers 4 --size 64Mi --rounds 2 --trace -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := clix.CheckOutput(output); err != nil {
				return err
			}
			if cfg.Writers < 1 || cfg.Writers > st.MaxStormWriters {
				return fmt.Errorf("--writers %d: want an integer from 1 to %d", cfg.Writers, st.MaxStormWriters)
			}
			var err error
			if cfg.Bytes, err = st.ParseSize(size); err != nil {
				return fmt.Errorf("--size: %w", err)
			}
			if total := int64(cfg.Writers) * cfg.Bytes; cfg.Bytes > st.MaxStormTotalBytes || total > st.MaxStormTotalBytes {
				return fmt.Errorf("--writers %d × --size %s is more than %s: the storm's page cache must stay well inside the node's memory",
					cfg.Writers, size, st.FormatSize(st.MaxStormTotalBytes))
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
			if cfg.Runtime, err = launch.ParseRuntime(runtime); err != nil {
				return fmt.Errorf("--runtime: %w", err)
			}
			if err := checkPlatform(cfg.RunscPlatform, cfg.Runtime); err != nil {
				return err
			}
			if cfg.Timeout < time.Second {
				return fmt.Errorf("--timeout %s: must be at least 1s", cfg.Timeout)
			}
			ctx, stop, err := startRun(cmd, "nodectl stress fsync-storm", "creating cgroups and moving the writers into them", cfg.Trace, cfg.Interval)
			if err != nil {
				return err
			}
			defer stop()
			cfg.Args = os.Args
			cfg.Progress = cmd.ErrOrStderr()
			cfg.ProgressTTY = clix.IsTerminal(os.Stderr)
			cfg.Log = clix.Logger(cmd.ErrOrStderr(), verbose)
			fmt.Fprintf(cmd.ErrOrStderr(), "fsync-storm: %d writer(s) × %s, %d storm(s), runtime %s\n", cfg.Writers, st.FormatSize(cfg.Bytes), cfg.Rounds, cfg.Runtime)
			dir, runErr := st.Storm(ctx, cfg)
			if dir != "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "run directory: %s\n", dir)
			}
			if runErr != nil {
				return runErr
			}
			rep, err := analyzeRun(dir)
			if err != nil {
				return err
			}
			if output == "json" {
				return analyzer.RenderStormJSON(cmd.OutOrStdout(), rep)
			}
			return analyzer.RenderStormText(cmd.OutOrStdout(), rep)
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Writers, "writers", st.DefaultStormWriters, "writers released at once, each in its own cgroup")
	f.StringVar(&size, "size", st.FormatSize(st.DefaultStormBytes), "bytes each writer writes and fsyncs per storm (Kubernetes notation, e.g. 64Mi; at least 1Mi)")
	f.StringVar(&cfg.Target, "target", "", "existing directory the writers write below (its disk is the one under test); default the scratch directory, "+st.DefaultPaths().Scratch+"/<run-id>")
	f.IntVar(&cfg.Rounds, "rounds", st.DefaultStormRounds, "storms, one after another")
	f.DurationVar(&cfg.Pause, "pause", st.DefaultStormPause, "pause between storms, for the device to settle")
	f.DurationVar(&cfg.Timeout, "timeout", st.DefaultStormTimeout, "how long one storm may take")
	f.StringVar(&runtime, "runtime", string(launch.RuntimeProcess), "how the writers run: process (a child process in a cgroup), runc (a container) or runsc (a gVisor sandbox); the root filesystem is the nodectl binary alone")
	f.StringVar(&cfg.RunscPlatform, "runsc-platform", "", "gVisor platform for --runtime runsc: systrap, ptrace or kvm; default systrap where runsc has it, else ptrace")
	f.BoolVar(&cfg.Trace, "trace", false, "trace with eBPF (fsync latency and block I/O per cgroup: the device's queue and service time)")
	f.StringVar(&cfg.Out, "out", "", "run directory to write (must not exist or be empty); default "+st.DefaultRunsDir+"/<run-id>")
	f.StringVarP(&output, "output", "o", "text", "report format: text or json")
	f.DurationVar(&cfg.Interval, "interval", time.Second, "sampling interval of the tracer and samplers")
	f.BoolVarP(&verbose, "verbose", "v", false, "log debug detail to stderr")
	clix.HostPathFlags(f, &cfg.Paths)
	clix.RunPathFlags(f, &cfg.Paths)
	return cmd
}
