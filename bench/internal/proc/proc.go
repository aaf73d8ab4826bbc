//go:build linux

// Package proc runs the processes the benchmarks measure, the real nodectl binary and its
// agent among them, and reads their CPU time and memory from /proc, so that what a benchmark
// reports of the agent is the agent process's own and not the benchmark's.
package proc

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// binEnv names a nodectl binary to run instead of building one (make bench passes its own).
const binEnv = "NODECTL_BIN"

// Nodectl returns the nodectl binary: $NODECTL_BIN, or one built into dir from this checkout.
func Nodectl(dir string) (string, error) {
	if p := os.Getenv(binEnv); p != "" {
		return filepath.Abs(p)
	}
	out := filepath.Join(dir, "nodectl")
	cmd := exec.Command("go", "build", "-o", out, "github.com/nodectl/nodectl/cli/nodectl")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building nodectl (or set %s): %w: %s", binEnv, err, bytes.TrimSpace(b))
	}
	return out, nil
}

// Agent is a running `nodectl agent`.
type Agent struct {
	Pid    int
	bin    string
	socket string
	cmd    *exec.Cmd
	stderr bytes.Buffer // read only once the process is gone
	done   chan error
	stop   sync.Once
	err    error // Stop's
}

// readyPrefix starts the line the agent prints once it records and serves.
const readyPrefix = "nodectl agent: recording to"

// StartAgent runs `nodectl agent` with its data directory and socket in dir, at interval, and
// waits until it records and serves. The agent gets SIGTERM if this process dies first.
func StartAgent(bin, dir string, interval time.Duration, args ...string) (*Agent, error) {
	a := &Agent{bin: bin, socket: filepath.Join(dir, "agent.sock"), done: make(chan error, 1)}
	a.cmd = exec.Command(bin, append([]string{"agent", "--data-dir", filepath.Join(dir, "data"), "--socket", a.socket,
		"--interval", interval.String()}, args...)...)
	ready := NewLineWatch(readyPrefix)
	a.cmd.Stderr = &teeWriter{buf: &a.stderr, watch: ready}
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := a.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the agent: %w", err)
	}
	a.Pid = a.cmd.Process.Pid
	go func() { a.done <- a.cmd.Wait() }()
	select {
	case <-ready.Seen():
		return a, nil
	case err := <-a.done:
		return nil, fmt.Errorf("the agent exited before recording (%v): %s", err, strings.TrimSpace(a.stderr.String()))
	case <-time.After(time.Minute):
		a.cmd.Process.Kill()
		<-a.done
		return nil, errors.New("the agent did not start recording within a minute")
	}
}

// teeWriter keeps what the agent writes to stderr (for its errors) and watches it for a line.
type teeWriter struct {
	buf   *bytes.Buffer
	watch *LineWatch
}

func (w *teeWriter) Write(p []byte) (int, error) {
	w.buf.Write(p)
	return w.watch.Write(p)
}

// Stop sends SIGTERM and waits for the agent to close its store; it is killed after 30 s.
// Later calls return the first one's error.
func (a *Agent) Stop() error {
	a.stop.Do(func() {
		a.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-a.done:
			if err != nil {
				a.err = fmt.Errorf("the agent: %w: %s", err, strings.TrimSpace(a.stderr.String()))
			}
		case <-time.After(30 * time.Second):
			a.cmd.Process.Kill()
			<-a.done
			a.err = errors.New("the agent did not stop within 30s of SIGTERM")
		}
	})
	return a.err
}

// Status is what `nodectl agent status -o json` says that the benchmarks report (protojson
// writes 64-bit integers as strings).
type Status struct {
	TrackedCgroups  uint64 `json:"trackedCgroups,string"`
	OverflowCgroups uint64 `json:"overflowCgroups,string"`
	RSSBytes        uint64 `json:"rssBytes,string"`
	Store           struct {
		Bytes    uint64 `json:"bytes,string"`
		Writable bool   `json:"writable"`
	} `json:"store"`
	Tracer         map[string]string `json:"tracer"`
	IncidentsTotal uint64            `json:"incidentsTotal,string"`
}

// Incidents lists the agent's incidents as `nodectl agent incidents` prints them.
func (a *Agent) Incidents() (string, error) {
	out, err := exec.Command(a.bin, "agent", "incidents", "--socket", a.socket).Output()
	if err != nil {
		return "", fmt.Errorf("nodectl agent incidents: %w", err)
	}
	return string(out), nil
}

