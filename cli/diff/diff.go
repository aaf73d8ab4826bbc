// Package diff is `nodectl diff RUN_A RUN_B`.
package diff

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/nodectl/nodectl/analyzer"
	"github.com/nodectl/nodectl/cli/internal/console"
	"github.com/nodectl/nodectl/report"
	"github.com/nodectl/nodectl/rundir"
)

// New returns the diff command.
func New() *cobra.Command {
	var output, html string
	cmd := &cobra.Command{
		Use:   "diff RUN_A RUN_B",
		Short: "Compare two recorded runs: each workload's measures side by side, and what findings changed",
		Long: `Reads two run directories and shows, for each workload, its stress-phase measures (the whole
run's when there is no stress phase) in run A and run B with the ratio B/A: CPU work p50/p95,
CPU cores used, run-queue p99 and total wait, throttled time and share of periods, fsync p95,
write+fsync p95 and block I/O. Stress runs match workloads by name, record-mode runs match
cgroups by path. Then both runs' findings, marking those that appeared or are gone in B.
Typical use: the same scenario before and after a change (hogs unlimited, then at cpu=500m).
The text table leaves out measures that are zero in both runs; -o json has them all.`,
		Example: `  nodectl diff /var/lib/nodectl/runs/<before> /var/lib/nodectl/runs/<after>`,
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := console.CheckOutput(output); err != nil {
				return err
			}
			var runs [2]*rundir.Run
			for i, side := range []string{"A", "B"} {
				run, err := rundir.Open(args[i])
				if err != nil {
					return fmt.Errorf("reading run %s (%s): %w", side, args[i], err)
				}
				runs[i] = run
			}
			d, err := analyzer.Diff(runs[0], runs[1])
			if err != nil {
				return err
			}
			if html != "" {
				page, err := report.FromDiff(runs[0], runs[1], d)
				if err != nil {
					return err
				}
				if err := report.WriteFile(html, page); err != nil {
					return err
				}
			}
			if output == "json" {
				return report.DiffJSON(cmd.OutOrStdout(), d)
			}
			return report.DiffText(cmd.OutOrStdout(), d)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "report format: text or json")
	cmd.Flags().StringVar(&html, "html", "", "also write the comparison as one HTML file: the table, then each run's charts side by side")
	return cmd
}
