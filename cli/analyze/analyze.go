// Package analyze is `nodectl analyze RUN`.
package analyze

import (
	"github.com/spf13/cobra"

	"github.com/nodectl/nodectl/analyzer"
	"github.com/nodectl/nodectl/cli/internal/clix"
	"github.com/nodectl/nodectl/rundir"
)

// New returns the analyze command.
func New() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "analyze RUN",
		Short: "Explain a recorded run: findings with kernel evidence, and a summary table",
		Long: `Reads a run directory written by 'nodectl stress' or 'nodectl record', compares the
victim's stress phase with its baseline, and prints findings (cpu-contention, cpu-throttling,
disk-contention, ...) with their evidence and culprits. The report is also stored as
findings.json in the run directory. Runs need no privileges to analyze.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := clix.CheckOutput(output); err != nil {
				return err
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
			if output == "json" {
				return analyzer.RenderJSON(cmd.OutOrStdout(), rep)
			}
			return analyzer.RenderText(cmd.OutOrStdout(), rep)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "report format: text or json")
	return cmd
}
