// Package validate measures a tuning profile: a stress run on the untuned node, the profile
// applied, the same run again, the profile rolled back, and the two runs compared. The CLI's
// `nodectl tune validate` and the node agent both call it.
package validate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/nodectl/nodectl/analyzer"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/stress"
	"github.com/nodectl/nodectl/tuner"
)

// Tuner applies and rolls back the profile on the node under test: this machine's tune
// engine (Engine), or the tuner pod `nodectl --node NODE tune validate` runs on a node.
type Tuner interface {
	// Applied is the profile applied on the node, "" when it is untuned.
	Applied(ctx context.Context) (string, error)
	// Apply applies the profile and returns the ids of the settings it changed.
	Apply(ctx context.Context) ([]string, error)
	Rollback(ctx context.Context) error
}

// Engine is the Tuner of this machine: a tune engine with its profile's settings.
type Engine struct{ *tuner.Engine }

// Applied reads the engine's state file.
func (e Engine) Applied(context.Context) (string, error) {
	st, err := tuner.LoadState(e.State)
	if err != nil || st == nil {
		return "", err
	}
	return st.Profile, nil
}

// Apply applies afresh: another tuner may have applied meanwhile, which is not ours to roll
// back.
func (e Engine) Apply(ctx context.Context) ([]string, error) {
	e.Fresh = true
	res, err := e.Engine.Apply(ctx)
	if err != nil {
		return nil, err
	}
	return res.Changed, nil
}

// Rollback restores what Apply changed.
func (e Engine) Rollback(ctx context.Context) error {
	_, err := e.Engine.Rollback(ctx)
	return err
}

// Config is one validation.
type Config struct {
	Tuner   Tuner
	Profile string // the profile's name, for progress and errors
	// Stress runs the scenario, writing its run to dir.
	Stress func(ctx context.Context, dir string) error
	Out    string // the runs go to Out/before and Out/after
	Keep   bool   // leave the profile applied after the tuned run
	// Progress, if set, is told each step.
	Progress func(format string, args ...any)
}

// Result is a finished validation.
type Result struct {
	Before, After string   // the two run directories
	Changed       []string // the settings the profile changed
	Diff          *analyzer.DiffReport
}

// Run validates: the untuned run, the profile applied, the tuned run, the profile rolled back
// (unless Keep) and the diff. The node must be untuned. On every exit after the profile was
// applied, an interrupted ctx included, the profile is rolled back unless Keep.
func Run(ctx context.Context, cfg Config) (res *Result, err error) {
	say := cfg.Progress
	if say == nil {
		say = func(string, ...any) {}
	}
	if applied, err := cfg.Tuner.Applied(ctx); err != nil {
		return nil, err
	} else if applied != "" {
		return nil, fmt.Errorf("profile %q is applied on the node: validating needs the untuned node for its first run; roll it back first", applied)
	}
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return nil, fmt.Errorf("making the runs' directory %s: %w", cfg.Out, err)
	}
	res = &Result{Before: filepath.Join(cfg.Out, "before"), After: filepath.Join(cfg.Out, "after")}

	say("1/4 untuned run")
	if err := cfg.Stress(ctx, res.Before); err != nil {
		return nil, fmt.Errorf("untuned run: %w (the profile was not applied)", err)
	}
	say("2/4 applying profile %s", cfg.Profile)
	if res.Changed, err = cfg.Tuner.Apply(context.WithoutCancel(ctx)); err != nil {
		return nil, fmt.Errorf("applying profile %s: %w", cfg.Profile, err)
	}
	say("    changed %d settings: %s", len(res.Changed), strings.Join(res.Changed, ", "))
	defer func() {
		if cfg.Keep {
			say("4/4 keeping profile %s applied; rolling it back restores the node", cfg.Profile)
			return
		}
		say("4/4 rolling back profile %s", cfg.Profile)
		if rerr := cfg.Tuner.Rollback(context.WithoutCancel(ctx)); rerr != nil {
			err = errors.Join(err, fmt.Errorf("rolling back: %w", rerr))
		}
	}()
	if ctx.Err() != nil {
		return nil, fmt.Errorf("%w: %v", stress.ErrInterrupted, context.Cause(ctx))
	}
	say("3/4 tuned run")
	if err := cfg.Stress(ctx, res.After); err != nil {
		return nil, fmt.Errorf("tuned run: %w", err)
	}
	var runs [2]*rundir.Run
	for i, dir := range []string{res.Before, res.After} {
		if runs[i], err = rundir.Open(dir); err != nil {
			return nil, fmt.Errorf("reading run %s: %w", dir, err)
		}
	}
	if res.Diff, err = analyzer.Diff(runs[0], runs[1]); err != nil {
		return nil, err
	}
	return res, nil
}

// Command is a Config.Stress that runs `exe args... --out DIR` (exe is a nodectl binary, args
// a stress command line), its output going to out. A cancelled ctx interrupts it once, as
// Ctrl-C would, so that it cleans up as an interrupted run does.
func Command(exe string, args []string, out io.Writer) func(ctx context.Context, dir string) error {
	return func(ctx context.Context, dir string) error {
		c := exec.Command(exe, append(slices.Clone(args), "--out", dir)...)
		c.Stdout, c.Stderr = out, out
		// Its own process group: the terminal's Ctrl-C reaches it only through us. Interrupted
		// when we die too (killed), so that it removes its workloads rather than running on.
		c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGINT}
		if err := c.Start(); err != nil {
			return fmt.Errorf("starting nodectl stress: %w", err)
		}
		done := make(chan error, 1)
		go func() { done <- c.Wait() }()
		var err error
		select {
		case err = <-done:
		case <-ctx.Done():
			_ = c.Process.Signal(syscall.SIGINT)
			<-done
			return fmt.Errorf("%w during the stress run: %v", stress.ErrInterrupted, context.Cause(ctx))
		}
		if err != nil {
			return fmt.Errorf("nodectl %s: %w", strings.Join(args, " "), err)
		}
		return nil
	}
}
