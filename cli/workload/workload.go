// Package workload is the hidden `nodectl workload` command group: the bodies of stress
// workloads, run by the launcher as children of nodectl in their own cgroups.
package workload

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodectl/nodectl/stress/launch"
	wl "github.com/nodectl/nodectl/stress/workload"
)

// New returns the hidden workload command group.
func New() *cobra.Command {
	cmd := &cobra.Command{
		Use:    "workload",
		Short:  "Run one stress workload in this process (used by the stress driver)",
		Hidden: true,
	}
	// The run a workload belongs to; unused by the bodies, it makes each process of a run
	// recognisable in ps.
	cmd.PersistentFlags().String("run", "", "id of the run this workload belongs to")
	cmd.AddCommand(victim(), cpuHog(), diskHog(), fsyncHog(), memoryHog(), heartbeat(), churn(), wake(), fsyncWriter(), sandbox(), execIn())
	return cmd
}

// execIn becomes another program once the launcher has placed this process in its cgroup: how
// a container runtime's own process is started inside a given cgroup.
func execIn() *cobra.Command {
	return &cobra.Command{
		Use:   "exec -- PROGRAM [ARG...]",
		Short: "Wait to be placed in a cgroup, then execute PROGRAM there",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			if err := launch.WaitStart(context.Background()); err != nil {
				return err
			}
			path, err := exec.LookPath(args[0])
			if err != nil {
				return err
			}
			return syscall.Exec(path, args, os.Environ())
		},
	}
}

// run waits for the launcher's go, then runs body until SIGTERM or SIGINT.
func run(body func(ctx context.Context) error) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := launch.WaitStart(ctx); err != nil {
		return err
	}
	return body(ctx)
}

func victim() *cobra.Command {
	cfg := wl.VictimConfig{}
	cmd := &cobra.Command{
		Use:   "victim",
		Short: "The victim probe: fixed CPU work and a write + fsync every interval, timed",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			e := wl.NewEmitter(os.Stdout)
			return run(func(ctx context.Context) error { return wl.Victim(ctx, cfg, e) })
		},
	}
	cmd.Flags().StringVar(&cfg.Dir, "dir", os.TempDir(), "directory to write the probe file in")
	cmd.Flags().DurationVar(&cfg.Interval, "interval", time.Second, "one iteration per interval")
	cmd.Flags().IntVar(&cfg.WorkRounds, "work-rounds", wl.DefaultWorkRounds, "size of the fixed CPU work")
	cmd.Flags().Int64Var(&cfg.WriteBytes, "write-bytes", wl.DefaultWriteBytes, "bytes written and fsynced per iteration")
	return cmd
}

func cpuHog() *cobra.Command {
	var threads int
	cmd := &cobra.Command{
		Use:   "cpu-hog",
		Short: "Keep threads busy",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return run(func(ctx context.Context) error { return wl.CPUHog(ctx, threads) })
		},
	}
	cmd.Flags().IntVar(&threads, "threads", 1, "busy threads")
	return cmd
}

func diskHog() *cobra.Command {
	cfg := wl.DiskHogConfig{}
	cmd := &cobra.Command{
		Use:   "disk-hog",
		Short: "Write large files sequentially and fsync each, in a loop",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return run(func(ctx context.Context) error { return wl.DiskHog(ctx, cfg) })
		},
	}
	cmd.Flags().StringVar(&cfg.Dir, "dir", os.TempDir(), "directory to write in")
	cmd.Flags().Int64Var(&cfg.FileBytes, "file-bytes", wl.DefaultDiskHogFileBytes, "bytes per file before its fsync")
	return cmd
}

func fsyncHog() *cobra.Command {
	var dir string
	var block int
	cmd := &cobra.Command{
		Use:   "fsync-hog",
		Short: "Write small blocks and fsync each, in a loop",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return run(func(ctx context.Context) error { return wl.FsyncHog(ctx, dir, block) })
		},
	}
	cmd.Flags().StringVar(&dir, "dir", os.TempDir(), "directory to write in")
	cmd.Flags().IntVar(&block, "block-bytes", 4096, "bytes written before each fsync")
	return cmd
}

func memoryHog() *cobra.Command {
	var size int64
	cmd := &cobra.Command{
		Use:   "memory-hog",
		Short: "Allocate memory and keep touching every page",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return run(func(ctx context.Context) error { return wl.MemoryHog(ctx, size) })
		},
	}
	cmd.Flags().Int64Var(&size, "bytes", 256<<20, "bytes to allocate and keep touching")
	return cmd
}

func heartbeat() *cobra.Command {
	var period time.Duration
	cmd := &cobra.Command{
		Use:   "heartbeat",
		Short: "Wake up every period, like a node daemon's status update, and record how late each wake-up was",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			e := wl.NewEmitter(os.Stdout)
			return run(func(ctx context.Context) error { return wl.Heartbeat(ctx, period, e) })
		},
	}
	cmd.Flags().DurationVar(&period, "period", time.Second, "time between heartbeats")
	return cmd
}

func churn() *cobra.Command {
	var parallel int
	cmd := &cobra.Command{
		Use:   "churn",
		Short: "Start and stop short-lived processes continuously, as pod start-up churn does",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			self, err := os.Executable()
			if err != nil {
				return fmt.Errorf("churn: finding this binary: %w", err)
			}
			e := wl.NewEmitter(os.Stdout)
			// Each process is this binary printing its version: a real Go process start and exit.
			return run(func(ctx context.Context) error { return wl.Churn(ctx, []string{self, "version"}, parallel, e) })
		},
	}
	cmd.Flags().IntVar(&parallel, "parallel", 2, "processes running at a time")
	return cmd
}

func wake() *cobra.Command {
	var rounds int
	cmd := &cobra.Command{
		Use:   "wake",
		Short: "A sandbox woken by a request: boot, answer the request pending on standard input, stay up",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			e := wl.NewEmitter(os.Stdout)
			return run(func(ctx context.Context) error { return wl.Wake(ctx, rounds, os.Stdin, e) })
		},
	}
	cmd.Flags().IntVar(&rounds, "boot-work", wl.DefaultBootRounds, "rounds of CPU work the boot does before answering")
	return cmd
}
