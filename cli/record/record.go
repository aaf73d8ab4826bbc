// Package record is `nodectl record`: trace and sample the whole node while the user runs
// their own load.
package record

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodectl/nodectl/cli/internal/console"
	"github.com/nodectl/nodectl/cli/internal/interrupt"
	"github.com/nodectl/nodectl/cli/internal/pathflags"
	"github.com/nodectl/nodectl/cli/internal/privilege"
	"github.com/nodectl/nodectl/host"
	"github.com/nodectl/nodectl/record"
)

// New returns the record command.
func New() *cobra.Command {
	cfg := record.Config{}
	cfg.Host = host.Default()
	var verbose bool
	cmd := &cobra.Command{
		Use:   "record --duration D --out DIR",
		Short: "Trace and sample the whole node for a while; then 'nodectl analyze DIR' ranks cgroups",
		Long: `Attaches the eBPF tracer (run-queue latency with the preempting cgroup, fsync and block
I/O per cgroup) and the cgroup and system samplers to the whole node for --duration, writing a
run directory. Run your own load meanwhile. 'nodectl analyze DIR' then ranks cgroups by
run-queue wait, fsync latency and I/O. Ctrl-C ends the recording early and keeps it.`,
		Example: `  sudo nodectl record --duration 60s --out /tmp/rec1 && nodectl analyze /tmp/rec1`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.Out == "" {
				return fmt.Errorf("--out is required: the run directory to write")
			}
			if cfg.Duration < time.Second {
				return fmt.Errorf("--duration %s: must be at least 1s", cfg.Duration)
			}
			if cfg.Interval < 100*time.Millisecond {
				return fmt.Errorf("--interval %s: must be at least 100ms", cfg.Interval)
			}
			if err := privilege.Need("nodectl record", map[int]string{
				privilege.CapBPF: "loading the eBPF programs", privilege.CapPerfmon: "attaching them to tracepoints",
				privilege.CapSysAdmin: "reading every cgroup's and task's cgroup identity"}); err != nil {
				return err
			}
			ctx, stop := interrupt.SignalContext(cmd.Context(), cmd.ErrOrStderr())
			defer stop()
			cfg.Args = os.Args
			cfg.Log = console.Logger(cmd.ErrOrStderr(), verbose)
			tty := console.IsTerminal(os.Stderr)
			cfg.Progress = func(el time.Duration, n int) {
				if tty {
					fmt.Fprintf(cmd.ErrOrStderr(), "\rrecording %s / %s, %d records", el.Round(time.Second), cfg.Duration, n)
				}
			}
			dir, err := record.Run(ctx, cfg)
			if tty {
				fmt.Fprintln(cmd.ErrOrStderr())
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "recorded %s; explain it with: nodectl analyze %s\n", dir, dir)
			return nil
		},
	}
	f := cmd.Flags()
	f.DurationVar(&cfg.Duration, "duration", 30*time.Second, "how long to record")
	f.StringVar(&cfg.Out, "out", "", "run directory to write (must not exist or be empty)")
	f.DurationVar(&cfg.Interval, "interval", time.Second, "sampling interval")
	f.IntVar(&cfg.MaxCgroups, "max-cgroups", 1000, "most cgroups the cgroup sampler follows")
	f.BoolVarP(&verbose, "verbose", "v", false, "log debug detail to stderr")
	pathflags.HostPathFlags(f, &cfg.Host)
	return cmd
}
