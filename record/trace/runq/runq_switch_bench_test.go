package runq

import (
	"runtime"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/nodectl/nodectl/record/trace/internal/cgtest"
)

// BenchmarkSwitch is what sched_switch's program costs a switch whose victim has a slot on
// its CPU, against one whose victim has none and goes to the maps all CPUs share (atomic adds):
// the kernel's run-time statistics of the program during a ping-pong of two threads on one CPU
// over blocking pipes, b.N hops a round, with one tracer attached at a time, the two ways in
// turn for switchRounds rounds each. It reports the medians, in ns a switch, and their ratio.
func BenchmarkSwitch(b *testing.B) {
	stats, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
	if err != nil {
		b.Skipf("no BPF run-time statistics: %v", err)
	}
	defer stats.Close()
	cpu := cgtest.LastCPU(b)
	var ns [2][]float64
	for range switchRounds {
		for i, cfg := range []Config{{ChangedOnly: true}, {ChangedOnly: true, noSlots: true}} {
			tr := newTracer(b, cfg)
			before := switchStats(b, tr)
			pingPong(b, cpu, b.N)
			after := switchStats(b, tr)
			if err := tr.Close(); err != nil {
				b.Fatal(err)
			}
			runs := after.RunCount - before.RunCount
			if runs == 0 {
				b.Fatal("sched_switch's program did not run")
			}
			ns[i] = append(ns[i], float64(after.Runtime-before.Runtime)/float64(runs))
		}
	}
	slot, shared := median(ns[0]), median(ns[1])
	b.ReportMetric(slot, "ns/switch-slot")
	b.ReportMetric(shared, "ns/switch-shared")
	b.ReportMetric(shared/slot, "shared/slot")
}

const switchRounds = 5

func median(v []float64) float64 {
	slices.Sort(v)
	return v[len(v)/2]
}

func switchStats(b *testing.B, tr *Tracer) *ebpf.ProgramStats {
	s, err := tr.objs.RunqSwitch.Stats()
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// pingPong bounces a byte n times between two threads pinned to cpu, over pipes read with
// blocking system calls: each hop is a wakeup and a switch. Both sides run on goroutines that
// end locked to their threads, so that the pinned threads end with them.
func pingPong(b *testing.B, cpu, n int) {
	var there, back [2]int
	for _, p := range []*[2]int{&there, &back} {
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			b.Fatal(err)
		}
		defer unix.Close(p[0])
		defer unix.Close(p[1])
	}
	// side reads from in and writes to out n times; the first side writes first.
	side := func(first bool, in, out int, done chan<- error) {
		runtime.LockOSThread()
		var set unix.CPUSet
		set.Set(cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			done <- err
			return
		}
		buf := []byte{1}
		for range n {
			if first {
				if _, err := unix.Write(out, buf); err != nil {
					done <- err
					return
				}
			}
			if _, err := unix.Read(in, buf); err != nil {
				done <- err
				return
			}
			if !first {
				if _, err := unix.Write(out, buf); err != nil {
					done <- err
					return
				}
			}
		}
		done <- nil
	}
	done := make(chan error, 2)
	go side(false, there[0], back[1], done)
	go side(true, back[0], there[1], done)
	for range 2 {
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
}
