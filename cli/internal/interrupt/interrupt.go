// Package interrupt turns SIGINT, SIGTERM and SIGHUP into a cancelled context, so long runs
// stop, clean up and say why.
package interrupt

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// SignalContext is cancelled on SIGINT, SIGTERM or SIGHUP (the terminal or the SSH session
// gone: the default would kill the process mid-run, its cgroups, hogs and tuning left behind),
// with the signal as the cause, so long runs stop, clean up and say why. A second signal while cleaning up exits at once, saying what to
// run to remove what is left.
func SignalContext(parent context.Context, stderr io.Writer) (context.Context, context.CancelFunc) {
	return SignalContextHint(parent, stderr, "run 'nodectl stress clean' to remove what is left")
}

// Signals are those that stop a run: what a person, a service manager and a lost terminal send.
var Signals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP}

// SignalContextHint is SignalContext with what to run after a second signal, e.g. the tuner's
// rollback.
func SignalContextHint(parent context.Context, stderr io.Writer, hint string) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, Signals...)
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
