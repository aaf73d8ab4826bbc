//go:build linux

package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/nodectl/nodectl/bench/internal/proc"
	"github.com/nodectl/nodectl/record/trace"
	"github.com/nodectl/nodectl/record/trace/fsync"
	"github.com/nodectl/nodectl/record/trace/tracefs"
)

// hooks are the scheduler tracepoints the run-queue tracer uses, as the summary names them.
var hooks = []string{"sched_switch", "sched_wakeup", "sched_wakeup_new"}

// hookOf names the hook of a program of the tracer or of the bpftrace script ("" for others).
// Kernel program names are cut to 15 characters.
func hookOf(program string) string {
	switch program {
	case "runq_switch", "sched_switch":
		return "sched_switch"
	case "runq_wakeup", "sched_wakeup":
		return "sched_wakeup"
	case "runq_wakeup_new", "sched_wakeup_ne":
		return "sched_wakeup_new"
	}
	return ""
}

// bpftraceScript is the reference: per-cgroup run-queue latency the bpftrace way, from
// wakeup (or preemption) to running. BEGIN fires once every probe is attached.
const bpftraceScript = `
BEGIN { printf("ready\n"); }
tracepoint:sched:sched_wakeup { @queued[args->pid] = nsecs; }
tracepoint:sched:sched_wakeup_new { @queued[args->pid] = nsecs; }
tracepoint:sched:sched_switch
{
	if (args->prev_state == 0) {
		@queued[args->prev_pid] = nsecs;
	}
	$t = @queued[args->next_pid];
	if ($t) {
		@runq_ns[cgroup] = hist(nsecs - $t);
		delete(@queued[args->next_pid]);
	}
}
`

// tool attaches programs for one run.
type tool struct {
	start  func() (*attachment, error)
	status map[string]string // the tracer's program status, once started
}

// attachment is a tool's programs attached.
type attachment struct {
	programs func() (map[string]progStats, error) // run-time statistics by program name
	cpu      func() (time.Duration, error)        // CPU time of the tool's own process; nil when it runs in ours
	stop     func() error
}

// progStats is one program's run time and run count.
type progStats struct {
	runtime time.Duration
	count   uint64
}

// nodectlTool loads the tracer as the agent does, with its fsync program on hooks ("" for
// the ones it chooses).
func nodectlTool(hooks fsync.Hooks) *tool {
	t := &tool{}
	t.start = func() (*attachment, error) {
		tr, err := trace.New(trace.Config{CgroupV1: cgroupV1(), FsyncHooks: hooks}, nopResolver{}, slog.New(slog.DiscardHandler))
		if err != nil {
			return nil, fmt.Errorf("loading tracer: %w", err)
		}
		t.status = tr.Status()
		return &attachment{programs: func() (map[string]progStats, error) { return programs("self") }, stop: tr.Close}, nil
	}
	return t
}

// emptyTool attaches a program that does nothing to each hook the run-queue tracer uses, the
// way it does (tp_btf): what any program there costs.
func emptyTool() *tool {
	return &tool{start: func() (*attachment, error) {
		var open []interface{ Close() error }
		stop := func() error {
			var errs []error
			for i := len(open) - 1; i >= 0; i-- {
				errs = append(errs, open[i].Close())
			}
			return errors.Join(errs...)
		}
		for _, hook := range hooks {
			prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
				Name:         hook, // cut to 15 characters by the kernel, as hookOf expects
				Type:         ebpf.Tracing,
				AttachType:   ebpf.AttachTraceRawTp,
				AttachTo:     hook,
				License:      "GPL",
				Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
			})
			if err != nil {
				stop()
				return nil, fmt.Errorf("loading an empty program for %s: %w", hook, err)
			}
			open = append(open, prog)
			l, err := link.AttachTracing(link.TracingOptions{Program: prog})
			if err != nil {
				stop()
				return nil, fmt.Errorf("attaching an empty program to %s: %w", hook, err)
			}
			open = append(open, l)
		}
		return &attachment{programs: func() (map[string]progStats, error) { return programs("self") }, stop: stop}, nil
	}}
}

// agentWarmup lets a freshly started agent past its start (loading its programs, the first
// full reading of every cgroup) before a run, as a long-running agent is.
const agentWarmup = 2500 * time.Millisecond

// agentTool runs the whole agent, `nodectl agent` (tracers, samplers, flight recorder, API)
// as its own process at interval, each time in a scratch directory of its own; its CPU time
// and its programs' statistics are read from its pid.
func agentTool(bin string, interval time.Duration) *tool {
	return &tool{start: func() (*attachment, error) {
		dir, err := os.MkdirTemp("", "nodectl-bench-agent-")
		if err != nil {
			return nil, err
		}
		a, err := proc.StartAgent(bin, dir, interval)
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		time.Sleep(agentWarmup)
		pid := strconv.Itoa(a.Pid)
		return &attachment{
			programs: func() (map[string]progStats, error) { return programs(pid) },
			cpu:      func() (time.Duration, error) { return proc.CPUTime(a.Pid) },
			stop:     func() error { return errors.Join(a.Stop(), os.RemoveAll(dir)) },
		}, nil
	}}
}

func bpftraceTool() (*tool, error) {
	path, err := exec.LookPath("bpftrace")
	if err != nil {
		return nil, err
	}
	return &tool{start: func() (*attachment, error) { return startBpftrace(path) }}, nil
}

