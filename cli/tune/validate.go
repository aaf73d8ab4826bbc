package tune

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodectl/nodectl/cli/internal/console"
	"github.com/nodectl/nodectl/cli/internal/interrupt"
	"github.com/nodectl/nodectl/cli/internal/remote"
	reports "github.com/nodectl/nodectl/report"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/stress/validate"
)

// validateReserved are the stress flags validate sets itself.
var validateReserved = []string{"--out", "--tune-state", "-o", "--output"}

func newValidate() *cobra.Command {
	var (
		o    opts
		keep bool
		out  string
		html string
	)
	cmd := &cobra.Command{
		Use:   "validate --profile P -- stress SCENARIO [FLAGS]",
		Short: "Measure a profile: run a stress scenario, apply the profile, run it again, roll back, diff",
		Long: `validate runs the stress command given after -- on the untuned node, applies the profile,
runs the same command again, rolls the profile back (unless --keep) and prints nodectl diff of
the two runs: e.g. the heartbeat's lateness next to sandbox churn without and with reserved
system CPUs, or a density sweep without and with the swap sysctls. The stress runs place
their workloads as a tuned node would: with a CPU partition applied, workloads go on the
workload CPUs and the heartbeat (the kubelet's stand-in) on the reserved ones. The runs are
kept in --out (before/ and after/). An interrupted validate rolls the profile back.

With --node NODE, all of it goes through the API server: both runs are runs of pods on the
node (nodectl --node NODE stress ...), and a short-lived privileged tuner pod on the node
(host network and PIDs, the node's root at /host) checks that the node is untuned, applies the
profile (a profile file is read here and handed to it), and rolls it back. The tuner pods live
in a namespace of the run's own, labelled to admit privileged pods; when the rollback did not
happen (the CLI killed), the namespace stays and nodectl --node NODE stress clean rolls the
profile back before removing it. The runs go to a temporary directory unless --out.`,
		Example: `  sudo nodectl tune validate --profile sandbox-density -- stress noisy --heartbeat 100ms --hog churn,count=2 --trace
  sudo nodectl tune validate --profile swap.yaml -- stress density --step 2 --max 20 --swap /var/tmp/swap:1Gi
  nodectl --node gke-pool-1-abcd tune validate --profile swap.yaml -- stress wake --cpu-limits 50m,1 --count 3`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := console.CheckOutput(o.output); err != nil {
				return err
			}
			if cmd.ArgsLenAtDash() != 0 || len(args) == 0 {
				return fmt.Errorf("give the stress command after --, e.g. nodectl tune validate --profile sandbox-density -- stress noisy --heartbeat 100ms --hog churn,count=2")
			}
			stressArgs, err := checkStressArgs(args)
			if err != nil {
				return err
			}
			node, err := onNode(cmd)
			if err != nil {
				return err
			}
			if node != "" {
				return validateOnNode(cmd, node, &o, stressArgs, out, html, keep)
			}
			l, err := o.load(cmd)
			if err != nil {
				return err
			}
			if err := needRoot("validate"); err != nil {
				return err
			}
			if out == "" {
				out = filepath.Join("/var/lib/nodectl/validate", time.Now().UTC().Format("20060102-150405"))
			}
			ctx, stop := interrupt.SignalContextHint(cmd.Context(), cmd.ErrOrStderr(), "run 'nodectl tune rollback' and 'nodectl stress clean' to remove what is left")
			defer stop()
			// The runs read the tuner's state: a tuned run places its workloads as a tuned
			// node would.
			stressArgs = append(stressArgs, "--tune-state", l.engine.State)
			return runValidate(ctx, cmd, &o, validate.Engine{Engine: l.engine}, l.profile.Name, stressArgs, out, html, keep)
		},
	}
	o.hostFlags(cmd.Flags())
	o.profileFlag(cmd.Flags(), "sandbox-density")
	o.outputFlag(cmd.Flags())
	cmd.Flags().StringVar(&html, "html", "", "also write the diff of the two runs as one HTML file (as nodectl diff --html does)")
	cmd.Flags().BoolVar(&keep, "keep", false, "keep the profile applied after the second run")
	cmd.Flags().StringVar(&out, "out", "", "directory for the two runs, before/ and after/ (default /var/lib/nodectl/validate/<time>; with --node, <tmp>/nodectl-validate/<time>)")
	return remote.Supports(cmd)
}

// runValidate runs the validation: the stress runs are `nodectl stressArgs... --out DIR`, the
// profile applied and rolled back by tn.
func runValidate(ctx context.Context, cmd *cobra.Command, o *opts, tn validate.Tuner, profileName string, stressArgs []string, out, html string, keep bool) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding nodectl: %w", err)
	}
	stderr := cmd.ErrOrStderr()
	fmt.Fprintf(stderr, "validate: each run is: nodectl %s\n", strings.Join(stressArgs, " "))
	res, err := validate.Run(ctx, validate.Config{Tuner: tn, Profile: profileName,
		Stress: validate.Command(exe, stressArgs, stderr), Out: out, Keep: keep,
		Progress: func(format string, a ...any) { fmt.Fprintf(stderr, "validate: "+format+"\n", a...) }})
	if err != nil {
		return err
	}
	if html != "" {
		if err := validateHTML(res, html); err != nil {
			return err
		}
	}
	w := cmd.OutOrStdout()
	if o.output == "json" {
		return reports.DiffJSON(w, res.Diff)
	}
	fmt.Fprintf(w, "Profile %s: run A is the untuned node (%s), run B the tuned one (%s).\n\n", profileName, res.Before, res.After)
	return reports.DiffText(w, res.Diff)
}

// validateHTML writes the untuned and the tuned run compared, as `diff --html` does.
func validateHTML(res *validate.Result, path string) error {
	var runs [2]*rundir.Run
	for i, dir := range []string{res.Before, res.After} {
		r, err := rundir.Open(dir)
		if err != nil {
			return err
		}
		runs[i] = r
	}
	page, err := reports.FromDiff(runs[0], runs[1], res.Diff)
	if err != nil {
		return err
	}
	return reports.WriteFile(path, page)
}

// checkStressArgs accepts `stress SCENARIO ...` (a leading "nodectl" is dropped) and refuses
// the flags validate sets itself.
func checkStressArgs(args []string) ([]string, error) {
	if args[0] == "nodectl" {
		args = args[1:]
	}
	if len(args) < 2 || args[0] != "stress" || args[1] == "clean" {
		return nil, fmt.Errorf("after -- give a stress scenario (stress noisy|wake|density|fsync-storm ...), not %q", strings.Join(args, " "))
	}
	for _, a := range args {
		name, _, _ := strings.Cut(a, "=")
		if slices.Contains(validateReserved, name) {
			return nil, fmt.Errorf("stress flag %s: validate chooses the runs' directories and output itself; use validate's own --out and -o", name)
		}
	}
	return args, nil
}