// Status asks the agent through the CLI, as an operator would.
func (a *Agent) Status() (Status, error) {
	var st Status
	out, err := exec.Command(a.bin, "agent", "status", "-o", "json", "--socket", a.socket).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, bytes.TrimSpace(ee.Stderr))
		}
		return st, fmt.Errorf("nodectl agent status: %w", err)
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return st, fmt.Errorf("reading nodectl agent status: %w", err)
	}
	return st, nil
}

// CPUTime is the time process pid's threads have been on a CPU, user and system, summed from
// their schedstat (what utime and stime count, in ns rather than in 10 ms ticks, which a
// run of a second or two needs); a thread that has exited is no longer counted, and the
// agent's do not exit.
func CPUTime(pid int) (time.Duration, error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil {
		return 0, err
	}
	if len(tasks) == 0 {
		return 0, fmt.Errorf("process %d: no threads", pid)
	}
	var sum time.Duration
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if errors.Is(err, os.ErrNotExist) {
			continue // exited since the listing
		}
		if err != nil {
			return 0, err
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			return 0, fmt.Errorf("%s: empty", t)
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", t, err)
		}
		sum += time.Duration(ns)
	}
	return sum, nil
}

// Memory is process pid's resident set now (VmRSS) and at its peak (VmHWM), in bytes.
func Memory(pid int) (rss, peak uint64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		var dst *uint64
		switch k {
		case "VmRSS":
			dst = &rss
		case "VmHWM":
			dst = &peak
		default:
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/%d/status %s: %w", pid, k, err)
		}
		*dst = kb << 10
	}
	return rss, peak, sc.Err()
}

// LineWatch is a writer that closes Seen once a line starting with its prefix has been
// written, and otherwise discards what it is given. Its writes come from one goroutine.
type LineWatch struct {
	prefix string
	seen   chan struct{}
	buf    []byte
}

// NewLineWatch watches for a line starting with prefix.
func NewLineWatch(prefix string) *LineWatch {
	return &LineWatch{prefix: prefix, seen: make(chan struct{})}
}

// Seen is closed once the line has been written.
func (w *LineWatch) Seen() <-chan struct{} { return w.seen }

func (w *LineWatch) Write(p []byte) (int, error) {
	select {
	case <-w.seen:
		return len(p), nil
	default:
	}
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		if strings.HasPrefix(string(w.buf[:i]), w.prefix) {
			close(w.seen)
			w.buf = nil
			break
		}
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}

// SyscallEvents are the tracepoints Syscalls counts: every syscall, then the kinds the agent
// makes most of (the sampler's reads, the tracer's map and program calls, opens and stats).
var SyscallEvents = []string{"raw_syscalls:sys_enter", "syscalls:sys_enter_pread64", "syscalls:sys_enter_bpf",
	"syscalls:sys_enter_openat", "syscalls:sys_enter_newfstatat"}

// PageFaults is the software event Syscalls counts besides SyscallEvents: the process's page
// faults, most of them the Go heap's pages touched again after its scavenger gave them back
// (a count too; each costs a trap, more so in a VM).
const PageFaults = "page-faults"

// Syscalls starts counting the syscalls of process pid's threads, by SyscallEvents, with
// perf stat; stop ends the count and returns each event's. A count, unlike a time, does not
// move with how fast this VM is today. Threads started after the call are not counted (the
// agent's are all running once warm).
func Syscalls(pid int) (stop func() (map[string]uint64, error), err error) {
	cmd := exec.Command("perf", "stat", "-x", ",", "-e", strings.Join(SyscallEvents, ",")+","+PageFaults, "-p", strconv.Itoa(pid))
	var out bytes.Buffer
	cmd.Stderr = &out // perf stat prints its counts on stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("counting syscalls: %w", err)
	}
	return func() (map[string]uint64, error) {
		// perf stat prints its counts when interrupted.
		if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
			return nil, err
		}
		cmd.Wait() // exits non-zero on SIGINT
		counts := map[string]uint64{}
		for line := range strings.SplitSeq(out.String(), "\n") {
			f := strings.Split(line, ",")
			if len(f) < 3 {
				continue
			}
			if n, err := strconv.ParseUint(f[0], 10, 64); err == nil {
				counts[f[2]] = n
			}
		}
		if _, ok := counts[SyscallEvents[0]]; !ok {
			return nil, fmt.Errorf("counting syscalls: perf stat printed no count:\n%s", out.String())
		}
		return counts, nil
	}, nil
}
