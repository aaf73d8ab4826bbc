package stress

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/nodectl/nodectl/analyzer"
	"github.com/nodectl/nodectl/cli/internal/console"
	"github.com/nodectl/nodectl/cli/internal/gate"
	"github.com/nodectl/nodectl/cli/internal/interrupt"
	"github.com/nodectl/nodectl/cli/internal/pathflags"
	"github.com/nodectl/nodectl/cli/internal/privilege"
	"github.com/nodectl/nodectl/report"
	st "github.com/nodectl/nodectl/stress"
	"github.com/nodectl/nodectl/stress/launch"
	"github.com/nodectl/nodectl/tuner"
	"github.com/nodectl/nodectl/tuner/cpuset"
)

// runFlags are the flags every scenario takes (stress.RunOptions, the report format, -v), and
// what a command does with them before its run.
type runFlags struct {
	opts    *st.RunOptions
	runtime string
	output  string
	verbose bool
	// tuneState is nodectl tune's state file: a CPU partition applied there places the run's
	// workloads as the tuned node's kubelet would.
	tuneState string
	gate      gate.Flags
	// runtimeClass is the workload pods' RuntimeClass with --node.
	runtimeClass string
}

// register adds the flags; who names what --runtime runs, traceHelp what --trace records, and
// scratch says whether the scenario writes files (--scratch-dir).
func (rf *runFlags) register(f *pflag.FlagSet, who, traceHelp string, scratch bool) {
	f.StringVar(&rf.runtime, "runtime", string(launch.RuntimeProcess), "how "+who+" run: process (a child process in a cgroup), runc (a container) or runsc (a gVisor sandbox); the root filesystem is the nodectl binary alone")
	f.StringVar(&rf.runtimeClass, "runtime-class", "", "with --node: the workload pods' RuntimeClass (default: gvisor for --runtime runsc, else the cluster's default runtime)")
	f.StringVar(&rf.opts.RunscPlatform, "runsc-platform", "", "gVisor platform for --runtime runsc: systrap, ptrace or kvm; default systrap where runsc has it, else ptrace")
	f.BoolVar(&rf.opts.Trace, "trace", false, "trace with eBPF: "+traceHelp)
	f.StringVar(&rf.opts.Out, "out", "", "run directory to write (must not exist or be empty); default "+st.DefaultRunsDir+"/<run-id>")
	f.StringVarP(&rf.output, "output", "o", "text", "report format: text or json")
	f.DurationVar(&rf.opts.Interval, "interval", time.Second, "sampling interval of the tracer and samplers")
	f.BoolVarP(&rf.verbose, "verbose", "v", false, "log debug detail to stderr")
	rf.gate.Register(f)
	f.StringVar(&rf.tuneState, "tune-state", filepath.Join("/", tuner.DefaultStateFile), "nodectl tune's state file; with reserved CPUs applied, workloads run off them and the heartbeat on them")
	_ = f.MarkHidden("tune-state")
	pathflags.HostPathFlags(f, &rf.opts.Paths.FS)
	if scratch {
		pathflags.RunPathFlags(f, &rf.opts.Paths)
	} else {
		f.StringVar(&rf.opts.Paths.State, "state-dir", rf.opts.Paths.State, "parent of each live run's state (owner pid, the runtime's state)")
	}
}

// check validates the flags every scenario shares, before anything else is looked at.
func (rf *runFlags) check() error {
	if err := console.CheckOutput(rf.output); err != nil {
		return err
	}
	if err := rf.gate.Check(); err != nil {
		return err
	}
	rt, err := launch.ParseRuntime(rf.runtime)
	if err != nil {
		return fmt.Errorf("--runtime: %w", err)
	}
	rf.opts.Runtime = rt
	return checkPlatform(rf.opts.RunscPlatform, rt)
}

// start checks what every stress scenario needs before it touches the host (a sane --interval
// and the privileges; with --trace, those of eBPF), points progress and logs at the command's
// stderr, and returns the context that SIGINT, SIGTERM and SIGHUP cancel.
func (rf *runFlags) start(cmd *cobra.Command, name, why string) (context.Context, func(), error) {
	if rf.runtimeClass != "" {
		return nil, nil, fmt.Errorf("--runtime-class %s: only with --node (a run of pods); here --runtime says how workloads run", rf.runtimeClass)
	}
	if rf.opts.Interval < 100*time.Millisecond {
		return nil, nil, fmt.Errorf("--interval %s: must be at least 100ms", rf.opts.Interval)
	}
	caps := map[int]string{privilege.CapSysAdmin: why}
	if rf.opts.Trace {
		caps[privilege.CapBPF] = "loading the --trace eBPF programs"
		caps[privilege.CapPerfmon] = "attaching them to tracepoints"
	}
	if err := privilege.Need(name, caps); err != nil {
		return nil, nil, err
	}
	rf.opts.Args = os.Args
	rf.opts.Progress = cmd.ErrOrStderr()
	rf.opts.ProgressTTY = console.IsTerminal(os.Stderr)
	rf.opts.Log = console.Logger(cmd.ErrOrStderr(), rf.verbose)
	state, err := tuner.LoadState(rf.tuneState)
	if err != nil {
		return nil, nil, fmt.Errorf("--tune-state %s: %w", rf.tuneState, err)
	}
	system, workloads, ok, err := cpuset.Live(state, rf.opts.Paths.Sysfs)
	if err != nil {
		return nil, nil, fmt.Errorf("--tune-state %s: %w", rf.tuneState, err)
	}
	if ok {
		rf.opts.CPUs = st.CPUPartition{System: system, Workloads: workloads}
		rf.opts.Log.Info("placing workloads by the tuned CPU partition", "system", system, "workloads", workloads)
	}
	ctx, stop := interrupt.SignalContext(cmd.Context(), cmd.ErrOrStderr())
	return ctx, stop, nil
}

// runLocal runs a scenario on this host: start's checks, the headline, run until it ends or
// Ctrl-C, then the run directory it wrote analyzed and reported. name and why are start's.
func (rf *runFlags) runLocal(cmd *cobra.Command, name, why, headline string, run func(context.Context) (string, error)) error {
	ctx, stop, err := rf.start(cmd, name, why)
	if err != nil {
		return err
	}
	defer stop()
	fmt.Fprintln(cmd.ErrOrStderr(), headline)
	dir, runErr := run(ctx)
	rep, err := finish(cmd, dir, runErr)
	if err != nil {
		return err
	}
	return rf.report(cmd, rep)
}

// report prints the report (text, or with -o json its scenario's view), then writes --junit
// and says whether a finding reached --fail-on (exit 3).
func (rf *runFlags) report(cmd *cobra.Command, rep *analyzer.Report) error {
	render := report.Text
	if rf.output == "json" {
		render = report.ScenarioJSON
	}
	if err := render(cmd.OutOrStdout(), rep); err != nil {
		return err
	}
	return rf.gate.Apply(rep, rep.Run.Scenario)
}

// checkPlatform validates --runsc-platform, which only runsc takes.
func checkPlatform(platform string, rt launch.Runtime) error {
	if platform == "" {
		return nil
	}
	if !slices.Contains([]string{"systrap", "ptrace", "kvm"}, platform) {
		return fmt.Errorf("--runsc-platform %q: allowed are systrap, ptrace, kvm", platform)
	}
	if rt != launch.RuntimeRunsc {
		return fmt.Errorf("--runsc-platform %s: only for --runtime runsc, not %s", platform, rt)
	}
	return nil
}
