// Package clix holds what the command groups share: output format flags, privilege checks,
// signal handling and the analyzer's report rendering.
package clix

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/nodectl/nodectl/host"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/nodectl/nodectl/analyzer"
	"github.com/nodectl/nodectl/stress"
)

// Version is nodectl's version, set at build time with -ldflags
// "-X github.com/nodectl/nodectl/cli/internal/clix.Version=...".
var Version = "dev"

// Capabilities a command may need, by number (linux/capability.h).
const (
	CapSysAdmin = 21
	CapPerfmon  = 38
	CapBPF      = 39
)

var capNames = map[int]string{CapSysAdmin: "CAP_SYS_ADMIN", CapPerfmon: "CAP_PERFMON", CapBPF: "CAP_BPF"}

// Need returns an error naming each missing capability and what needs it, or nil. why maps a
// capability to the reason it is needed.
func Need(cmd string, why map[int]string) error {
	var hdr unix.CapUserHeader
	hdr.Version = unix.LINUX_CAPABILITY_VERSION_3
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("reading this process's capabilities: %w", err)
	}
	var missing []string
	for c, reason := range why {
		word, bit := c/32, uint(c%32)
		if data[word].Effective&(1<<bit) == 0 {
			missing = append(missing, fmt.Sprintf("%s (%s)", capNames[c], reason))
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("%s needs root: missing %s; run it with sudo", cmd, strings.Join(missing, ", "))
}

// CheckOutput validates an -o value.
func CheckOutput(o string) error {
	if o != "text" && o != "json" {
		return fmt.Errorf("-o %q: allowed values are text and json", o)
	}
	return nil
}

// SignalContext is cancelled on SIGINT or SIGTERM, with the signal as the cause, so long runs
// stop, clean up and say why. A second signal while cleaning up exits at once, saying what to
// run to remove what is left.
func SignalContext(parent context.Context, stderr io.Writer) (context.Context, context.CancelFunc) {
	return SignalContextHint(parent, stderr, "run 'nodectl stress clean' to remove what is left")
}

// SignalContextHint is SignalContext with what to run after a second signal, e.g. the tuner's
// rollback.
func SignalContextHint(parent context.Context, stderr io.Writer, hint string) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-ch:
			cancel(fmt.Errorf("received %s", s))
		case <-done:
			return
		}
		select {
		case s := <-ch:
			fmt.Fprintf(stderr, "\nnodectl: %s again: exiting without cleaning up; %s\n", s, hint)
			os.Exit(130)
		case <-done:
		}
	}()
	return ctx, func() { signal.Stop(ch); close(done); cancel(nil) }
}

// IsTerminal reports whether f is a terminal (live progress lines are rewritten in place).
func IsTerminal(f *os.File) bool { return term.IsTerminal(int(f.Fd())) }

// Logger is the CLI's logger: text on stderr, debug with --verbose.
func Logger(w io.Writer, verbose bool) *slog.Logger {
	lvl := slog.LevelWarn
	if verbose {
		lvl = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: lvl}))
}

// Render prints a report in the chosen format.
func Render(w io.Writer, rep *analyzer.Report, output string) error {
	if output == "json" {
		return analyzer.RenderJSON(w, rep)
	}
	return analyzer.RenderText(w, rep)
}

// HostPathFlags registers the host locations as flags, so the same binary works on /host in a
// DaemonSet or on a scratch tree.
func HostPathFlags(f *pflag.FlagSet, p *host.FS) {
	f.StringVar(&p.Cgroupfs, "cgroupfs", p.Cgroupfs, "cgroup filesystem root of the host")
	f.StringVar(&p.Procfs, "procfs", p.Procfs, "procfs of the host")
	f.StringVar(&p.Sysfs, "sysfs", p.Sysfs, "sysfs of the host")
	f.StringVar(&p.Tracefs, "tracefs", p.Tracefs, "tracefs of the host; mounted there for the run if missing")
}

// RunPathFlags registers where stress runs keep their scratch files and live state.
func RunPathFlags(f *pflag.FlagSet, p *stress.Paths) {
	f.StringVar(&p.Scratch, "scratch-dir", p.Scratch, "parent of each run's scratch directory, where the victim and disk hogs write")
	f.StringVar(&p.State, "state-dir", p.State, "parent of each live run's state (owner pid)")
}
