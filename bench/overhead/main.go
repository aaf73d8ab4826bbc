//go:build linux

// Command overhead measures what the tracer costs scheduler-heavy workloads, next to what
// bpftrace costs them running a per-cgroup run-queue latency histogram, the usual way to get
// the same answer.
//
// Primary workload: `perf bench sched pipe`, two processes bouncing a message over pipes,
// pinned to different CPUs so that every op wakes the other CPU. Left unpinned
// (-perf-pin=false), the scheduler sometimes puts both on one CPU, where an op costs several
// times less: on a 2-CPU VM the rate of a run then swings by tens of percent and the ratios
// are noise. A cross-CPU op is mostly the wakeup of an idle CPU (tens of µs in a VM), so the
// programs' own time per op, from their run-time statistics, is printed beside the ratio.
// Worst case: a Go ping-pong with both sides pinned to one CPU, a few µs a round trip, where
// any program at all costs; an empty program on each hook the tracer uses gives that floor.
//
// The whole agent, `nodectl agent` as its own process (built from this checkout, or
// $NODECTL_BIN), runs under perf bench too: its throughput ratio, its process's CPU time and
// its programs' run time per second of load, at --interval 1s and at 1h (tracing only), which
// splits its sampling and writing from its tracing.
//
// Modes run alternately within each round, so that drift on a shared machine hits every mode
// alike; the ratio attached/detached is the median over rounds. Mean nanoseconds per event
// come from the kernel's BPF run-time statistics (kernel.bpf_stats_enabled), in separate runs
// since the statistics cost time themselves. Timings are for people to read: nothing is
// asserted.
//
// Run as root: go run ./bench/overhead [-rounds 10] [-perf-duration 1.5s] [-ping-rounds 4] ...
package main

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nodectl/nodectl/bench/internal/proc"
	"github.com/nodectl/nodectl/record/trace/fsync"
)

func main() {
	if role := os.Getenv(roleEnv); role != "" {
		if err := bounce(role); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	o := defaults
	flag.IntVar(&o.perfRounds, "rounds", o.perfRounds, "perf bench rounds; each runs every mode once")
	flag.IntVar(&o.statsRounds, "stats-rounds", o.statsRounds, "of those, how many also run each tool with BPF statistics on")
	flag.DurationVar(&o.perfDuration, "perf-duration", o.perfDuration, "aimed length of one perf bench run (sets its -l)")
	flag.BoolVar(&o.perfPin, "perf-pin", o.perfPin, "pin perf bench's two processes to different CPUs")
	flag.IntVar(&o.pingRounds, "ping-rounds", o.pingRounds, "ping-pong rounds")
	flag.DurationVar(&o.pingDuration, "duration", o.pingDuration, "length of one ping-pong run")
	flag.IntVar(&o.cpu, "cpu", o.cpu, "CPU both sides of the ping-pong are pinned to")
	flag.IntVar(&o.syscalls, "syscalls", o.syscalls, "getppid calls in a run of the syscall row (0: left out)")
	flag.Parse()
	if _, err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "overhead:", err)
		os.Exit(1)
	}
}

type options struct {
	perfRounds, statsRounds int
	perfDuration            time.Duration
	perfPin                 bool
	pingRounds              int
	pingDuration            time.Duration
	cpu                     int
	syscalls                int  // getppid calls a run of the syscall row; 0 leaves it out
	agents                  bool // also run the whole agent as its own process
	// The sampler's cost: at samplingCgroups cgroups, samplingRounds of samplingSpan each of
	// its rotating and of its full Sample; no cgroups, not measured.
	samplingCgroups, samplingRounds int
	samplingSpan                    time.Duration
}

// defaults keep a whole run, make bench's, to about four minutes on 2 CPUs (each agent run
// starts the agent afresh and lets it warm up): the ping-pong varies little from run to run,
// perf bench a few percent, and per-event costs settle within a few runs.
var defaults = options{
	perfRounds: 10, statsRounds: 3, perfDuration: 1500 * time.Millisecond, perfPin: true,
	pingRounds: 4, pingDuration: time.Second, cpu: runtime.NumCPU() - 1, syscalls: 5_000_000, agents: true,
	samplingCgroups: 1000, samplingRounds: 3, samplingSpan: 2 * time.Second,
}

