// Package launch starts stress workloads as child processes of the nodectl binary, each in its
// own cgroup, collects the measurements they print, and stops them.
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

// Spec describes one workload process.
type Spec struct {
	Name   string   // workload name: victim, cpu-hog-0, ...
	Cgroup string   // cgroup path, created by the caller
	Args   []string // arguments after the binary, e.g. ["workload", "victim", "--dir", ...]
	Log    io.Writer
}

// Process is a running workload.
type Process struct {
	Name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	mu   sync.Mutex
}

// Start runs exe with spec.Args in spec.Cgroup. Each line the workload prints on standard
// output is decoded as a workload.Measurement and handed to onMeasure.
func Start(exe string, p Placer, spec Spec, onMeasure func(string, workload.Measurement)) (*Process, error) {
	startR, startW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", spec.Name, err)
	}
	defer startR.Close()
	cmd := exec.Command(exe, spec.Args...)
	cmd.Env = append(os.Environ(), StartFDEnv+"=3")
	cmd.ExtraFiles = []*os.File{startR}
	cmd.Stderr = spec.Log
	// The workload dies with the launcher's thread if nodectl is killed; cgroup removal
	// (`nodectl stress clean`) catches anything that escapes this.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		startW.Close()
		return nil, fmt.Errorf("starting %s: %w", spec.Name, err)
	}
	if err := cmd.Start(); err != nil {
		startW.Close()
		return nil, fmt.Errorf("starting %s: %w", spec.Name, err)
	}
	proc := &Process{Name: spec.Name, cmd: cmd, done: make(chan struct{})}
	if err := p.AddProc(spec.Cgroup, cmd.Process.Pid); err != nil {
		startW.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("placing %s in cgroup %s: %w", spec.Name, spec.Cgroup, err)
	}
	_, werr := startW.Write([]byte{1})
	startW.Close()
	if werr != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("starting %s: %w", spec.Name, werr)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var m workload.Measurement
			if json.Unmarshal(sc.Bytes(), &m) == nil && m.Metric != "" && onMeasure != nil {
				onMeasure(spec.Name, m)
			}
		}
		err := cmd.Wait()
		proc.mu.Lock()
		proc.err = err
		proc.mu.Unlock()
		close(proc.done)
	}()
	return proc, nil
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
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
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
	f := os.NewFile(uintptr(fd), "start")
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
