//go:build linux

package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// perfWorkload sizes perf bench sched pipe's loop count so that one run takes about
// o.perfDuration.
func perfWorkload(o options) (workload, error) {
	path, err := exec.LookPath("perf")
	if err != nil {
		return workload{}, err
	}
	var cpus [2]int
	if o.perfPin {
		if cpus, err = twoCPUs(); err != nil {
			return workload{}, err
		}
	}
	run := func(loops int) (float64, error) { return perfPipe(path, loops, o.perfPin, cpus) }
	// A warm-up, then the slowest of three short runs sizes the loop count: unpinned, an op
	// costs several times more when the two processes land on different CPUs.
	const probe = 3000
	if _, err := run(probe); err != nil {
		return workload{}, err
	}
	var rates []float64
	for range 3 {
		r, err := run(probe)
		if err != nil {
			return workload{}, err
		}
		rates = append(rates, r)
	}
	loops := max(probe, int(slices.Min(rates)*o.perfDuration.Seconds()))
	return workload{name: perfBench, ops: loops, run: func() (float64, error) { return run(loops) }}, nil
}

// perfPipe runs perf bench sched pipe for loops ops and returns its ops per second. With pin
// its two processes (perf itself and the child it forks) go to cpus[0] and cpus[1].
func perfPipe(path string, loops int, pin bool, cpus [2]int) (float64, error) {
	cmd := exec.Command(path, "bench", "sched", "pipe", "-l", strconv.Itoa(loops))
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("starting perf: %w", err)
	}
	if pin {
		if err := pinPair(cmd.Process.Pid, cpus); err != nil {
			cmd.Process.Kill()
			cmd.Wait()
			return 0, err
		}
	}
	if err := cmd.Wait(); err != nil {
		return 0, fmt.Errorf("perf bench: %w: %s", err, strings.TrimSpace(out.String()))
	}
	for _, line := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[1] == "ops/sec" {
			return strconv.ParseFloat(f[0], 64)
		}
	}
	return 0, fmt.Errorf("no ops/sec in perf's output: %s", out.String())
}

// pinPair pins process pid to cpus[0] and, as soon as it has forked, its child to cpus[1].
// Until then both run unpinned or on cpus[0]: a few milliseconds of a run.
func pinPair(pid int, cpus [2]int) error {
	if err := setCPU(pid, cpus[0]); err != nil {
		return err
	}
	children := fmt.Sprintf("/proc/%d/task/%d/children", pid, pid)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		b, err := os.ReadFile(children)
		if errors.Is(err, os.ErrNotExist) {
			return nil // done already
		}
		if err != nil {
			return fmt.Errorf("finding perf's child: %w", err)
		}
		if f := strings.Fields(string(b)); len(f) > 0 {
			child, err := strconv.Atoi(f[0])
			if err != nil {
				return fmt.Errorf("bad child pid %q: %w", f[0], err)
			}
			return setCPU(child, cpus[1])
		}
	}
	return errors.New("perf forked no child within 5s")
}

func setCPU(pid, cpu int) error {
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(pid, &set); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("pinning %d to cpu %d: %w", pid, cpu, err)
	}
	return nil
}

// twoCPUs returns the first and the last CPU this process may run on.
func twoCPUs() ([2]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return [2]int{}, fmt.Errorf("reading affinity: %w", err)
	}
	var cpus []int
	for c := range 1024 {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	if len(cpus) < 2 {
		return [2]int{}, errors.New("needs two CPUs to put perf's processes on different ones")
	}
	return [2]int{cpus[0], cpus[len(cpus)-1]}, nil
}

// roleEnv makes the binary one side of the ping-pong.
const roleEnv = "NODECTL_BENCH_ROLE"

// pingPongRun runs the two sides as child processes and returns the pinger's round trips per
// second.
func pingPongRun(dur time.Duration, cpu int) (float64, error) {
	var toPong, toPing [2]int
	if err := unix.Pipe2(toPong[:], unix.O_CLOEXEC); err != nil {
		return 0, fmt.Errorf("making pipe: %w", err)
	}
	if err := unix.Pipe2(toPing[:], unix.O_CLOEXEC); err != nil {
		unix.Close(toPong[0])
		unix.Close(toPong[1])
		return 0, fmt.Errorf("making pipe: %w", err)
	}
	files := func(in, out int) []*os.File {
		return []*os.File{os.NewFile(uintptr(in), "in"), os.NewFile(uintptr(out), "out")}
	}
	self, err := os.Executable()
	if err != nil {
		return 0, err
	}
	env := func(role string) []string {
		return append(os.Environ(), roleEnv+"="+role, "NODECTL_BENCH_CPU="+strconv.Itoa(cpu),
			"NODECTL_BENCH_DURATION="+dur.String())
	}
	pong := exec.Command(self)
	pong.Env = env("pong")
	pong.ExtraFiles = files(toPong[0], toPing[1])
	pong.Stderr = os.Stderr
	ping := exec.Command(self)
	ping.Env = env("ping")
	ping.ExtraFiles = files(toPing[0], toPong[1])
	ping.Stderr = os.Stderr
	if err := pong.Start(); err != nil {
		return 0, fmt.Errorf("starting pong: %w", err)
	}
	out, err := ping.Output()
	// The pinger closed its end: the ponger reads EOF and exits.
	for _, f := range append(pong.ExtraFiles, ping.ExtraFiles...) {
		f.Close()
	}
	werr := pong.Wait()
	if err != nil {
		return 0, fmt.Errorf("ping: %w", err)
	}
	if werr != nil {
		return 0, fmt.Errorf("pong: %w", werr)
	}
	return strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
}

// bounce is one side of the ping-pong, on fds 3 (in) and 4 (out). The pinger sends first and
// prints round trips per second after the run's duration; the ponger echoes until EOF.
func bounce(role string) error {
	runtime.LockOSThread()
	cpu, err := strconv.Atoi(os.Getenv("NODECTL_BENCH_CPU"))
	if err != nil {
		return fmt.Errorf("bad cpu: %w", err)
	}
	if err := setCPU(0, cpu); err != nil {
		return err
	}
	const in, out = 3, 4
	buf := []byte{0}
	if role == "pong" {
		for {
			n, err := unix.Read(in, buf)
			if n == 0 || err != nil {
				return nil
			}
			if _, err := unix.Write(out, buf); err != nil {
				return nil
			}
		}
	}
	dur, err := time.ParseDuration(os.Getenv("NODECTL_BENCH_DURATION"))
	if err != nil {
		return fmt.Errorf("bad duration: %w", err)
	}
	start := time.Now()
	n := 0
	for ; ; n++ {
		// Check the clock every 1024 round trips only: it is a vDSO call, but still work.
		if n%1024 == 0 && time.Since(start) >= dur {
			break
		}
		if _, err := unix.Write(out, buf); err != nil {
			return fmt.Errorf("ping write: %w", err)
		}
		if _, err := unix.Read(in, buf); err != nil {
			return fmt.Errorf("ping read: %w", err)
		}
	}
	fmt.Println(float64(n) / time.Since(start).Seconds())
	return nil
}

// getppidRun makes n getppid calls, the cheapest syscall, and returns calls per second: what
// a hook on every syscall adds shows whole.
func getppidRun(n int) float64 {
	start := time.Now()
	for range n {
		unix.Getppid()
	}
	return float64(n) / time.Since(start).Seconds()
}