// result is what run measured, for the benchmark's metrics: median ratios attached/detached
// by workload and tool, and mean ns per event by tool and hook.
type result struct {
	ratio      map[string]map[string]float64
	nsPerEvent map[string]map[string]float64 // perf bench runs, by tool and hook
	opNs       float64                       // a detached perf bench op
	bpfNsPerOp map[string]float64            // all programs' time per perf bench op, by tool
	agent      map[string]agentCost          // the whole agent's cost under perf bench, by mode
	rows       []row                         // the goals' rows
}

// Workload and tool names as printed.
const (
	perfBench = "perf bench sched pipe"
	pingPong  = "Go ping-pong, one CPU"
	syscalls  = "getppid loop"
	detached  = "detached"
	nodectl   = "nodectl"
	// The tracer with its fsync program on the syscall tracepoints, as on a node with a
	// writable disk filesystem other than ext4: only in the syscall row.
	nodectlSyscalls = "nodectl@syscalls"
	bpftrace        = "bpftrace"
	empty           = "empty programs"
	// The whole agent as its own process, sampling and writing every second as deployed, and
	// with an interval long enough that it only traces and serves: the difference is what its
	// sampling, its writer and their garbage cost.
	agent1s = "agent@1s"
	agent1h = "agent@1h"
)

// workload runs once and returns ops per second.
type workload struct {
	name string
	run  func() (float64, error)
	ops  int // ops per run when fixed, for events per op; 0 when the run is timed
}

// run measures and prints the report.
func run(o options) (result, error) {
	if os.Geteuid() != 0 {
		return result{}, errors.New("needs root to load BPF programs")
	}
	// Held for the whole run: bpftrace's tracepoints and the tracer's fsync program need it,
	// and the tracer then finds it rather than mounting it for each run.
	release, err := ensureTracefs()
	if err != nil {
		return result{}, err
	}
	defer release()

	tools := map[string]*tool{nodectl: nodectlTool(""), nodectlSyscalls: nodectlTool(fsync.HooksSyscalls), empty: emptyTool()}
	if bt, err := bpftraceTool(); err != nil {
		fmt.Printf("bpftrace left out: %v\n", err)
	} else {
		tools[bpftrace] = bt
	}
	scratch, err := os.MkdirTemp("", "nodectl-bench-")
	if err != nil {
		return result{}, err
	}
	defer os.RemoveAll(scratch)
	if !o.agents {
		fmt.Println("nodectl agent left out: not asked for")
	} else if bin, err := proc.Nodectl(scratch); err != nil {
		fmt.Printf("nodectl agent left out: %v\n", err)
	} else {
		tools[agent1s], tools[agent1h] = agentTool(bin, time.Second), agentTool(bin, time.Hour)
	}
	res := result{ratio: map[string]map[string]float64{}, nsPerEvent: map[string]map[string]float64{}}

	perf, err := perfWorkload(o)
	if err != nil {
		fmt.Printf("%s left out: %v\n", perfBench, err)
	} else {
		fmt.Printf("== %s -l %d, %s, %d rounds\n", perfBench, perf.ops, perfPlacement(o.perfPin), o.perfRounds)
		m, err := compare(o.perfRounds, o.statsRounds, perf, tools, []string{nodectl, empty, agent1s, agent1h, bpftrace})
		if err != nil {
			return result{}, err
		}
		res.ratio[perfBench] = m.ratios()
		pipe := row{goal: goalPipe, rounds: m.roundRatios(nodectl), detail: fmt.Sprintf("bpftrace %s, empty programs %s",
			num(res.ratio[perfBench], bpftrace, "%.3f"), num(res.ratio[perfBench], empty, "%.3f"))}
		res.rows = append(res.rows, hookRow(goalSwitch, "sched_switch", m.perRun), hookRow(goalWakeup, "sched_wakeup", m.perRun),
			hookRow(goalWakeupNew, "sched_wakeup_new", m.perRun), pipe)
		res.opNs = 1e9 / median(m.rate[detached])
		res.nsPerEvent, res.bpfNsPerOp = m.printEvents(res.opNs)
		res.agent = m.agentCosts()
		printAgent(res)
	}

	ping := workload{name: pingPong, run: func() (float64, error) { return pingPongRun(o.pingDuration, o.cpu) }}
	fmt.Printf("\n== worst case: %s (both sides on CPU %d, a few µs per round trip), %d rounds of %s\n",
		pingPong, o.cpu, o.pingRounds, o.pingDuration)
	m, err := compare(o.pingRounds, 0, ping, tools, []string{empty, nodectl, bpftrace})
	if err != nil {
		return result{}, err
	}
	res.ratio[pingPong] = m.ratios()
	res.rows = append(res.rows, row{goal: goalPingPong, rounds: m.roundRatios(nodectl), detail: fmt.Sprintf("bpftrace %s, empty programs %s",
		num(res.ratio[pingPong], bpftrace, "%.3f"), num(res.ratio[pingPong], empty, "%.3f"))})

	if o.syscalls > 0 {
		sys := workload{name: syscalls, run: func() (float64, error) { return getppidRun(o.syscalls), nil }}
		fmt.Printf("\n== %s (%d a run), %d rounds\n", syscalls, o.syscalls, o.pingRounds)
		m, err := compare(o.pingRounds, 0, sys, tools, []string{nodectl, nodectlSyscalls, empty, bpftrace})
		if err != nil {
			return result{}, err
		}
		res.ratio[syscalls] = m.ratios()
		res.rows = append(res.rows, row{goal: goalSyscall, rounds: m.roundRatios(nodectl), detail: fmt.Sprintf("fsync at syscall tracepoints %s, bpftrace %s, empty programs %s",
			num(res.ratio[syscalls], nodectlSyscalls, "%.3f"), num(res.ratio[syscalls], bpftrace, "%.3f"), num(res.ratio[syscalls], empty, "%.3f"))})
	}

	if o.samplingCgroups > 0 {
		rotating, full, err := samplingCost(o.samplingCgroups, o.samplingRounds, o.samplingSpan)
		if err != nil {
			return result{}, fmt.Errorf("sampling %d cgroups: %w", o.samplingCgroups, err)
		}
		r := row{goal: goalSampling, detail: fmt.Sprintf("%d cgroups at one Sample a second: rotating %.2f%% of a core, full %.2f%%",
			o.samplingCgroups, 100*median(rotating), 100*median(full))}
		for i := range rotating {
			r.rounds = append(r.rounds, rotating[i]/full[i])
		}
		res.rows = append(res.rows, r)
	}

	fmt.Println()
	for _, p := range slices.Sorted(maps.Keys(tools[nodectl].status)) {
		fmt.Printf("nodectl program %-6s %s\n", p, tools[nodectl].status[p])
	}
	printSummary(res)
	printGoals(res.rows)
	return res, nil
}

