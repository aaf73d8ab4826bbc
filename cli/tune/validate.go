package tune

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodectl/nodectl/analyzer"
	"github.com/nodectl/nodectl/cli/internal/clix"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/stress"
	"github.com/nodectl/nodectl/tuner"
)

// validateReserved are the stress flags validate sets itself.
var validateReserved = []string{"--out", "--tune-state", "-o", "--output"}

func newValidate() *cobra.Command {
	var (
		o    opts
		keep bool
		out  string
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
kept in --out (before/ and after/). An interrupted validate rolls the profile back.`,
		Example: `  sudo nodectl tune validate --profile sandbox-density -- stress noisy --heartbeat 100ms --hog churn,count=2 --trace
  sudo nodectl tune validate --profile swap.yaml -- stress density --step 2 --max 20 --swap /var/tmp/swap:1Gi`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := clix.CheckOutput(o.output); err != nil {
				return err
			}
			if cmd.ArgsLenAtDash() != 0 || len(args) == 0 {
				return fmt.Errorf("give the stress command after --, e.g. nodectl tune validate --profile sandbox-density -- stress noisy --heartbeat 100ms --hog churn,count=2")
			}
			stressArgs, err := checkStressArgs(args)
			if err != nil {
				return err
			}
			l, err := o.load(cmd)
			if err != nil {
				return err
			}
			if err := needRoot("validate"); err != nil {
				return err
			}
			if state, err := tuner.LoadState(l.engine.State); err != nil {
				return err
			} else if state != nil {
				return fmt.Errorf("profile %q is applied on this node: validate needs the untuned node for its first run; roll it back first (nodectl tune rollback)", state.Profile)
			}
			if out == "" {
				out = filepath.Join("/var/lib/nodectl/validate", time.Now().UTC().Format("20060102-150405"))
			}
			if err := os.MkdirAll(out, 0o755); err != nil {
				return fmt.Errorf("--out %s: %w", out, err)
			}
			v := &validation{cmd: cmd, l: l, args: stressArgs, out: out, keep: keep}
			return v.run(cmd.Context(), o.output)
		},
	}
	o.hostFlags(cmd.Flags())
	o.profileFlag(cmd.Flags(), "sandbox-density")
	o.outputFlag(cmd.Flags())
	cmd.Flags().BoolVar(&keep, "keep", false, "keep the profile applied after the second run")
	cmd.Flags().StringVar(&out, "out", "", "directory for the two runs, before/ and after/ (default /var/lib/nodectl/validate/<time>)")
	return cmd
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

type validation struct {
	cmd  *cobra.Command
	l    *loaded
	args []string
	out  string
	keep bool
}

func (v *validation) progress(format string, a ...any) {
	fmt.Fprintf(v.cmd.ErrOrStderr(), "validate: "+format+"\n", a...)
}

func (v *validation) run(ctx context.Context, output string) (err error) {
	ctx, stop := clix.SignalContextHint(ctx, v.cmd.ErrOrStderr(), "run 'nodectl tune rollback' and 'nodectl stress clean' to remove what is left")
	defer stop()
	before, after := filepath.Join(v.out, "before"), filepath.Join(v.out, "after")

	v.progress("1/4 untuned run: nodectl %s", strings.Join(v.args, " "))
	if err := v.stress(ctx, before); err != nil {
		return fmt.Errorf("untuned run: %w (the profile was not applied)", err)
	}
	v.progress("2/4 applying profile %s", v.l.profile.Name)
	v.l.engine.Fresh = true // another tuner may have applied meanwhile: not ours to roll back
	res, err := v.l.engine.Apply(context.WithoutCancel(ctx))
	if err != nil {
		return fmt.Errorf("applying profile %s: %w", v.l.profile.Name, err)
	}
	v.progress("    changed %d settings: %s", len(res.Changed), strings.Join(res.Changed, ", "))
	defer func() {
		if v.keep {
			v.progress("4/4 keeping profile %s applied (--keep); nodectl tune rollback restores the node", v.l.profile.Name)
			return
		}
		v.progress("4/4 rolling back profile %s", v.l.profile.Name)
		if _, rerr := v.l.engine.Rollback(context.WithoutCancel(ctx)); rerr != nil {
			err = errors.Join(err, fmt.Errorf("rolling back: %w", rerr))
		}
	}()
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %v", stress.ErrInterrupted, context.Cause(ctx))
	}
	v.progress("3/4 tuned run: nodectl %s", strings.Join(v.args, " "))
	if err := v.stress(ctx, after); err != nil {
		return fmt.Errorf("tuned run: %w", err)
	}
	var runs [2]*rundir.Run
	for i, dir := range []string{before, after} {
		if runs[i], err = rundir.Open(dir); err != nil {
			return fmt.Errorf("reading run %s: %w", dir, err)
		}
	}
	d, err := analyzer.Diff(runs[0], runs[1])
	if err != nil {
		return err
	}
	w := v.cmd.OutOrStdout()
	if output == "json" {
		return analyzer.RenderDiffJSON(w, d)
	}
	fmt.Fprintf(w, "Profile %s: run A is the untuned node (%s), run B the tuned one (%s).\n\n", v.l.profile.Name, before, after)
	return analyzer.RenderDiffText(w, d)
}

// stress runs this nodectl's stress command writing its run to dir; its output goes to
// stderr so that stdout carries only the diff.
func (v *validation) stress(ctx context.Context, dir string) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding nodectl: %w", err)
	}
	args := append(slices.Clone(v.args), "--out", dir, "--tune-state", v.l.engine.State)
	c := exec.Command(exe, args...)
	c.Stdout, c.Stderr = v.cmd.ErrOrStderr(), v.cmd.ErrOrStderr()
	// Its own process group: a Ctrl-C reaches it through us, once, as SIGINT, so it cleans
	// up as an interrupted run does.
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := c.Start(); err != nil {
		return fmt.Errorf("starting nodectl stress: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = c.Process.Signal(syscall.SIGINT)
		<-done
		return fmt.Errorf("%w during the stress run: %v", stress.ErrInterrupted, context.Cause(ctx))
	}
	if err != nil {
		return fmt.Errorf("nodectl %s: %w", strings.Join(v.args, " "), err)
	}
	return nil
}
