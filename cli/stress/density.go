package stress

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"

	"github.com/nodectl/nodectl/cli/internal/podrun"
	"github.com/nodectl/nodectl/cli/internal/remote"
	"github.com/nodectl/nodectl/internal/quantity"
	"github.com/nodectl/nodectl/rundir"
	st "github.com/nodectl/nodectl/stress"
	"github.com/nodectl/nodectl/stress/workload"
)

// maxDensity bounds --max: each sandbox is a process and a cgroup.
const maxDensity = 10000

func density() *cobra.Command {
	var (
		sandboxMem, request, limit, nodeMem, binarySize, swap string
		cpuRequest, cpuLimit, image, imageBinary              string
		cfg                                                   = st.DensityConfig{RunOptions: st.RunOptions{Paths: st.DefaultPaths()}, Criteria: st.DefaultDensityCriteria}
	)
	rf := runFlags{opts: &cfg.RunOptions}
	cmd := &cobra.Command{
		Use:   "density",
		Short: "Add browser-like sandboxes in steps until the node collapses, and say what bounded it",
		Long: `Adds sandbox stand-ins, --step at a time (--pace apart), until a step collapses or --max
is reached. Each sandbox (sandbox-<i>, in cgroup nodectl/<run-id>/sandbox-<i> with --limit)
models a headless browser: --sandbox-memory of anonymous heap held steadily, a shared
file-backed binary (--binary-size, one file per run) it maps and reads, and an activity burst
every --activity that touches --hot-share of its heap and part of the binary. Its readiness is
the time from its launch to its first ready heartbeat; its event loop records how late each
1 s tick wakes.

--node-memory emulates a smaller node: the whole run sits under one cgroup with that memory
limit (swap allowed). --swap FILE:SIZE creates and enables a swap file for the run, and
--swappiness / --watermark-scale-factor set those sysctls (the seed used 100 and 500); all of
it is put back when the run ends, fails or is interrupted, and by 'stress clean' after a kill.

Each step is a phase step-<density>: its sandboxes start, become ready, and the density is held
for --step-duration. A step collapses when a criterion is crossed: its sandboxes' readiness p99
over --collapse-readiness (or one never ready within --ready-timeout), the node cgroup's memory
PSI full over --collapse-psi-full of the step's time, an OOM kill (--collapse-oom), or a tick
late by more than --collapse-tick-gap. The report is a table of density × readiness × memory
signals, the collapse, and the ceiling: which resource bounded the density.

--cpu-request and --cpu-limit give each sandbox a CPU request (its cgroup's weight) and limit
(its CFS quota), as a pod's.

With --node NODE the sandboxes are pods on that node of the cluster (sandbox-<i> in a namespace
of the run's own), with --request and --limit as their memory request and limit, --cpu-request
and --cpu-limit as their CPU's, and --runtime-class (gvisor for --runtime runsc), running the node's agent's image and mapping its
nodectl binary as their shared binary; or, with --image, your image (a browser's, say), mapping
its file --image-binary, with nodectl copied into the pod from the agent's image. A pod is ready when the kubelet reports it running and
its sandbox has said it is ready (timed by nodectl's clock, reading pod status every 0.5 s).
A step also collapses when the kubelet refuses a pod at admission (OutOfpods, OutOfmemory,
OutOfcpu: the node's bookings are the ceiling), evicts one, when the node's Lease is renewed
later than its renew interval by more than --collapse-lease-late, or when the Node leaves Ready.
Memory pressure is the node's, from its agent, which records the sweep; the report is the same,
with the node's memory as /proc/meminfo gives it, and what the node books (its pods' requests
against its allocatable, from the agent): a node booked full while its CPUs idle is
cpu-booking-ceiling. --node-memory, --swap, --swappiness,
--watermark-scale-factor and --binary-size are for a local sweep only. Everything is deleted on
every exit path ('nodectl --node NODE stress clean' after a kill).`,
		Example: `  sudo nodectl stress density --node-memory 4Gi --sandbox-memory 200Mi --step 2 --max 40
  sudo nodectl stress density --node-memory 4Gi --swap /var/tmp/nodectl.swap:4Gi --swappiness 100 --watermark-scale-factor 500 -o json
  nodectl --node gke-pool-1-abcd stress density --sandbox-memory 200Mi --request 150Mi --limit 2Gi --step 10 --max 250 --runtime runsc`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := rf.check(); err != nil {
				return err
			}
			if err := parseDensityFlags(&cfg, sandboxMem, request, limit, nodeMem, binarySize, swap); err != nil {
				return err
			}
			if err := parseSandboxCPU(&cfg, cpuRequest, cpuLimit); err != nil {
				return err
			}
			if remote.FromCommand(cmd).Node != "" {
				return clusterDensity(cmd, &rf, cfg, image, imageBinary)
			}
			if image != "" || imageBinary != "" {
				return fmt.Errorf("--image %q, --image-binary %q: only with --%s (a local sandbox maps a file of --binary-size)", image, imageBinary, remote.FlagNode)
			}
			node := "this host"
			if cfg.NodeMemory > 0 {
				node = "a node of " + quantity.FormatSize(cfg.NodeMemory)
			}
			headline := fmt.Sprintf("density: sandboxes of %s, %d per step up to %d, on %s", quantity.FormatSize(cfg.SandboxMemory), cfg.Step, cfg.Max, node)
			return rf.runLocal(cmd, "nodectl stress density", "creating cgroups, swap and sysctls", headline,
				func(ctx context.Context) (string, error) { return st.Density(ctx, cfg) })
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Step, "step", 10, "sandboxes added per step")
	f.IntVar(&cfg.Max, "max", 200, "the sweep stops after the step that reaches this many sandboxes")
	f.DurationVar(&cfg.Pace, "pace", 200*time.Millisecond, "time between two sandbox launches within a step")
	f.DurationVar(&cfg.StepDuration, "step-duration", 30*time.Second, "how long each step holds its density once its sandboxes are ready")
	f.DurationVar(&cfg.ReadyTimeout, "ready-timeout", st.DefaultReadyTimeout, "how long a sandbox may take to become ready")
	f.StringVar(&sandboxMem, "sandbox-memory", "200Mi", "anonymous heap each sandbox allocates and holds (Kubernetes notation)")
	f.Float64Var(&cfg.HotShare, "hot-share", workload.DefaultSandboxHotShare, "share of its heap each activity burst touches; the rest stays cold (swappable)")
	f.StringVar(&binarySize, "binary-size", quantity.FormatSize(st.DefaultBinaryBytes), "size of the shared binary every sandbox maps")
	f.DurationVar(&cfg.Activity, "activity", workload.DefaultSandboxActivity, "time between a sandbox's activity bursts")
	f.StringVar(&request, "request", "150Mi", "each sandbox's memory request: recorded, and the ceiling says how many a scheduler would admit by it")
	f.StringVar(&limit, "limit", "2Gi", "each sandbox's memory limit (its cgroup's); \"\" for none")
	f.StringVar(&cpuRequest, "cpu-request", "", "each sandbox's CPU request (Kubernetes notation, e.g. 50m): its cgroup's CPU weight, as the kubelet sets it, and with --node what the node books for it; none if empty")
	f.StringVar(&cpuLimit, "cpu-limit", "", "each sandbox's CPU limit (e.g. 1): its CFS quota; none if empty")
	f.StringVar(&image, "image", "", "with --node: the sandbox pods' image (e.g. your browser's); nodectl runs in it, copied from the agent's image by an init container; needs --image-binary")
	f.StringVar(&imageBinary, "image-binary", "", "with --image: the file of that image each sandbox maps and reads, its page cache shared by all (e.g. /usr/lib/chromium/chromium)")
	f.StringVar(&nodeMem, "node-memory", "", "emulate a node of SIZE: the run's cgroup gets this memory limit (swap allowed); required unless every sandbox fits in this host")
	f.StringVar(&swap, "swap", "", "FILE:SIZE: create and enable a swap file for the run (FILE must not exist; removed afterwards); or DEVICE: a block device formatted with mkswap, turned on for the run and off afterwards (never formatted)")
	f.IntVar(&cfg.Swappiness, "swappiness", -1, "set vm.swappiness (0-200) for the run; -1 leaves it")
	f.IntVar(&cfg.WatermarkScaleFactor, "watermark-scale-factor", -1, "set vm.watermark_scale_factor (1-3000) for the run; -1 leaves it")
	f.DurationVar(&cfg.Criteria.ReadinessP99, "collapse-readiness", cfg.Criteria.ReadinessP99, "collapse when a step's readiness p99 is above this; 0 turns it off")
	f.Float64Var(&cfg.Criteria.PSIFull, "collapse-psi-full", cfg.Criteria.PSIFull, "collapse when the node's memory PSI full is above this share of a step (0-1); 0 turns it off")
	f.BoolVar(&cfg.Criteria.OOMKill, "collapse-oom", cfg.Criteria.OOMKill, "collapse at the first OOM kill")
	f.DurationVar(&cfg.Criteria.TickGap, "collapse-tick-gap", cfg.Criteria.TickGap, "collapse when a sandbox's tick is later than this; 0 turns it off")
	f.DurationVar(&cfg.Criteria.LeaseLate, "collapse-lease-late", cfg.Criteria.LeaseLate, "with --node: collapse when the node's Lease is renewed later than its renew interval by more than this; 0 turns it off")
	rf.register(f, "the sandboxes", "every program: run queue, fsync, block I/O, reclaim and OOM kills", true)
	return remote.Supports(cmd)
}

