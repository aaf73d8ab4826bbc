// Package analyze is `nodectl analyze RUN` and `nodectl analyze --from T1 --to T2` (a window
// of the agent's flight recorder).
package analyze

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodectl/nodectl/agent/recorded"
	"github.com/nodectl/nodectl/analyzer"
	"github.com/nodectl/nodectl/cli/internal/agentsrc"
	"github.com/nodectl/nodectl/cli/internal/console"
	"github.com/nodectl/nodectl/cli/internal/gate"
	"github.com/nodectl/nodectl/cli/internal/remote"
	"github.com/nodectl/nodectl/report"
	"github.com/nodectl/nodectl/rundir"
)

// New returns the analyze command.
func New() *cobra.Command {
	var output, from, to, cgroup, html string
	var baseline time.Duration
	var src agentsrc.Flags
	var g gate.Flags
	cmd := &cobra.Command{
		Use:   "analyze RUN | analyze --from T1 --to T2",
		Short: "Explain a recorded run: findings with kernel evidence, and a summary table",
		Long: `Reads a run directory written by 'nodectl stress' or 'nodectl record', compares the
victim's stress phase with its baseline, and prints findings (cpu-contention, cpu-throttling,
disk-contention, ...) with their evidence and culprits. The report is also stored as
findings.json in the run directory. Runs need no privileges to analyze.

With --from and --to instead of RUN, it analyzes that window of the agent's flight recorder
against the --baseline before it: through the running agent, or from --data-dir.`,
		Example: `  nodectl analyze /var/lib/nodectl/runs/noisy-20261201-030000
  sudo nodectl analyze --from 30m --to 20m
  nodectl analyze --data-dir /mnt/node-disk/var/lib/nodectl/agent --from 2026-12-01T03:00:00Z --to 2026-12-01T03:05:00Z -o json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := console.CheckOutput(output); err != nil {
				return err
			}
			if err := g.Check(); err != nil {
				return err
			}
			if from != "" || cmd.Flags().Changed("to") {
				if len(args) > 0 {
					return errors.New("give a RUN directory or --from and --to, not both")
				}
				w, err := agentsrc.ParseWindow(from, to, baseline, cgroup, time.Now())
				if err != nil {
					return err
				}
				rec, err := agentsrc.Open(cmd, src)
				if err != nil {
					return err
				}
				defer rec.Close()
				rep, err := agentsrc.Explain(cmd.Context(), rec, w, html)
				if err != nil {
					return err
				}
				if err := console.Render(cmd.OutOrStdout(), rep, output); err != nil {
					return err
				}
				return g.Apply(rep, "analyze")
			}
			if len(args) == 0 {
				return errors.New("give a RUN directory, or --from and --to for a window of the agent's flight recorder")
			}
			if remote.FromCommand(cmd).Node != "" {
				return fmt.Errorf("--%s: RUN is a directory on this machine; for a window of the node's agent give --from and --to (or pull it with: nodectl --node NODE agent export)", remote.FlagNode)
			}
			run, err := rundir.Open(args[0])
			if err != nil {
				return err
			}
			rep, err := analyzer.Analyze(run)
			if err != nil {
				return err
			}
			// Storing findings is a convenience; a read-only run directory still gets its report.
			_ = rundir.WriteFindings(args[0], rep)
			if html != "" {
				if err := report.WriteFile(html, report.FromRun(run, rep)); err != nil {
					return err
				}
			}
			if err := console.Render(cmd.OutOrStdout(), rep, output); err != nil {
				return err
			}
			return g.Apply(rep, "analyze")
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "report format: text or json")
	cmd.Flags().StringVar(&from, "from", "", "analyze the agent's flight recorder from this time (RFC 3339, or a duration before now: 30m)")
	cmd.Flags().StringVar(&to, "to", "now", "to this time (RFC 3339, now, or a duration before now)")
	cmd.Flags().DurationVar(&baseline, "baseline", recorded.DefaultWindows.Baseline, "the stretch before --from it is compared with")
	cmd.Flags().StringVar(&cgroup, "cgroup", "", "the cgroup under examination (default: every cgroup whose run-queue waits rose)")
	cmd.Flags().StringVar(&html, "html", "", "also write the report as one HTML file with charts (as nodectl report does)")
	src.Register(cmd.Flags())
	g.Register(cmd.Flags())
	return remote.Supports(cmd)
}
