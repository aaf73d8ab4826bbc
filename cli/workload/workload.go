// Package workload is the hidden `nodectl workload` command group: the bodies of stress
// workloads, run by the launcher as children of nodectl in their own cgroups.
package workload

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/nodectl/nodectl/cli/internal/interrupt"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/nodectl/nodectl/internal/atomicfile"
	"github.com/nodectl/nodectl/stress/launch"
	wl "github.com/nodectl/nodectl/stress/workload"
)

// New returns the hidden workload command group.
func New() *cobra.Command {
	cmd := &cobra.Command{
		Use:    wl.Group,
		Short:  "Run one stress workload in this process (used by the stress driver)",
		Hidden: true,
	}
	for _, w := range []struct {
		cfg   wl.Config // for its name
		short string
	}{
		{&wl.VictimConfig{}, "The victim probe: fixed CPU work and a write + fsync every interval, timed"},
		{&wl.CPUHogConfig{}, "Keep threads busy"},
		{&wl.DiskHogConfig{}, "Write large files sequentially and fsync each, in a loop"},
		{&wl.FsyncHogConfig{}, "Write small blocks and fsync each, in a loop"},
		{&wl.MemoryHogConfig{}, "Allocate memory and keep touching every page"},
		{&wl.HeartbeatConfig{}, "Wake up every period, like a node daemon's status update, and record how late each wake-up was"},
		{&wl.ChurnConfig{}, "Start and stop short-lived processes continuously, as pod start-up churn does"},
		{&wl.WakeConfig{}, "A sandbox woken by a request: boot, answer the request pending on standard input, stay up"},
		{&wl.FsyncWriterConfig{}, "One writer of an fsync storm: for each go line on standard input, write a file, fsync it, report the time to durable"},
		{&wl.SandboxConfig{}, "A headless-browser stand-in: steady anonymous heap, a shared mapped binary, periodic activity bursts"},
	} {
		cmd.AddCommand(command(w.cfg.Name(), w.short))
	}
	cmd.AddCommand(execIn(), install())
	return cmd
}

// install copies this executable into a directory, as DIR/nodectl: an init container of the
// agent's image gives a pod of the user's image its nodectl so (a static binary runs anywhere).
func install() *cobra.Command {
	return &cobra.Command{
		Use:   wl.Install + " DIR",
		Short: "Copy nodectl into DIR, for a container of another image to run it",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			self, err := os.Executable()
			if err != nil {
				return err
			}
			return copyExecutable(self, filepath.Join(args[0], "nodectl"))
		},
	}
}

// copyExecutable copies src to dst, executable by all, written whole or not at all.
func copyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := atomicfile.Create(dst, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Abort()
		return fmt.Errorf("copying %s: %w", src, err)
	}
	return out.Commit()
}

// command runs one workload. Its flags are read by wl.Parse, the reader of the command line
// the stress driver writes, not by cobra.
func command(name, short string) *cobra.Command {
	return &cobra.Command{
		Use:                name,
		Short:              short,
		DisableFlagParsing: true,
		RunE: func(_ *cobra.Command, args []string) error {
			c, err := wl.Parse(append([]string{wl.Group, name}, args...))
			if errors.Is(err, pflag.ErrHelp) {
				return nil
			}
			if err != nil {
				return err
			}
			return run(c.Config)
		},
	}
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

// run waits for the launcher's go, then runs the workload until SIGTERM, SIGINT or SIGHUP.
func run(cfg wl.Config) error {
	ctx, stop := signal.NotifyContext(context.Background(), interrupt.Signals...)
	defer stop()
	if err := launch.WaitStart(ctx); err != nil {
		return err
	}
	e := wl.NewEmitter(os.Stdout)
	switch c := cfg.(type) {
	case *wl.VictimConfig:
		return wl.Victim(ctx, *c, e)
	case *wl.CPUHogConfig:
		return wl.CPUHog(ctx, c.Threads)
	case *wl.DiskHogConfig:
		return wl.DiskHog(ctx, *c)
	case *wl.FsyncHogConfig:
		return wl.FsyncHog(ctx, c.Dir, c.BlockBytes)
	case *wl.MemoryHogConfig:
		return wl.MemoryHog(ctx, c.Bytes)
	case *wl.HeartbeatConfig:
		return wl.Heartbeat(ctx, c.Period, e)
	case *wl.ChurnConfig:
		self, err := os.Executable()
		if err != nil {
			return fmt.Errorf("churn: finding this binary: %w", err)
		}
		// Each process is this binary printing its version: a real Go process start and exit.
		return wl.Churn(ctx, []string{self, "version"}, c.Parallel, e)
	case *wl.WakeConfig:
		var in io.Reader = os.Stdin
		if c.Pending {
			in = strings.NewReader("wake\n")
		}
		return wl.Wake(ctx, c.BootRounds, in, e)
	case *wl.FsyncWriterConfig:
		return wl.FsyncWriter(ctx, *c, os.Stdin, e)
	case *wl.SandboxConfig:
		return wl.Sandbox(ctx, *c, e)
	}
	return fmt.Errorf("workload %s has no body", cfg.Name())
}
