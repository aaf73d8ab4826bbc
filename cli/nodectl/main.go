// Command nodectl traces, stresses, tunes and explains a Kubernetes node from the kernel's side.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/nodectl/nodectl/cli/agent"
	"github.com/nodectl/nodectl/cli/analyze"
	"github.com/nodectl/nodectl/cli/diff"
	"github.com/nodectl/nodectl/cli/internal/gate"
	"github.com/nodectl/nodectl/cli/internal/remote"
	"github.com/nodectl/nodectl/cli/postmortem"
	"github.com/nodectl/nodectl/cli/record"
	reportcli "github.com/nodectl/nodectl/cli/report"
	"github.com/nodectl/nodectl/cli/stress"
	"github.com/nodectl/nodectl/cli/tune"
	"github.com/nodectl/nodectl/cli/version"
	"github.com/nodectl/nodectl/cli/workload"
	"github.com/nodectl/nodectl/internal/printable"
	st "github.com/nodectl/nodectl/stress"
)

func main() {
	root := &cobra.Command{
		Use:   "nodectl",
		Short: "Explain, from the kernel's side, why a dense node hits its ceilings",
		Long: `nodectl runs stress scenarios on a node, traces them with eBPF (run-queue latency with
the preempting cgroup, fsync and block I/O per cgroup) and cgroup/procfs samplers, records
everything in a run directory, and explains which neighbour or limit slowed whom.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(stress.New(), record.New(), analyze.New(), version.New(), workload.New())
	root.AddCommand(diff.New(), tune.New(), agent.New(), postmortem.New(), reportcli.New())
	// Names anybody on the node chose (a cgroup's directory) are printed: their control
	// characters are shown escaped, not obeyed by the terminal. Progress lines redraw in place
	// on stderr.
	stdout, stderr := printable.Writer(os.Stdout, false), printable.Writer(os.Stderr, true)
	root.SetOut(stdout)
	root.SetErr(stderr)
	remote.Register(root.PersistentFlags())
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error { return remote.Check(cmd) }
	if err := root.Execute(); err != nil {
		fmt.Fprintf(stderr, "nodectl: %v\n", err)
		if errors.Is(err, st.ErrInterrupted) {
			os.Exit(130)
		}
		if errors.Is(err, tune.ErrDrift) {
			os.Exit(3)
		}
		os.Exit(gate.Code(err))
	}
}
