package workload

import (
	"context"
	"os"

	"github.com/spf13/cobra"

	wl "github.com/nodectl/nodectl/stress/workload"
)

func sandbox() *cobra.Command {
	cfg := wl.SandboxConfig{}
	cmd := &cobra.Command{
		Use:   "sandbox",
		Short: "A headless-browser stand-in: steady anonymous heap, a shared mapped binary, periodic activity bursts",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			e := wl.NewEmitter(os.Stdout)
			return run(func(ctx context.Context) error { return wl.Sandbox(ctx, cfg, e) })
		},
	}
	f := cmd.Flags()
	f.Int64Var(&cfg.HeapBytes, "memory", wl.DefaultSandboxHeap, "bytes of anonymous heap to allocate and hold")
	f.Float64Var(&cfg.HotShare, "hot-share", wl.DefaultSandboxHotShare, "share of the heap each activity burst touches")
	f.StringVar(&cfg.Binary, "binary", "", "shared file to map and read as the sandbox's binary; none if empty")
	f.Float64Var(&cfg.BinaryShare, "binary-share", wl.DefaultSandboxBinaryShare, "share of the binary each burst reads")
	f.DurationVar(&cfg.Activity, "activity", wl.DefaultSandboxActivity, "time between activity bursts")
	f.IntVar(&cfg.BurstRounds, "burst-work", wl.DefaultSandboxBurstRounds, "rounds of CPU work per burst")
	f.DurationVar(&cfg.Tick, "tick", wl.DefaultSandboxTick, "event-loop tick whose lateness is recorded")
	return cmd
}
