// Package version is `nodectl version`.
package version

import (
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/nodectl/nodectl/cli/internal/buildinfo"
	"github.com/nodectl/nodectl/rundir"
)

// New returns the version command.
func New() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print nodectl's version, the run format it writes and the Go it was built with",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			info := map[string]string{"version": buildinfo.Version, "run_format": rundir.FormatVersion, "go": runtime.Version()}
			if bi, ok := debug.ReadBuildInfo(); ok {
				for _, s := range bi.Settings {
					if s.Key == "vcs.revision" {
						info["commit"] = s.Value
					}
				}
			}
			if output == "json" {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(info)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "nodectl %s (run format %s, %s)\n", info["version"], info["run_format"], info["go"])
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	return cmd
}
