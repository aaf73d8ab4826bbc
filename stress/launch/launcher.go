package launch

import (
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/nodectl/nodectl/internal/badvalue"

	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/stress/workload"
)

// Runtime is how workloads run: as plain child processes in a cgroup, in runc containers, or in
// gVisor (runsc) sandboxes.
type Runtime string

// The runtimes --runtime accepts.
const (
	RuntimeProcess Runtime = rundir.RuntimeProcess
	RuntimeRunc    Runtime = rundir.RuntimeRunc
	RuntimeRunsc   Runtime = rundir.RuntimeRunsc
)

// FieldRuntime names the runtime setting in errors.
const FieldRuntime = "Runtime"

// Runtimes lists the runtimes in the order help text shows them.
var Runtimes = []Runtime{RuntimeProcess, RuntimeRunc, RuntimeRunsc}

// ParseRuntime checks a --runtime value.
func ParseRuntime(s string) (Runtime, error) {
	r := Runtime(s)
	if !slices.Contains(Runtimes, r) {
		names := make([]string, len(Runtimes))
		for i, r := range Runtimes {
			names[i] = string(r)
		}
		return "", badvalue.Errorf(FieldRuntime, "", "unknown runtime %q: allowed are %s", s, strings.Join(names, ", "))
	}
	return r, nil
}

// Cgroups is what a launcher needs of the cgroup layout (cgroup.Layout).
type Cgroups interface {
	Placer
	Procs(path string) ([]int, error)
}

// Config configures a Launcher.
type Config struct {
	Runtime Runtime // "" = RuntimeProcess
	Exe     string  // the nodectl binary that runs workloads
	Cgroups Cgroups
	Procfs  string // "" = /proc
	// StateDir holds container bundles, the shared root filesystem and the runtime's own state
	// (its --root); Close removes it. Unused by the process runtime.
	StateDir string
	// RunscPlatform is gVisor's --platform; "" picks systrap where runsc has it, else ptrace.
	RunscPlatform string
	Log           *slog.Logger
}

// Launcher starts workloads in one runtime.
type Launcher struct {
	cfg       Config
	container *containers // nil for the process runtime
}

// New checks that the runtime can be used (its binary is installed, the nodectl binary is
// static so it runs in an empty root filesystem) and prepares what it needs.
func New(cfg Config) (*Launcher, error) {
	if cfg.Runtime == "" {
		cfg.Runtime = RuntimeProcess
	}
	if cfg.Procfs == "" {
		cfg.Procfs = "/proc"
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if _, err := ParseRuntime(string(cfg.Runtime)); err != nil {
		return nil, err
	}
	l := &Launcher{cfg: cfg}
	if cfg.Runtime == RuntimeProcess {
		return l, nil
	}
	c, err := newContainers(cfg)
	if err != nil {
		return nil, err
	}
	l.container = c
	return l, nil
}

// Runtime is the launcher's runtime.
func (l *Launcher) Runtime() Runtime { return l.cfg.Runtime }

// Describe says which runtime runs the workloads, with the gVisor platform where it applies, for
// meta.json and the user.
func (l *Launcher) Describe() string {
	if l.container != nil {
		return l.container.describe()
	}
	return string(RuntimeProcess)
}

// Spec describes one workload process.
type Spec struct {
	Name   string // workload name: victim, cpu-hog-0, ...
	Cgroup string // cgroup path, created by the caller with Limits
	Limits cgroup.Limits
	Args   []string // arguments after the binary, e.g. ["workload", "victim", "--dir", ...]
	// Mounts are host directories the workload writes to; a container sees each at the same
	// path, read-write. Missing ones are created.
	Mounts []string
	Stdin  io.Reader // nil = no input
	// RuntimeCgroup is where a container runtime's own process runs (runc or runsc run: the
	// container's set-up, and the part of a sandbox's boot before it joins Cgroup), so that a
	// workload made of sandbox starts is charged their cost; it must not be Cgroup, which the
	// runtime removes on exit. "" = nodectl's own cgroup.
	RuntimeCgroup string
	Log           io.Writer // the workload's standard error (and the runtime's)
}

// Start launches spec in the launcher's runtime. Each line the workload prints on standard
// output is decoded as a workload.Measurement and handed to onMeasure. The workload does no work
// before it sits in spec.Cgroup.
func (l *Launcher) Start(spec Spec, onMeasure func(string, workload.Measurement)) (*Process, error) {
	if l.container != nil {
		return l.container.start(spec, onMeasure)
	}
	return Start(l.cfg.Exe, l.cfg.Cgroups, spec, onMeasure)
}

// HostProcesses lists the host processes in a workload's cgroup, with their roles: for runsc
// the sandbox (Sentry), the gofer and the ptrace/systrap stubs that run the application's
// threads; for runc and the process runtime the workload's own processes.
func (l *Launcher) HostProcesses(cgroupPath string) ([]rundir.HostProcess, error) {
	pids, err := l.cfg.Cgroups.Procs(cgroupPath)
	if err != nil {
		return nil, err
	}
	return classify(l.cfg.Procfs, pids), nil
}

// Close removes what New and Start prepared: bundles, the root filesystem and the runtime's
// state, deleting any container still known to it. Stop the workloads first.
func (l *Launcher) Close() error {
	if l.container == nil {
		return nil
	}
	return l.container.close()
}

// stopGrace bounds how long a container runtime gets to delete a container.
const stopGrace = 10 * time.Second
