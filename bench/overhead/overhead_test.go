//go:build linux

package main

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"testing"
	"time"
)

// TestMain lets the test binary be a side of the ping-pong, as the command is.
func TestMain(m *testing.M) {
	if role := os.Getenv(roleEnv); role != "" {
		if err := bounce(role); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// BenchmarkOverhead runs the whole comparison once, whatever b.N (use -benchtime 1x), prints
// the command's report and reports the ratios and the sched_switch costs as metrics. It
// asserts nothing: timings are for people to read.
func BenchmarkOverhead(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root to load BPF programs")
	}
	res, err := run(defaults)
	if err != nil {
		b.Fatal(err)
	}
	for w, unit := range map[string]string{perfBench: "perf", pingPong: "pingpong", syscalls: "getppid"} {
		for tool, r := range res.ratio[w] {
			b.ReportMetric(r, unit+"-ratio-"+metricName(tool))
		}
	}
	for tool, ns := range res.nsPerEvent {
		if v, ok := ns["sched_switch"]; ok {
			b.ReportMetric(v, "ns/sched_switch-"+metricName(tool))
		}
	}
	for mode, c := range res.agent {
		b.ReportMetric(1e3*c.cpu, metricName(mode)+"-cpu-ms/s")
		b.ReportMetric(1e3*c.bpf, metricName(mode)+"-bpf-ms/s")
	}
}

func metricName(tool string) string {
	switch tool {
	case empty:
		return "empty"
	case agent1s:
		return "agent-1s"
	case agent1h:
		return "agent-1h"
	case nodectlSyscalls:
		return "nodectl-syscalls"
	}
	return tool
}

// TestGoalsHold is the CI-sized comparison: three rounds of each workload under every tool,
// the statistics runs for the per-event rows, and the sampler at 1,000 cgroups. A row fails
// only when every one of its rounds is past its guard (goals.go): a regression that the run's
// own spread does not explain. Nothing is compared with an absolute time, only ratios within
// the run.
func TestGoalsHold(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to load BPF programs")
	}
	for _, bin := range []string{"bpftrace", "perf"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("no %s on PATH: the comparison needs it (make deps installs it)", bin)
		}
	}
	o := options{perfRounds: 3, statsRounds: 3, perfDuration: time.Second, perfPin: true, pingRounds: 3,
		pingDuration: time.Second, cpu: runtime.NumCPU() - 1, syscalls: 2_000_000, samplingCgroups: 1000, samplingRounds: 3, samplingSpan: time.Second}
	res, err := run(o)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []goal{goalSwitch, goalWakeup, goalWakeupNew, goalPipe, goalPingPong, goalSyscall, goalSampling} {
		i := slices.IndexFunc(res.rows, func(r row) bool { return r.row == g.row })
		switch {
		case i < 0 || len(res.rows[i].rounds) == 0:
			t.Errorf("%s: not measured", g.row)
		case res.rows[i].regressed():
			t.Errorf("%s: %.3f, every round (%s) past the guard %s (goal %s): %s", g.row, res.rows[i].value(),
				fmtAll(res.rows[i].rounds), limitText(g, g.guard), limitText(g, g.goal), res.rows[i].detail)
		}
	}
}
