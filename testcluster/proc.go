package testcluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// proc is a daemon of the cluster (etcd, kube-apiserver, containerd, the kubelet) in a process
// group of its own, so stopping it reaches whatever it forked and did not detach.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string        // its output file
	done chan struct{} // closed when it exited
	err  error         // its exit, once done
}

// startProc starts bin with args, its output in dir/<name>.log. The process is killed when the
// test binary dies (Pdeathsig), so a crashed test leaves no daemon running.
func startProc(name, dir, bin string, args []string, log *slog.Logger) (*proc, error) {
	logPath := filepath.Join(dir, name+".log")
	out, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening the log of %s: %w", name, err)
	}
	defer out.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	log.Debug("started", "component", name, "pid", cmd.Process.Pid, "log", logPath)
	return p, nil
}

// exited says whether the process has exited, and how.
func (p *proc) exited() (bool, error) {
	select {
	case <-p.done:
		return true, fmt.Errorf("%s exited: %v (log %s: %s)", p.name, p.err, p.log, tail(p.log, 15))
	default:
		return false, nil
	}
}

// stop sends SIGTERM to the process group, then SIGKILL after grace.
func (p *proc) stop(grace time.Duration) {
	if p == nil {
		return
	}
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
	}
	// The group may outlive its leader: kill what is left of it either way.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-p.done
}

// tail returns the last n lines of a log file, for an error.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// freePort asks the kernel for a loopback port nobody listens on.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// poll calls check every interval until it returns nil, the process dies or ctx ends.
func poll(ctx context.Context, interval time.Duration, what string, p *proc, check func() error) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	var last error
	for {
		err := check()
		if err == nil {
			return nil
		}
		if ctx.Err() == nil || last == nil {
			last = err // not the context's own error, when there was another
		}
		if p != nil {
			if dead, err := p.exited(); dead {
				return fmt.Errorf("waiting for %s: %w", what, err)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last: %v)", what, ctx.Err(), last)
		case <-t.C:
		}
	}
}

var errNotYet = errors.New("not yet")
