// Package launch starts stress workloads, each in its own cgroup, as child processes of the
// nodectl binary or inside runc containers or gVisor sandboxes, collects the measurements they
// print, and stops them.
package launch

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/nodectl/nodectl/stress/workload"
)

// StartFDEnv names the environment variable that tells a workload which inherited descriptor to
// read one byte from before it starts: the launcher writes it once the workload sits in its
// cgroup, so no work is ever done outside it.
const StartFDEnv = "NODECTL_START_FD"

// Placer moves a process into a cgroup (cgroup.Layout.AddProc).
type Placer interface {
	AddProc(path string, pid int) error
}

// Process is a running workload.
type Process struct {
	Name string
	cmd  *exec.Cmd
	// terminate asks the workload to finish; nil sends SIGTERM to cmd (a container runtime
	// instead delivers it to the container through the runtime).
	terminate func()
	done      chan struct{}
	err       error
	mu        sync.Mutex
}

// Start runs exe with spec.Args in spec.Cgroup as a plain child process. Each line the workload
// prints on standard output is decoded as a workload.Measurement and handed to onMeasure.
func Start(exe string, p Placer, spec Spec, onMeasure func(string, workload.Measurement)) (*Process, error) {
	return startPlaced(exe, p, spec, onMeasure, nil)
}

// startPlaced is Start with a hook that runs once the process has exited.
func startPlaced(exe string, p Placer, spec Spec, onMeasure func(string, workload.Measurement), after func()) (*Process, error) {
	startR, startW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", spec.Name, err)
	}
	defer startR.Close()
	cmd := exec.Command(exe, spec.Args...)
	cmd.Env = append(os.Environ(), StartFDEnv+"=3")
	cmd.ExtraFiles = []*os.File{startR}
	cmd.Stdin = spec.Stdin
	cmd.Stderr = spec.Log
	// The workload dies with the launcher's thread if nodectl is killed; cgroup removal
	// (`nodectl stress clean`) catches anything that escapes this.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	for _, m := range spec.Mounts {
		if err := os.MkdirAll(m, 0o755); err != nil {
			startW.Close()
			return nil, fmt.Errorf("starting %s: %w", spec.Name, err)
		}
	}
	proc, err := run(cmd, spec, onMeasure, after)
	if err != nil {
		startW.Close()
		return nil, err
	}
	if err := p.AddProc(spec.Cgroup, cmd.Process.Pid); err != nil {
		startW.Close()
		proc.kill()
		return nil, fmt.Errorf("placing %s in cgroup %s: %w", spec.Name, spec.Cgroup, err)
	}
	_, werr := startW.Write([]byte{1})
	startW.Close()
	if werr != nil {
		proc.kill()
		return nil, fmt.Errorf("starting %s: %w", spec.Name, werr)
	}
	return proc, nil
}

// run starts cmd and decodes its standard output into measurements until it exits; after runs
// once it has exited, before Done is closed.
func run(cmd *exec.Cmd, spec Spec, onMeasure func(string, workload.Measurement), after func()) (*Process, error) {
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", spec.Name, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", spec.Name, err)
	}
	proc := &Process{Name: spec.Name, cmd: cmd, done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var m workload.Measurement
			if json.Unmarshal(sc.Bytes(), &m) == nil && m.Metric != "" && onMeasure != nil {
				onMeasure(spec.Name, m)
			}
		}
		err := cmd.Wait()
		if after != nil {
			after()
		}
		proc.mu.Lock()
		proc.err = err
		proc.mu.Unlock()
		close(proc.done)
	}()
	return proc, nil
}

// kill ends a process that must not run, and waits for it.
func (p *Process) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is the exit status once Done is closed.
func (p *Process) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Stop asks the workload to finish (SIGTERM), and kills it if it has not within grace.
func (p *Process) Stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	if p.terminate != nil {
		p.terminate()
	} else {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	select {
	case <-p.done:
	case <-time.After(grace):
		if p.cmd != nil {
			_ = p.cmd.Process.Kill()
		}
		<-p.done
	}
}

// Go runs fn as a workload that is not one process: a driver loop such as sandbox churn, which
// starts containers of its own. Stop cancels its context and waits for it to return.
func Go(name string, fn func(ctx context.Context) error) *Process {
	ctx, cancel := context.WithCancel(context.Background())
	p := &Process{Name: name, terminate: cancel, done: make(chan struct{})}
	go func() {
		err := fn(ctx)
		cancel()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.done)
	}()
	return p
}

// StopAll stops every workload at once, so that n workloads take one grace period, not n.
func StopAll(procs []*Process, grace time.Duration) {
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Go(func() { p.Stop(grace) })
	}
	wg.Wait()
}

// WaitStart blocks a workload process until its launcher says go (see StartFDEnv). It is a
// no-op when the variable is unset, so workloads can also be run by hand.
func WaitStart(ctx context.Context) error {
	fdStr := os.Getenv(StartFDEnv)
	if fdStr == "" {
		return nil
	}
	os.Unsetenv(StartFDEnv)
	fd, err := strconv.Atoi(fdStr)
	if err != nil {
		return fmt.Errorf("waiting for the launcher: %s=%q is not a file descriptor number", StartFDEnv, fdStr)
	}
	f := os.NewFile(uintptr(fd), "start") //rundir:other: a file's name
	defer f.Close()
	got := make(chan error, 1)
	go func() {
		b := make([]byte, 1)
		_, err := f.Read(b)
		got <- err
	}()
	select {
	case err := <-got:
		if err != nil {
			if errors.Is(err, io.EOF) {
				return errors.New("the launcher went away before starting this workload")
			}
			return fmt.Errorf("waiting for the launcher: %w", err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
