//go:build linux

package main

import (
	"fmt"
	"os"
	"runtime"
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
// the command's report and reports the ratio and the per-event costs as metrics. It asserts
// nothing: timings are for people to read.
func BenchmarkOverhead(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root to load BPF programs")
	}
	res, err := run(10, time.Second, runtime.NumCPU()-1)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(res.ratio, "attached/detached")
	for _, p := range []string{"runq_switch", "runq_wakeup"} {
		b.ReportMetric(res.nsPerEvent[p], "ns/"+p)
	}
}