// parseSandboxCPU reads --cpu-request and --cpu-limit; a request above the limit is refused, as
// the API server refuses such a pod.
func parseSandboxCPU(cfg *st.DensityConfig, request, limit string) error {
	var err error
	if request != "" {
		if cfg.CPURequestMilli, err = quantity.ParseCPU(request); err != nil {
			return fmt.Errorf("--cpu-request: %w", err)
		}
	}
	if limit != "" {
		if cfg.CPULimitMilli, err = quantity.ParseCPU(limit); err != nil {
			return fmt.Errorf("--cpu-limit: %w", err)
		}
		if cfg.CPURequestMilli > cfg.CPULimitMilli {
			return fmt.Errorf("--cpu-request %s: is above --cpu-limit %s", request, limit)
		}
	}
	return nil
}

// parseDensityFlags checks the sizes, counts and bounds, naming the flag and what is allowed.
func parseDensityFlags(cfg *st.DensityConfig, sandboxMem, request, limit, nodeMem, binarySize, swap string) error {
	var err error
	if cfg.Step < 1 || cfg.Step > maxDensity {
		return fmt.Errorf("--step %d: want an integer from 1 to %d", cfg.Step, maxDensity)
	}
	if cfg.Max < cfg.Step || cfg.Max > maxDensity {
		return fmt.Errorf("--max %d: want an integer from --step (%d) to %d", cfg.Max, cfg.Step, maxDensity)
	}
	if cfg.Pace < 0 {
		return fmt.Errorf("--pace %s: must not be negative", cfg.Pace)
	}
	if cfg.StepDuration < time.Second {
		return fmt.Errorf("--step-duration %s: must be at least 1s", cfg.StepDuration)
	}
	if cfg.ReadyTimeout < time.Second {
		return fmt.Errorf("--ready-timeout %s: must be at least 1s", cfg.ReadyTimeout)
	}
	if cfg.SandboxMemory, err = quantity.ParseSize(sandboxMem); err != nil {
		return fmt.Errorf("--sandbox-memory: %w", err)
	}
	if cfg.HotShare <= 0 || cfg.HotShare > 1 {
		return fmt.Errorf("--hot-share %g: want a share above 0 and at most 1", cfg.HotShare)
	}
	if cfg.BinaryBytes, err = quantity.ParseSize(binarySize); err != nil {
		return fmt.Errorf("--binary-size: %w", err)
	}
	if cfg.Activity < 100*time.Millisecond {
		return fmt.Errorf("--activity %s: must be at least 100ms", cfg.Activity)
	}
	if cfg.RequestBytes, err = quantity.ParseSize(request); err != nil {
		return fmt.Errorf("--request: %w", err)
	}
	if limit != "" {
		if cfg.LimitBytes, err = quantity.ParseSize(limit); err != nil {
			return fmt.Errorf("--limit: %w", err)
		}
		if cfg.LimitBytes <= cfg.SandboxMemory {
			return fmt.Errorf("--limit %s: must be above --sandbox-memory %s, or the sandbox's own limit kills it", limit, sandboxMem)
		}
		if cfg.RequestBytes > cfg.LimitBytes {
			return fmt.Errorf("--request %s: is above --limit %s", request, limit)
		}
	}
	if nodeMem != "" {
		if cfg.NodeMemory, err = quantity.ParseSize(nodeMem); err != nil {
			return fmt.Errorf("--node-memory: %w", err)
		}
		if cfg.NodeMemory <= cfg.SandboxMemory+cfg.BinaryBytes {
			return fmt.Errorf("--node-memory %s: must hold at least one sandbox (--sandbox-memory %s) and the binary (--binary-size %s)", nodeMem, sandboxMem, binarySize)
		}
	}
	if swap != "" {
		file, size, ok := strings.Cut(swap, ":")
		if !filepath.IsAbs(file) || filepath.Clean(file) != file {
			return fmt.Errorf("--swap %q: want FILE:SIZE with an absolute FILE, e.g. /var/tmp/nodectl.swap:4Gi, or a block device formatted with mkswap, e.g. /dev/nvme1n1", swap)
		}
		if ok {
			if cfg.SwapBytes, err = quantity.ParseSize(size); err != nil {
				return fmt.Errorf("--swap %q: %w", swap, err)
			}
		} else if fi, err := os.Stat(file); err != nil || fi.Mode()&os.ModeDevice == 0 || fi.Mode()&os.ModeCharDevice != 0 {
			return fmt.Errorf("--swap %q: not a block device; for a swap file the run makes, give its size: FILE:SIZE", swap)
		}
		cfg.SwapFile = file
	}
	if cfg.Swappiness < -1 || cfg.Swappiness > 200 {
		return fmt.Errorf("--swappiness %d: want 0 to 200, or -1 to leave it", cfg.Swappiness)
	}
	if cfg.WatermarkScaleFactor == 0 || cfg.WatermarkScaleFactor < -1 || cfg.WatermarkScaleFactor > 3000 {
		return fmt.Errorf("--watermark-scale-factor %d: want 1 to 3000, or -1 to leave it", cfg.WatermarkScaleFactor)
	}
	if cfg.Criteria.PSIFull < 0 || cfg.Criteria.PSIFull > 1 {
		return fmt.Errorf("--collapse-psi-full %g: want a share from 0 to 1", cfg.Criteria.PSIFull)
	}
	if cfg.Criteria.ReadinessP99 < 0 || cfg.Criteria.TickGap < 0 || cfg.Criteria.LeaseLate < 0 {
		return fmt.Errorf("--collapse-readiness, --collapse-tick-gap and --collapse-lease-late must not be negative")
	}
	return nil
}

