//go:build linux

package main

import (
	"fmt"
	"os"
	"testing"
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
	for w, unit := range map[string]string{perfBench: "perf", pingPong: "pingpong"} {
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
	}
	return tool
}