func perfPlacement(pin bool) string {
	if pin {
		return "its two processes on different CPUs"
	}
	return "unpinned"
}

// printSummary puts the tools side by side, with empty programs on the same hooks as the floor.
func printSummary(res result) {
	const row = "%-44s %10s %10s %10s\n"
	fmt.Printf("\n== nodectl vs bpftrace (per-cgroup run-queue histogram) vs empty programs\n")
	fmt.Printf(row, "", nodectl, bpftrace, "empty")
	for _, w := range []string{perfBench, pingPong, syscalls} {
		if r, ok := res.ratio[w]; ok {
			fmt.Printf(row, "throughput ratio, "+w, num(r, nodectl, "%.3f"), num(r, bpftrace, "%.3f"), num(r, empty, "%.3f"))
		}
	}
	for _, h := range hooks {
		fmt.Printf(row, "ns per "+h+" event", num(res.nsPerEvent[nodectl], h, "%.0f"), num(res.nsPerEvent[bpftrace], h, "%.0f"), num(res.nsPerEvent[empty], h, "%.0f"))
	}
	if res.opNs > 0 {
		share := map[string]float64{}
		for t, ns := range res.bpfNsPerOp {
			share[t] = 100 * ns / res.opNs
		}
		fmt.Printf(row, "BPF ns per perf bench op", num(res.bpfNsPerOp, nodectl, "%.0f"), num(res.bpfNsPerOp, bpftrace, "%.0f"), num(res.bpfNsPerOp, empty, "%.0f"))
		fmt.Printf(row, fmt.Sprintf("  %% of a detached op (%.1f µs)", res.opNs/1e3), num(share, nodectl, "%.1f%%"), num(share, bpftrace, "%.1f%%"), num(share, empty, "%.1f%%"))
	}
	if r, ok := res.ratio[perfBench][agent1s]; ok {
		fmt.Printf(row, "throughput ratio, whole agent, "+perfBench, fmt.Sprintf("%.3f", r), num(res.ratio[perfBench], bpftrace, "%.3f"), "")
	}
}

