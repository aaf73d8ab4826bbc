// Package report is `nodectl report RUN`: the run's analysis as one self-contained HTML file
// with charts (package report).
package report

import (
	"fmt"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/nodectl/nodectl/analyzer"
	"github.com/nodectl/nodectl/report"
	"github.com/nodectl/nodectl/rundir"
)

// New returns the report command.
func New() *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "report RUN [--out FILE.html]",
		Short: "Write a run's analysis as one HTML file with charts: findings first, then the scenario's charts",
		Long: `report analyzes a run directory (as 'nodectl analyze' does) and writes one self-contained
HTML file: the findings first, each with its evidence table and a chart of it, then the
scenario's charts drawn from the run's records: for noisy (and record, and a window of the
agent's flight recorder), the victim's own timings against the phases, its run-queue wait per
phase split by what ran instead of it, its throttling, the node's PSI and the busiest disk's
queue against service time; for wake, the wake time per CPU limit with its throttled part; for
density, readiness, PSI, memory and swap per step with the collapse marked and the ceiling
named; for fsync-storm, each writer's time to durable in each storm. The file needs nothing
else: no script, font or network request; it follows the reader's light or dark mode and
prints. The default is report.html in the run directory.`,
		Example: `  nodectl report /var/lib/nodectl/runs/noisy-20261201-030000
  nodectl report ./run --out /tmp/noisy.html`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			run, err := rundir.Open(args[0])
			if err != nil {
				return err
			}
			rep, err := analyzer.Analyze(run)
			if err != nil {
				return err
			}
			if out == "" {
				out = filepath.Join(args[0], "report.html")
			}
			if err := report.WriteFile(out, report.FromRun(run, rep)); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "report: %s\n", out)
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "the HTML file to write (default RUN/report.html)")
	return cmd
}
