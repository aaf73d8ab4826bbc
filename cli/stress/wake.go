package stress

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodectl/nodectl/cli/internal/remote"
	"github.com/nodectl/nodectl/internal/quantity"
	st "github.com/nodectl/nodectl/stress"
	"github.com/nodectl/nodectl/stress/workload"
)

// maxWakeCount bounds --count: each start is sequential, and at a small limit takes seconds.
const maxWakeCount = 1000

func wake() *cobra.Command {
	var (
		limits []string
		cfg    = st.WakeConfig{RunOptions: st.RunOptions{Paths: st.DefaultPaths()}}
	)
	rf := runFlags{opts: &cfg.RunOptions}
	cmd := &cobra.Command{
		Use:   "wake",
		Short: "Start the same sandbox at several CPU limits and time how long it takes to answer its first request",
		Long: `Starts a sandbox at each CPU limit, --count times each, one start at a time, each in a
fresh cgroup nodectl/<run-id>/wake-<limit>-<i> with that limit. A request is pending on the
sandbox's standard input from its launch, as a request waits for a sleeping sandbox to wake;
the sandbox boots (--boot-work rounds of CPU-bound initialisation, about 150 ms of one CPU),
then answers it. The wake time runs from just before the launch to the answer's arrival.
Right after the answer the run reads the boot's CFS throttling from the cgroup (fresh, so all
of it is the boot's) and its run-queue wait: from the eBPF run-queue tracer with --trace, else
from /proc/<pid>/task/*/schedstat of the sandbox's host processes.

The report has a row per limit (wake p50/p95, the share of the wake spent throttled, the
boot's throttled time, CPU and run-queue wait) and explains slow limits as cpu-throttling.
LIMIT uses Kubernetes notation (50m, 250m, 1), at least 10m.

With --node NODE each start is a pod on that node (wake-<limit>-<i>, in a namespace of the
run's own) with the limit as its CPU limit and request and --runtime-class (gvisor for --runtime
runsc), running the node's agent's image; its request is pending from its start. The wake time
runs from nodectl's create call to the answer, by the node's clock (so it includes the pod's
start: the runtime's, a gVisor sandbox's boot), the boot from the workload's start; the
throttling and run-queue waits are the pod's cgroup's, from the node's agent. Each pod is
deleted once its counters are read; all are on every exit path.`,
		Example: `  sudo nodectl stress wake
  sudo nodectl stress wake --cpu-limits 50m,1 --count 3 --trace -o json
  nodectl --node gke-pool-1-abcd stress wake --cpu-limits 50m,1 --runtime runsc`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := rf.check(); err != nil {
				return err
			}
			var err error
			if cfg.CPULimits, err = st.ParseCPULimits(limits); err != nil {
				return err
			}
			if cfg.Count < 1 || cfg.Count > maxWakeCount {
				return fmt.Errorf("--count %d: want an integer from 1 to %d", cfg.Count, maxWakeCount)
			}
			if cfg.BootRounds < 1 {
				return fmt.Errorf("--boot-work %d: want at least 1 round", cfg.BootRounds)
			}
			if cfg.Timeout < time.Second {
				return fmt.Errorf("--timeout %s: must be at least 1s", cfg.Timeout)
			}
			if remote.FromCommand(cmd).Node != "" {
				return clusterWake(cmd, &rf, cfg)
			}
			headline := fmt.Sprintf("wake: %d start(s) at each of %s, runtime %s", cfg.Count, limitNames(cfg.CPULimits), cfg.Runtime)
			return rf.runLocal(cmd, "nodectl stress wake", "creating cgroups and moving the sandbox into them", headline,
				func(ctx context.Context) (string, error) { return st.Wake(ctx, cfg) })
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&limits, "cpu-limits", st.DefaultWakeLimits, "CPU limits to start the sandbox at, comma-separated, in Kubernetes notation (at least 10m)")
	f.IntVar(&cfg.Count, "count", st.DefaultWakeCount, "starts at each limit")
	rf.register(f, "the sandboxes", "the run queue (the boot's run-queue wait per cgroup)", false)
	f.IntVar(&cfg.BootRounds, "boot-work", workload.DefaultBootRounds, "rounds of CPU work the sandbox's boot does before it answers")
	f.DurationVar(&cfg.Timeout, "timeout", st.DefaultWakeTimeout, "how long one start may take to answer")
	return remote.Supports(cmd)
}

// limitNames lists CPU limits as given, in Kubernetes notation.
func limitNames(ms []int64) string {
	names := make([]string, len(ms))
	for i, m := range ms {
		names[i] = quantity.FormatCPU(m)
	}
	return strings.Join(names, ", ")
}