// densityLocalFlags are density's flags that change this host, not a node of a cluster: the
// node is the one it is, and its swap and sysctls are the tuner's (nodectl tune).
var densityLocalFlags = []string{"swap", "swappiness", "watermark-scale-factor", "binary-size"}

// clusterDensity adds sandbox pods to --node in steps until the node collapses (stress.DensityOn
// on podrun's placement), as the local sweep does with processes: readiness from the pods'
// status and their sandboxes' first ready line, the kubelet's refusals and evictions, OOM
// kills, the Node's Ready condition and its Lease renewals from the API server, memory
// pressure from the node's agent. The agent's window of the whole sweep, with the steps as
// phases, is written as a density run and analyzed.
func clusterDensity(cmd *cobra.Command, rf *runFlags, cfg st.DensityConfig, image, imageBinary string) error {
	switch {
	case image != "" && !filepath.IsAbs(imageBinary):
		return fmt.Errorf("--image-binary %q: --image needs the absolute path of a file in it for each sandbox to map, e.g. /usr/lib/chromium/chromium", imageBinary)
	case image == "" && imageBinary != "":
		return fmt.Errorf("--image-binary %s: only with --image (without it the sandboxes map the agent's nodectl)", imageBinary)
	}
	for _, name := range densityLocalFlags {
		if f := cmd.Flags().Lookup(name); f != nil && f.Changed {
			return fmt.Errorf("--%s: not with --%s (a node's swap and sysctls are set by nodectl tune; its sandboxes map the image's nodectl binary)", name, remote.FlagNode)
		}
	}
	lease := remote.Permission{Verb: "get", Group: "coordination.k8s.io", Resource: "leases", Namespace: corev1.NamespaceNodeLease, Role: remote.RoleStress}
	return rf.runPods(cmd, rundir.ScenarioDensity, cfg.Span(), func(node string) string {
		return fmt.Sprintf("density on node %s: sandbox pods of %s (request %s, limit %s), %d per step up to %d", node,
			quantity.FormatSize(cfg.SandboxMemory), quantity.FormatSize(cfg.RequestBytes), quantity.FormatSize(cfg.LimitBytes), cfg.Step, cfg.Max)
	}, func(ctx context.Context, p *podrun.Placement, line *st.LiveLine) error {
		if image != "" {
			p.SandboxImage(image, imageBinary)
		}
		return st.DensityOn(ctx, cfg, p, line)
	}, lease)
}