func num(m map[string]float64, k, format string) string {
	v, ok := m[k]
	if !ok {
		return "-"
	}
	return fmt.Sprintf(format, v)
}

// measurements are the rates of each mode, by round, and the statistics gathered.
type measurements struct {
	modes     []string
	rate      map[string][]float64
	wall      map[string]time.Duration         // the workload's time in the timed runs, by mode
	toolCPU   map[string]time.Duration         // the tool's own process's CPU time in them
	events    map[string]map[string]*progStats // by tool, program
	ops       map[string]float64               // ops run with statistics on, by tool
	statsWall map[string]time.Duration         // the workload's time in those runs, by tool
	// perRun is the mean ns per event of each run with statistics on, by tool and hook: the
	// spread the gate allows for.
	perRun map[string]map[string][]float64
}

// compare runs w detached and under each tool alternately for rounds, printing each round;
// in the first statsRounds it also runs each tool with BPF statistics on.
func compare(rounds, statsRounds int, w workload, tools map[string]*tool, names []string) (*measurements, error) {
	m := &measurements{modes: []string{detached}, rate: map[string][]float64{}, wall: map[string]time.Duration{},
		toolCPU: map[string]time.Duration{}, events: map[string]map[string]*progStats{}, ops: map[string]float64{},
		statsWall: map[string]time.Duration{}, perRun: map[string]map[string][]float64{}}
	for _, n := range names {
		if tools[n] != nil {
			m.modes = append(m.modes, n)
		}
	}
	type step struct {
		mode  string
		stats bool
	}
	fmt.Printf("%-6s", "round")
	for _, mode := range m.modes {
		fmt.Printf(" %16s", mode)
	}
	fmt.Println("   (ops/s)")
	for r := range rounds {
		// Rotate the order so that no mode always runs first or last.
		var order []step
		for i := range m.modes {
			order = append(order, step{mode: m.modes[(i+r)%len(m.modes)]})
		}
		if r < statsRounds {
			for _, mode := range m.modes[1:] {
				order = append(order, step{mode: mode, stats: true})
			}
		}
		got := map[string]float64{}
		for _, s := range order {
			var t *tool
			if s.mode != detached {
				t = tools[s.mode]
			}
			var acc map[string]*progStats
			if s.stats {
				if m.events[s.mode] == nil {
					m.events[s.mode] = map[string]*progStats{}
				}
				acc = m.events[s.mode]
			}
			v, err := measure(t, w, acc)
			if err != nil {
				return nil, fmt.Errorf("%s, round %d, %s: %w", w.name, r+1, s.mode, err)
			}
			if s.stats {
				m.ops[s.mode] += float64(w.ops)
				m.statsWall[s.mode] += v.wall
				if m.perRun[s.mode] == nil {
					m.perRun[s.mode] = map[string][]float64{}
				}
				for name, p := range v.progs {
					if h := hookOf(name); h != "" && p.count > 0 {
						m.perRun[s.mode][h] = append(m.perRun[s.mode][h], float64(p.runtime.Nanoseconds())/float64(p.count))
					}
				}
				continue
			}
			got[s.mode] = v.rate
			m.rate[s.mode] = append(m.rate[s.mode], v.rate)
			m.wall[s.mode] += v.wall
			m.toolCPU[s.mode] += v.toolCPU
		}
		fmt.Printf("%-6d", r+1)
		for _, mode := range m.modes {
			fmt.Printf(" %16.0f", got[mode])
		}
		fmt.Println()
	}
	fmt.Printf("%-6s", "median")
	for _, mode := range m.modes {
		fmt.Printf(" %16.0f", median(m.rate[mode]))
	}
	fmt.Println()
	for _, mode := range m.modes[1:] {
		rs := m.roundRatios(mode)
		fmt.Printf("ratio %s/detached: median %.3f, per round %s\n", mode, median(rs), fmtAll(rs))
	}
	return m, nil
}

func (m *measurements) roundRatios(mode string) []float64 {
	var out []float64
	for i, d := range m.rate[detached] {
		out = append(out, m.rate[mode][i]/d)
	}
	return out
}

func (m *measurements) ratios() map[string]float64 {
	out := map[string]float64{}
	for _, mode := range m.modes[1:] {
		out[mode] = median(m.roundRatios(mode))
	}
	return out
}

