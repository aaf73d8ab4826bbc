// Package stress is the `nodectl stress` command group.
package stress

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodectl/nodectl/analyzer"
	"github.com/nodectl/nodectl/cli/internal/console"
	"github.com/nodectl/nodectl/cli/internal/pathflags"
	"github.com/nodectl/nodectl/cli/internal/privilege"
	"github.com/nodectl/nodectl/cli/internal/remote"
	"github.com/nodectl/nodectl/host/daemons"
	"github.com/nodectl/nodectl/internal/badvalue"
	"github.com/nodectl/nodectl/internal/quantity"
	"github.com/nodectl/nodectl/rundir"
	st "github.com/nodectl/nodectl/stress"
	"github.com/nodectl/nodectl/stress/launch"
)

// New returns the stress command group.
func New() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "stress",
		Short: "Run stress scenarios on this node and explain what slowed the victim",
	}
	for _, c := range []*cobra.Command{noisy(), wake(), density(), fsyncStorm(), clean()} {
		run := c.RunE
		c.RunE = func(cmd *cobra.Command, args []string) error {
			return badvalue.Name(run(cmd, args), settingFlags)
		}
		cmd.AddCommand(c)
	}
	return cmd
}

// settingFlags are the flags that set the settings the packages below name in their errors.
var settingFlags = map[string]string{
	st.FieldHogs: "--hog", st.FieldCPULimits: "--cpu-limits", st.FieldTimeout: "--timeout", st.FieldTrace: "--trace",
	st.FieldTarget: "--target", st.FieldNodeMemory: "--node-memory", st.FieldHeartbeat: "--heartbeat",
	st.FieldSwapFile: "--swap", daemons.FieldDaemons: "--daemons", launch.FieldRuntime: "--runtime",
}