// startBpftrace runs the script until stop, having waited for its probes to be attached.
func startBpftrace(path string) (*attachment, error) {
	cmd := exec.Command(path, "-e", bpftraceScript)
	ready := proc.NewLineWatch("ready")
	var stderr bytes.Buffer
	cmd.Stdout = ready // the maps it prints at exit are discarded
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting bpftrace: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-ready.Seen():
	case err := <-done:
		return nil, fmt.Errorf("bpftrace exited before attaching (%v): %s", err, strings.TrimSpace(stderr.String()))
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		<-done
		return nil, errors.New("bpftrace did not attach within a minute")
	}
	pid := strconv.Itoa(cmd.Process.Pid)
	stop := func() error {
		cmd.Process.Signal(os.Interrupt)
		select {
		case err := <-done:
			if err != nil {
				return fmt.Errorf("bpftrace: %w: %s", err, strings.TrimSpace(stderr.String()))
			}
			return nil
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
			return errors.New("bpftrace did not stop on SIGINT")
		}
	}
	return &attachment{programs: func() (map[string]progStats, error) { return programs(pid) }, stop: stop}, nil
}

// runResult is one measured run of a workload.
type runResult struct {
	rate    float64       // ops per second
	wall    time.Duration // how long the workload ran
	toolCPU time.Duration // CPU time the tool's own process used meanwhile, when it has one
	// progs are the tool's programs' statistics in this run alone, when they were on.
	progs map[string]progStats
}

// measure runs w once, under t when it is not nil. With acc it turns the BPF run-time
// statistics on for the run and adds t's programs' share to acc.
func measure(t *tool, w workload, acc map[string]*progStats) (_ runResult, err error) {
	var a *attachment
	if t != nil {
		if a, err = t.start(); err != nil {
			return runResult{}, err
		}
		defer func() { err = errors.Join(err, a.stop()) }()
	}
	var before map[string]progStats
	if acc != nil {
		stats, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
		if err != nil {
			return runResult{}, fmt.Errorf("enabling BPF statistics: %w", err)
		}
		defer stats.Close()
		if before, err = a.programs(); err != nil {
			return runResult{}, err
		}
	}
	var cpu0 time.Duration
	if a != nil && a.cpu != nil {
		if cpu0, err = a.cpu(); err != nil {
			return runResult{}, err
		}
	}
	t0 := time.Now()
	v, err := w.run()
	if err != nil {
		return runResult{}, err
	}
	r := runResult{rate: v, wall: time.Since(t0)}
	if a != nil && a.cpu != nil {
		cpu1, err := a.cpu()
		if err != nil {
			return runResult{}, err
		}
		r.toolCPU = cpu1 - cpu0
	}
	if acc != nil {
		after, err := a.programs()
		if err != nil {
			return runResult{}, err
		}
		r.progs = map[string]progStats{}
		for name, s := range after {
			if acc[name] == nil {
				acc[name] = &progStats{}
			}
			d := progStats{runtime: s.runtime - before[name].runtime, count: s.count - before[name].count}
			r.progs[name] = d
			acc[name].runtime += d.runtime
			acc[name].count += d.count
		}
	}
	return r, nil
}

// programs reads the statistics of the BPF programs process pid ("self" for this one) holds,
// summed by program name.
func programs(pid string) (map[string]progStats, error) {
	dir := filepath.Join("/proc", pid, "fd")
	fds, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("listing fds: %w", err)
	}
	out := map[string]progStats{}
	for _, fd := range fds {
		if l, _ := os.Readlink(filepath.Join(dir, fd.Name())); l != "anon_inode:bpf-prog" {
			continue
		}
		id, err := progID(filepath.Join("/proc", pid, "fdinfo", fd.Name()))
		if err != nil {
			return nil, err
		}
		p, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
		if err != nil {
			return nil, fmt.Errorf("opening program %d: %w", id, err)
		}
		info, err := p.Info()
		if err == nil {
			var st *ebpf.ProgramStats
			if st, err = p.Stats(); err == nil {
				s := out[info.Name]
				s.runtime += st.Runtime
				s.count += st.RunCount
				out[info.Name] = s
			}
		}
		p.Close()
		if err != nil {
			return nil, fmt.Errorf("reading program %d: %w", id, err)
		}
	}
	return out, nil
}

func progID(fdinfo string) (uint32, error) {
	f, err := os.Open(fdinfo)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "prog_id:"); ok {
			id, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
			return uint32(id), err
		}
	}
	return 0, fmt.Errorf("no prog_id in %s", fdinfo)
}

// ensureTracefs makes tracefs available for the whole benchmark, as the tracer would for
// itself, and returns what leaves the machine as found.
func ensureTracefs() (func(), error) {
	m, err := tracefs.Ensure(tracefs.DefaultDir)
	if err != nil {
		return nil, err
	}
	return func() {
		if err := m.Release(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}, nil
}

func cgroupV1() bool {
	_, err := os.Stat("/sys/fs/cgroup/cgroup.controllers")
	return err != nil
}

// nopResolver names nothing: the benchmark never collects.
type nopResolver struct{}

func (nopResolver) Path(string, uint64) (string, bool) { return "", false }