// printEvents prints each tool's programs' mean cost per event and per op, given what a
// detached op takes, and returns the cost per event by tool and hook and the cost per op of
// all programs by tool.
func (m *measurements) printEvents(opNs float64) (map[string]map[string]float64, map[string]float64) {
	perEvent, perOp := map[string]map[string]float64{}, map[string]float64{}
	const row = "%-9s %-22s %-17s %9s %9s %10s %8s\n"
	fmt.Printf("\ncost per event (kernel.bpf_stats_enabled, in runs of their own)\n")
	fmt.Printf(row, "tool", "program", "hook", "ns/event", "events", "events/op", "ns/op")
	for _, t := range slices.Sorted(maps.Keys(m.events)) {
		perEvent[t] = map[string]float64{}
		progs := m.events[t]
		for _, name := range slices.Sorted(maps.Keys(progs)) {
			s := progs[name]
			if s.count == 0 {
				fmt.Printf(row, t, name, hookOf(name), "-", "0", "0", "-")
				continue
			}
			ns := float64(s.runtime.Nanoseconds())
			perOp[t] += ns / m.ops[t]
			if h := hookOf(name); h != "" {
				perEvent[t][h] = ns / float64(s.count)
			}
			fmt.Printf(row, t, name, hookOf(name), f0(ns/float64(s.count)), strconv.FormatUint(s.count, 10),
				fmt.Sprintf("%.2f", float64(s.count)/m.ops[t]), f0(ns/m.ops[t]))
		}
		fmt.Printf(row, t, "all programs", "", "", "", "", f0(perOp[t]))
	}
	fmt.Printf("a detached op takes %.1f µs\n", opNs/1e3)
	return perEvent, perOp
}

// agentCost is what the whole agent costs a workload besides its programs' time per event.
type agentCost struct {
	cpu float64 // the agent process's own CPU time per second of the workload (a share of one core)
	bpf float64 // its programs' run time per second, spent in the workload's tasks; 0 unmeasured
}

// agentCosts are the agent modes' costs from the timed runs (CPU) and the runs with
// statistics on (programs).
func (m *measurements) agentCosts() map[string]agentCost {
	out := map[string]agentCost{}
	for _, mode := range []string{agent1s, agent1h} {
		if m.wall[mode] == 0 {
			continue
		}
		c := agentCost{cpu: m.toolCPU[mode].Seconds() / m.wall[mode].Seconds()}
		if w := m.statsWall[mode]; w > 0 {
			var ns time.Duration
			for _, s := range m.events[mode] {
				ns += s.runtime
			}
			c.bpf = ns.Seconds() / w.Seconds()
		}
		out[mode] = c
	}
	return out
}

// printAgent puts the whole agent's figures side by side: throughput, its own CPU time and
// its programs' time, each per second of the workload.
func printAgent(res result) {
	if len(res.agent) == 0 {
		return
	}
	const row = "%-44s %12s %12s\n"
	fmt.Printf("\n== the whole agent under %s (%s: nodectl agent --interval 1s, its own process; %s: --interval 1h, tracing and serving only)\n",
		perfBench, agent1s, agent1h)
	fmt.Printf(row, "", agent1s, agent1h)
	cost := func(f func(agentCost) float64) map[string]float64 {
		out := map[string]float64{}
		for mode, c := range res.agent {
			out[mode] = 1e3 * f(c)
		}
		return out
	}
	cpu, bpf := cost(func(c agentCost) float64 { return c.cpu }), cost(func(c agentCost) float64 { return c.bpf })
	fmt.Printf(row, "throughput ratio to detached (median)", num(res.ratio[perfBench], agent1s, "%.3f"), num(res.ratio[perfBench], agent1h, "%.3f"))
	fmt.Printf(row, "agent process CPU, ms per s of load", num(cpu, agent1s, "%.2f"), num(cpu, agent1h, "%.2f"))
	fmt.Printf(row, "its BPF programs, ms per s of load", num(bpf, agent1s, "%.2f"), num(bpf, agent1h, "%.2f"))
	fmt.Println("(1 ms per s is 0.1% of one core; the programs run in the workload's tasks, the agent's CPU beside them)")
}

func f0(v float64) string { return strconv.FormatFloat(v, 'f', 0, 64) }

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(v))
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

func fmtAll(v []float64) string {
	var parts []string
	for _, x := range v {
		parts = append(parts, strconv.FormatFloat(x, 'f', 3, 64))
	}
	return strings.Join(parts, " ")
}