func noisy() *cobra.Command {
	var (
		hogs                 []string
		victimCPU, victimMem string
		victimRequest        string
		nodeMem              string
		daemonList           string
		cfg                  = st.NoisyConfig{RunOptions: st.RunOptions{Paths: st.DefaultPaths()}}
	)
	rf := runFlags{opts: &cfg.RunOptions}
	cmd := &cobra.Command{
		Use:   "noisy",
		Short: "Victim probe alone, then next to CPU, disk, memory or fsync neighbours",
		Long: `Runs the victim probe (a fixed piece of CPU work and a 64 MiB write + fsync every
second, each timed by the probe) alone for --baseline, then next to the hogs for --duration.
Every workload runs in its own cgroup under nodectl/<run-id>/ with its CPU and memory limits.
With --trace, eBPF programs record run-queue latency with the preempting cgroup, fsync latency
and block I/O per cgroup; the analyzer then names what slowed the victim.

Hog kinds: cpu (busy threads), disk (512 MiB sequential writes + fsync, like dd conv=fsync),
memory (allocates up to its limit and keeps touching it), fsync (4 KiB writes, fsync each),
churn (short-lived processes started continuously, threads=N at a time, like pod start-up).
LIMIT and SIZE use Kubernetes notation (250m, 1, 512Mi). No --hog is a quiet run.
A CPU request (request=, --victim-request; by default the CPU limit, as for a Guaranteed pod)
sets the cgroup's CPU weight as the kubelet does: below its limit, a workload gets that share
of a contended CPU, no more. Workloads with neither keep the kernel's default weight.
System daemons running on the node (--daemons) are followed in their own cgroups, which the
run samples and traces but never changes. --node-memory puts every workload under one memory
limit, as a node's memory bounds its pods: neighbours that fill it make the victim reclaim.

With --node NODE the victim and the hogs are pods on that node of the cluster, made through the
API server in a namespace of the run's own (nodectl-<run-id>), with the limits and requests
asked for (so their QoS class) and --runtime-class (gvisor for --runtime runsc), running the
node's agent's image. The node's agent records them; the window is pulled into --out (default
under the temporary directory) and explained with the pods named. The pods and the namespace
are deleted on every exit path; 'nodectl --node NODE stress clean' removes what a killed
nodectl left (your own runs: a run's rights are bound to its maker, in its namespace only). It
needs deploy/base's ClusterRole nodectl-stress and Role nodectl-user.`,
		Example: `  sudo nodectl stress noisy --hog cpu,count=2 --hog disk --trace
  nodectl --node gke-pool-1-abcd stress noisy --hog cpu,count=2,cpu=1 --victim-cpu 500m --runtime runsc
  sudo nodectl stress noisy --victim-cpu 250m --hog cpu,count=4,cpu=1 --trace -o json
  sudo nodectl stress noisy --node-memory 256Mi --hog memory,memory=224Mi --trace`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := rf.check(); err != nil {
				return err
			}
			for _, h := range hogs {
				spec, err := st.ParseHog(h)
				if err != nil {
					return err
				}
				cfg.Hogs = append(cfg.Hogs, spec)
			}
			var err error
			if victimCPU != "" {
				if cfg.VictimCPUMilli, err = quantity.ParseCPU(victimCPU); err != nil {
					return fmt.Errorf("--victim-cpu: %w", err)
				}
			}
			if victimRequest != "" {
				if cfg.VictimCPURequestMilli, err = quantity.ParseCPU(victimRequest); err != nil {
					return fmt.Errorf("--victim-request: %w", err)
				}
			}
			if cfg.VictimCPURequestMilli, err = st.CPURequest(cfg.VictimCPURequestMilli, cfg.VictimCPUMilli); err != nil {
				return fmt.Errorf("--victim-request: %w", err)
			}
			if victimMem != "" {
				if cfg.VictimMemBytes, err = quantity.ParseSize(victimMem); err != nil {
					return fmt.Errorf("--victim-memory: %w", err)
				}
			}
			if nodeMem != "" {
				if cfg.NodeMemBytes, err = quantity.ParseSize(nodeMem); err != nil {
					return fmt.Errorf("--node-memory: %w", err)
				}
				if cfg.NodeMemBytes < st.MinNodeMemory {
					return fmt.Errorf("--node-memory %s: must be at least %s, room for the victim probe's writes", nodeMem, quantity.FormatSize(st.MinNodeMemory))
				}
			}
			if cfg.Daemons, err = daemons.Parse(daemonList); err != nil {
				return err
			}
			if cfg.Baseline < time.Second {
				return fmt.Errorf("--baseline %s: must be at least 1s", cfg.Baseline)
			}
			if cfg.Duration < time.Second {
				return fmt.Errorf("--duration %s: must be at least 1s", cfg.Duration)
			}
			if remote.FromCommand(cmd).Node != "" {
				return clusterNoisy(cmd, &rf, cfg)
			}
			headline := fmt.Sprintf("noisy: baseline %s, stress %s, %d hog(s)", cfg.Baseline, cfg.Duration, countHogs(cfg.Hogs))
			return rf.runLocal(cmd, "nodectl stress noisy", "creating cgroups and moving workloads into them", headline,
				func(ctx context.Context) (string, error) { return st.Noisy(ctx, cfg) })
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&hogs, "hog", nil, "a neighbour: KIND[,count=N][,cpu=LIMIT][,request=CPU][,memory=SIZE][,target=PATH][,threads=N]; KIND is cpu, disk, memory, fsync or churn (repeatable)")
	f.StringVar(&victimCPU, "victim-cpu", "", "victim CPU limit (Kubernetes notation, e.g. 250m); unlimited if empty")
	f.StringVar(&victimRequest, "victim-request", "", "victim CPU request, which sets its cgroup's CPU weight as the kubelet does; default its --victim-cpu limit, else the kernel's default weight")
	f.StringVar(&victimMem, "victim-memory", "", "victim memory limit (e.g. 512Mi); unlimited if empty")
	f.StringVar(&nodeMem, "node-memory", "", "memory limit of the run's cgroup, above the victim's and the hogs' (e.g. 256Mi): an emulated node's memory, as in stress density, so a memory hog that grows there presses the victim into reclaim; unlimited if empty")
	f.DurationVar(&cfg.Baseline, "baseline", 20*time.Second, "how long the victim runs alone")
	f.DurationVar(&cfg.Duration, "duration", 30*time.Second, "how long the victim runs next to the hogs")
	f.DurationVar(&cfg.Heartbeat, "heartbeat", 0, "also run a heartbeat probe in a system cgroup, waking every PERIOD (--heartbeat alone: 1s) and recording how late it wakes, as a starved kubelet would")
	f.Lookup("heartbeat").NoOptDefVal = "1s"
	f.StringVar(&daemonList, "daemons", strings.Join(daemons.Default, ","), "system daemons to follow as workloads, by program name, comma-separated: each one's cgroup is sampled and traced in both phases; \"\" or none follows none")
	rf.register(f, "the victim and the hogs", "run queue with the preempting cgroup, fsync and block I/O per cgroup, reclaim and OOM kills", true)
	return remote.Supports(cmd)
}

