//go:build linux

// Command overhead measures what the tracer costs a scheduler-heavy workload: two processes
// pinned to one CPU bounce a byte over pipes (two context switches per round trip, each after
// a wakeup or a wakeup preemption), with the tracer detached, attached, and attached with BPF run-time statistics,
// alternating in each round so that drift on a shared machine hits every mode alike. It
// prints the throughput ratio attached/detached and each program's mean cost per event.
//
// Run as root: go run ./bench/overhead [-rounds 10] [-duration 1s] [-cpu N|-1]
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/nodectl/nodectl/agent/trace"
)

// roleEnv makes the binary one side of the ping-pong.
const roleEnv = "NODECTL_BENCH_ROLE"

func main() {
	if role := os.Getenv(roleEnv); role != "" {
		if err := bounce(role); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	rounds := flag.Int("rounds", 10, "rounds; each runs every mode once")
	dur := flag.Duration("duration", time.Second, "length of one run")
	cpu := flag.Int("cpu", runtime.NumCPU()-1, "CPU both sides of the ping-pong are pinned to; -1 leaves them free")
	flag.Parse()
	if _, err := run(*rounds, *dur, *cpu); err != nil {
		fmt.Fprintln(os.Stderr, "overhead:", err)
		os.Exit(1)
	}
}

type mode int

const (
	detached mode = iota
	attached
	withStats // attached, with kernel.bpf_stats_enabled: costs a little, so timed apart
)

func (m mode) String() string { return [...]string{"detached", "attached", "attached+stats"}[m] }

// progStats accumulates one program's statistics over the runs with statistics on.
type progStats struct {
	runtime time.Duration
	count   uint64
}

// result is what run measured: the median throughput ratio attached/detached, and each
// program's mean nanoseconds per event.
type result struct {
	ratio      float64
	nsPerEvent map[string]float64
}

// run measures and prints the report.
func run(rounds int, dur time.Duration, cpu int) (result, error) {
	if os.Geteuid() != 0 {
		return result{}, errors.New("needs root to load BPF programs")
	}
	unmount, err := tracefs()
	if err != nil {
		return result{}, err
	}
	defer unmount()

	rate := map[mode][]float64{}
	progs := map[string]*progStats{}
	var status map[string]string
	for r := range rounds {
		// Rotate the order so that no mode always runs first or last.
		order := []mode{detached, attached, withStats}
		for range r % len(order) {
			order = append(order[1:], order[0])
		}
		for _, m := range order {
			v, st, err := measure(m, dur, cpu, progs)
			if err != nil {
				return result{}, fmt.Errorf("round %d, %s: %w", r+1, m, err)
			}
			if st != nil {
				status = st
			}
			rate[m] = append(rate[m], v)
			fmt.Printf("round %d %-15s %10.0f round trips/s\n", r+1, m, v)
		}
	}

	fmt.Println()
	for _, p := range slices.Sorted(maps.Keys(status)) {
		fmt.Printf("program %-6s %s\n", p, status[p])
	}
	fmt.Printf("\nthroughput (median round trips/s): detached %.0f, attached %.0f, attached+stats %.0f\n",
		median(rate[detached]), median(rate[attached]), median(rate[withStats]))
	var ratios []float64
	for i := range rate[detached] {
		ratios = append(ratios, rate[attached][i]/rate[detached][i])
	}
	res := result{ratio: median(ratios), nsPerEvent: map[string]float64{}}
	fmt.Printf("ratio attached/detached: median %.3f (per round %s)\n", res.ratio, fmtAll(ratios))
	fmt.Println("\nmean cost per event (BPF run-time statistics, as kernel.bpf_stats_enabled=1):")
	for _, name := range slices.Sorted(maps.Keys(progs)) {
		s := progs[name]
		if s.count == 0 {
			fmt.Printf("  %-16s no events\n", name)
			continue
		}
		res.nsPerEvent[name] = float64(s.runtime.Nanoseconds()) / float64(s.count)
		fmt.Printf("  %-16s %6.0f ns  (%d events)\n", name, res.nsPerEvent[name], s.count)
	}
	return res, nil
}

// measure runs the ping-pong once in mode m and returns round trips per second, and the
// tracer's status when it was attached.
func measure(m mode, dur time.Duration, cpu int, progs map[string]*progStats) (float64, map[string]string, error) {
	var status map[string]string
	if m != detached {
		tr, err := trace.New(trace.Config{CgroupV1: cgroupV1()}, nopResolver{}, slog.New(slog.DiscardHandler))
		if err != nil {
			return 0, nil, fmt.Errorf("loading tracer: %w", err)
		}
		defer tr.Close()
		status = tr.Status()
	}
	var before map[string]progStats
	if m == withStats {
		stats, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
		if err != nil {
			return 0, nil, fmt.Errorf("enabling BPF statistics: %w", err)
		}
		defer stats.Close()
		if before, err = ownPrograms(); err != nil {
			return 0, nil, err
		}
	}
	v, err := pingPong(dur, cpu)
	if err != nil {
		return 0, nil, err
	}
	if m == withStats {
		after, err := ownPrograms()
		if err != nil {
			return 0, nil, err
		}
		for name, a := range after {
			s := progs[name]
			if s == nil {
				s = &progStats{}
				progs[name] = s
			}
			s.runtime += a.runtime - before[name].runtime
			s.count += a.count - before[name].count
		}
	}
	return v, status, nil
}

// ownPrograms reads the statistics of the BPF programs this process holds, by name.
func ownPrograms() (map[string]progStats, error) {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil, fmt.Errorf("listing own fds: %w", err)
	}
	out := map[string]progStats{}
	for _, fd := range fds {
		if l, _ := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); l != "anon_inode:bpf-prog" {
			continue
		}
		id, err := progID(fd.Name())
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

func progID(fd string) (uint32, error) {
	f, err := os.Open(filepath.Join("/proc/self/fdinfo", fd))
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
	return 0, fmt.Errorf("no prog_id in fdinfo of fd %s", fd)
}

// pingPong runs the two sides as child processes and returns the pinger's round trips per
// second.
func pingPong(dur time.Duration, cpu int) (float64, error) {
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
	if cpu >= 0 {
		var set unix.CPUSet
		set.Set(cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			return fmt.Errorf("pinning to cpu %d: %w", cpu, err)
		}
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

// tracefs mounts tracefs, which the fsync program's syscall tracepoints need, unless it is
// there; the returned function unmounts what was mounted.
func tracefs() (func(), error) {
	const dir = "/sys/kernel/tracing"
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) == nil && st.Type == unix.TRACEFS_MAGIC {
		return func() {}, nil
	}
	if err := unix.Mount("nodev", dir, "tracefs", 0, ""); err != nil {
		return nil, fmt.Errorf("mounting tracefs at %s: %w", dir, err)
	}
	return func() { unix.Unmount(dir, unix.MNT_DETACH) }, nil
}

func cgroupV1() bool {
	_, err := os.Stat("/sys/fs/cgroup/cgroup.controllers")
	return err != nil
}

// nopResolver names nothing: the benchmark never collects.
type nopResolver struct{}

func (nopResolver) Path(string, uint64) (string, bool) { return "", false }

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(v))
	return s[len(s)/2]
}

func fmtAll(v []float64) string {
	var parts []string
	for _, x := range v {
		parts = append(parts, strconv.FormatFloat(x, 'f', 3, 64))
	}
	return strings.Join(parts, " ")
}
