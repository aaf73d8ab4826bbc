//go:build linux

package agent

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"syscall"
	"testing"
	"time"

	"github.com/nodectl/nodectl/agent/flightrec"
	"github.com/nodectl/nodectl/agent/recorded"
	"github.com/nodectl/nodectl/bench/internal/proc"
)

// BenchmarkIncidentAnalysis writes an incident's default windows (the baseline, then a minute
// before and after the trigger) of 1,000 cgroups into a flight recorder and analyzes them as
// the agent does, in this process under the agent's memory limit: the CPU time and the memory
// an incident costs the agent, which BenchmarkAgent1000Cgroups counts in its figures whenever
// one opens. It runs once whatever b.N (use -benchtime 1x).
func BenchmarkIncidentAnalysis(b *testing.B) {
	dir := b.TempDir()
	d := recorded.DefaultWindows
	to := time.Now().UTC().Truncate(time.Second)
	// The incident is a contended cgroup's (gen_test.go), as the agent's detector would open it.
	w := recorded.Window{BaselineFrom: to.Add(-d.After - d.Before - d.Baseline), From: to.Add(-d.After - d.Before), To: to,
		Cgroup: newNode(liveCgroups, windowSeed).contended[0]}
	st, err := writeWindow(dir, w)
	if err != nil {
		b.Fatal(err)
	}
	rd, err := flightrec.OpenReader(dir)
	if err != nil {
		b.Fatal(err)
	}
	meta, err := recorded.ReadMeta(dir)
	if err != nil {
		b.Fatal(err)
	}

	runtime.GC()
	debug.FreeOSMemory()
	// As in the agent: its default --memory-limit.
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(agentMemoryLimit))
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		b.Fatal(err)
	}
	rss0, _, err := proc.Memory(os.Getpid())
	if err != nil {
		b.Fatal(err)
	}
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	cpu0 := cpuTime(b)
	start := time.Now()
	w, err = w.Incident(rd, meta, st.Series)
	if err != nil {
		b.Fatal(err)
	}
	rep, err := recorded.AnalyzeWindow(rd, meta, w)
	elapsed := time.Since(start)
	cpu := cpuTime(b) - cpu0
	runtime.ReadMemStats(&ms1)
	if err != nil {
		b.Fatal(err)
	}
	_, peak, err := proc.Memory(os.Getpid())
	if err != nil {
		b.Fatal(err)
	}
	n := len(rep.Findings)

	const mib = 1 << 20
	fmt.Printf("\n== an incident's analysis in the agent: %s baseline, %s window, %d cgroups at 1 s (%d series), read at %d ticks a phase, %d cgroups in focus\n",
		d.Baseline, d.Before+d.After, liveCgroups, st.Series, w.Ticks, len(w.Cgroups))
	row := "%-52s %s\n"
	fmt.Printf(row, "CPU time (user+sys), wall", fmt.Sprintf("%.2f s, %.2f s", cpu.Seconds(), elapsed.Seconds()))
	fmt.Printf(row, "RSS above the process's before it (VmHWM)", fmt.Sprintf("%.1f MiB", float64(peak-rss0)/mib))
	fmt.Printf(row, "allocated, GC cycles", fmt.Sprintf("%.1f MiB, %d", float64(ms1.TotalAlloc-ms0.TotalAlloc)/mib, ms1.NumGC-ms0.NumGC))
	fmt.Printf(row, "findings", fmt.Sprint(n))
	b.ReportMetric(cpu.Seconds(), "cpu-s")
	b.ReportMetric(float64(peak-rss0)/mib, "rss-MiB")
	b.ReportMetric(float64(ms1.TotalAlloc-ms0.TotalAlloc)/mib, "alloc-MiB")
	b.ReportMetric(0, "ns/op")
}

// agentMemoryLimit is the agent's default --memory-limit.
const agentMemoryLimit = 40 << 20

// cpuTime is this process's CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
