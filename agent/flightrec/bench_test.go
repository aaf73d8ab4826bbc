//go:build unix

package flightrec

import (
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/nodectl/nodectl/rundir"
)

// BenchmarkStore1000Cgroups appends 65 minutes of 1,000 cgroups at 1 s (the generator of
// gen_test.go) and reads the last hour back: the numbers of docs/flight-recorder-format.md.
// Run it with go test -run x -bench Store ./agent/flightrec (about a minute).
func BenchmarkStore1000Cgroups(b *testing.B) {
	for range b.N {
		benchStore(b, 1000, 65*time.Minute)
	}
}

func benchStore(b *testing.B, cgroups int, span time.Duration) {
	dir := b.TempDir()
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	now := start
	s, err := Open(Options{Dir: dir, Now: func() time.Time { return now }})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	g := newGen(cgroups, 1)
	base := heapInuse() // the generator's
	ticks := int(span / time.Second)
	var appendCPU time.Duration
	var records, journalPeak, journalSamples, heap int64
	for i := range ticks {
		if i == 2*int(DefaultSegmentSpan/time.Second) {
			heap = heapInuse() - base // the most it holds: a whole open segment, before its seal
		}
		// The agent's ticks come about a second apart, a little late each time.
		now = start.Add(time.Duration(i)*time.Second + time.Duration(g.rng.IntN(3e6)))
		recs := g.tick()
		records += int64(len(recs))
		c0 := cpuTime()
		if err := s.Append(now, recs); err != nil {
			b.Fatal(err)
		}
		appendCPU += cpuTime() - c0
		if st := s.Status(); st.JournalBytes > journalPeak {
			journalPeak = st.JournalBytes
			journalSamples = s.open.samples
		}
	}
	st := s.Status()
	logical := int64(ticks) * int64(cgroups) * seriesPerCgroup
	if st.StoredSamples != logical {
		b.Fatalf("stored %d logical samples, want %d", st.StoredSamples, logical)
	}

	b.ReportMetric(float64(st.Bytes)/float64(st.StoredSamples), "bytes/sample")
	b.ReportMetric(float64(st.Bytes-st.JournalBytes)/float64(st.StoredSamples-s.open.samples), "segment-bytes/sample")
	b.ReportMetric(float64(journalPeak)/float64(journalSamples), "journal-bytes/sample")
	b.ReportMetric(float64(st.Bytes)/1e6/span.Hours(), "MB/hour")
	b.ReportMetric(float64(appendCPU.Microseconds())/1e3/(float64(logical)/1e3), "append-cpu-ms/1k-samples")
	b.ReportMetric(float64(appendCPU.Microseconds())/1e3/(float64(records)/1e3), "append-cpu-ms/1k-records")
	b.ReportMetric(float64(heap)/1e6, "writer-heap-MB")

	for _, step := range []time.Duration{0, 10 * time.Second} {
		var n int
		t0, c0 := time.Now(), cpuTime()
		err := s.Read(now.Add(-time.Hour), now, step, func(rundir.Record) error { n++; return nil })
		if err != nil {
			b.Fatal(err)
		}
		unit := "read-1h"
		if step > 0 {
			unit = "read-1h-step10s"
		}
		b.ReportMetric(time.Since(t0).Seconds(), unit+"-s")
		b.ReportMetric((cpuTime() - c0).Seconds(), unit+"-cpu-s")
		b.Logf("step %v: %d records", step, n)
	}
	b.ReportMetric(0, "ns/op")
}

// cpuTime is the CPU time the process used so far, all threads (the collector's too).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func heapInuse() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}