func countHogs(hs []st.HogSpec) int {
	n := 0
	for _, h := range hs {
		n += h.Count
	}
	return n
}

// finish says where a run went and analyzes it (storing findings.json), or returns the run's
// error: a failed or interrupted run leaves its directory for a look, but no report.
func finish(cmd *cobra.Command, dir string, runErr error) (*analyzer.Report, error) {
	if dir != "" {
		fmt.Fprintf(cmd.ErrOrStderr(), "run directory: %s\n", dir)
	}
	if runErr != nil {
		return nil, runErr
	}
	run, err := rundir.Open(dir)
	if err != nil {
		return nil, err
	}
	return analyzeRun(run)
}

// analyzeRun analyzes a finished run and stores findings.json in its directory.
func analyzeRun(run *rundir.Run) (*analyzer.Report, error) {
	rep, err := analyzer.Analyze(run)
	if err != nil {
		return nil, err
	}
	if err := rundir.WriteFindings(run.Dir, rep); err != nil {
		return nil, err
	}
	return rep, nil
}

func clean() *cobra.Command {
	var all bool
	var output string
	paths := st.DefaultPaths()
	cmd := &cobra.Command{
		Use:   "clean [RUN_ID...]",
		Short: "Remove what killed runs left behind: cgroups under nodectl/, their processes, scratch files",
		Long: `Removes every run's cgroups under the nodectl parent (killing any process still in
them), its containers (deleted through the runtime's state the run kept), its scratch
directory, the nodectl-<run-id> directories it made below --target or target= directories,
its swap file (turned off first) and the sysctls it changed (restored), its state, and the
tracefs mount it made for its fsync tracer (unless another run is live); with RUN_IDs, only
those runs'. Runs whose nodectl
process is still alive are left alone unless --all is given.

With --node NODE it deletes, through the API server, the namespaces and pods of every stress
run of pods on that node ('nodectl --node NODE stress ...' labels them) that your rights reach:
your own runs (each run's rights are bound to its maker, in its namespace), every run for an
admin. Another's run is left alone, and its maker named.`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, ids []string) error {
			if err := console.CheckOutput(output); err != nil {
				return err
			}
			if node := remote.FromCommand(cmd).Node; node != "" {
				return cleanNode(cmd, node, ids, output)
			}
			if err := privilege.Need("nodectl stress clean", map[int]string{privilege.CapSysAdmin: "removing cgroups and killing their processes"}); err != nil {
				return err
			}
			rep, err := st.Clean(cmd.Context(), paths, ids, all, console.Logger(cmd.ErrOrStderr(), false))
			if output == "json" {
				if jerr := json.NewEncoder(cmd.OutOrStdout()).Encode(rep); jerr != nil {
					return errors.Join(err, fmt.Errorf("writing the report: %w", jerr))
				}
			} else {
				for _, r := range rep.Removed {
					fmt.Fprintf(cmd.OutOrStdout(), "removed %s\n", r)
				}
				for _, s := range rep.Skipped {
					fmt.Fprintf(cmd.OutOrStdout(), "skipped live run %s (use --all to remove it too)\n", s)
				}
				if len(rep.Removed) == 0 && len(rep.Skipped) == 0 && err == nil {
					fmt.Fprintln(cmd.OutOrStdout(), "nothing to clean")
				}
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "also remove runs whose nodectl process is still alive")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	pathflags.HostPathFlags(cmd.Flags(), &paths.FS)
	pathflags.RunPathFlags(cmd.Flags(), &paths)
	return remote.Supports(cmd)
}
