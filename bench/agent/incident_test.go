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
	c := analyzeInAgent(b, dir, w)

	const mib = 1 << 20
	fmt.Printf("\n== an incident's analysis in the agent: %s baseline, %s window, %d cgroups at 1 s (%d series), read at %d ticks a phase, %d cgroups in focus\n",
		d.Baseline, d.Before+d.After, liveCgroups, st.Series, c.ticks, c.focus)
	c.print()
	b.ReportMetric(c.cpu.Seconds(), "cpu-s")
	b.ReportMetric(c.rssMiB(), "rss-MiB")
	b.ReportMetric(c.allocMiB(), "alloc-MiB")
	b.ReportMetric(0, "ns/op")
}

// agentCost is what an analysis cost the agent's process.
type agentCost struct {
	cpu, wall    time.Duration
	rss, alloc   uint64 // VmHWM above the process's RSS before it; bytes allocated
	gcs          uint32
	findings     int
	ticks, focus int // each phase's ticks read, the cgroups in focus (0: all)
}

func (c agentCost) rssMiB() float64   { return float64(c.rss) / (1 << 20) }
func (c agentCost) allocMiB() float64 { return float64(c.alloc) / (1 << 20) }

func (c agentCost) print() {
	row := "%-52s %s\n"
	fmt.Printf(row, "CPU time (user+sys), wall", fmt.Sprintf("%.2f s, %.2f s", c.cpu.Seconds(), c.wall.Seconds()))
	fmt.Printf(row, "RSS above the process's before it (VmHWM)", fmt.Sprintf("%.1f MiB", c.rssMiB()))
	fmt.Printf(row, "allocated, GC cycles", fmt.Sprintf("%.1f MiB, %d", c.allocMiB(), c.gcs))
	fmt.Printf(row, "findings", fmt.Sprint(c.findings))
}

// analyzeInAgent analyzes w of the flight recorder in dir as the agent does, in this process
// under the agent's memory limit: through the store opened on dir (its journal in memory, as
// the agent holds it, before the measure starts), read as Bounded says, then analyzed.
func analyzeInAgent(b *testing.B, dir string, w recorded.Window) agentCost {
	store, err := flightrec.Open(flightrec.Options{Dir: dir})
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
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
	w, err = w.Bounded(store, meta, store.Status().Series)
	if err != nil {
		b.Fatal(err)
	}
	rep, err := recorded.AnalyzeWindow(store, meta, w)
	c := agentCost{wall: time.Since(start), cpu: cpuTime(b) - cpu0, ticks: w.Ticks, focus: len(w.Cgroups)}
	runtime.ReadMemStats(&ms1)
	if err != nil {
		b.Fatal(err)
	}
	_, peak, err := proc.Memory(os.Getpid())
	if err != nil {
		b.Fatal(err)
	}
	c.rss, c.alloc, c.gcs, c.findings = peak-rss0, ms1.TotalAlloc-ms0.TotalAlloc, ms1.NumGC-ms0.NumGC, len(rep.Findings)
	return c
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
