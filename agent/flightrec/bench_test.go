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

var benchStart = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func benchStore(b *testing.B, cgroups int, span time.Duration) {
	dir := b.TempDir()
	now := benchStart
	s, err := Open(Options{Dir: dir, Now: func() time.Time { return now }})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	g := newGen(cgroups, 1)
	m := newHeapMeter()
	ticks := int(span / time.Second)
	var appendCPU time.Duration
	var records, journalPeak, journalSamples int64
	for i := range ticks {
		now = tickTime(g, i)
		recs := g.tick()
		records += int64(len(recs))
		cpu, err := m.append(s, now, recs)
		if err != nil {
			b.Fatal(err)
		}
		appendCPU += cpu
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
	m.report(b)

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

// tickTime is when tick i comes: about a second after the last, a little late each time, as
// the agent's do.
func tickTime(g *gen, i int) time.Time {
	return benchStart.Add(time.Duration(i)*time.Second + time.Duration(g.rng.IntN(3e6)))
}

// BenchmarkWriterHeap is the writer's heap at 1,000 cgroups, over two segments and their seals.
// Run it with go test -run x -bench WriterHeap ./agent/flightrec.
func BenchmarkWriterHeap(b *testing.B) {
	for range b.N {
		writerHeap(b, 1000).report(b)
		b.ReportMetric(0, "ns/op")
	}
}

func writerHeap(b *testing.B, cgroups int) *heapMeter {
	now := benchStart
	s, err := Open(Options{Dir: b.TempDir(), Now: func() time.Time { return now }})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	g := newGen(cgroups, 1)
	m := newHeapMeter()
	for i := range 2*int(DefaultSegmentSpan/time.Second) + 1 {
		now = tickTime(g, i)
		if _, err := m.append(s, now, g.tick()); err != nil {
			b.Fatal(err)
		}
	}
	return m
}

// BenchmarkChurn is the writer's heap as 10,000 pods come and go over two segments, each
// living 30 s, and for two segments after, which still hold every one of their series
// (SeriesIdle is an hour). Its peak must stay within twice BenchmarkWriterHeap's. Run it with
// go test -run x -bench Churn ./agent/flightrec.
func BenchmarkChurn(b *testing.B) {
	const cgroups, life = 10000, 30 // pods, and seconds each lives
	over := 2 * int(DefaultSegmentSpan/time.Second)
	for range b.N {
		steady := writerHeap(b, 1000)
		now := benchStart
		s, err := Open(Options{Dir: b.TempDir(), Now: func() time.Time { return now }})
		if err != nil {
			b.Fatal(err)
		}
		// Pods are made as they come, as many as live at a time made first: the generator's
		// heap is about the same throughout.
		g := newGen(life*cgroups/over+2, 2)
		g.live(0, 0)
		m := newHeapMeter()
		for i := range over + 2*int(DefaultSegmentSpan/time.Second) + 1 {
			lo, hi := min(cgroups, max(0, (i-life)*cgroups/over)), min(cgroups, (i+1)*cgroups/over)
			g.live(lo, hi)
			now = tickTime(g, i)
			if _, err := m.append(s, now, g.tick()); err != nil {
				b.Fatal(err)
			}
		}
		st := s.Status()
		s.Close()
		m.report(b)
		b.ReportMetric(float64(st.Series), "series")
		b.ReportMetric(steady.peak/1e6, "MB-heap-peak-steady")
		if m.peak > 2*steady.peak {
			b.Errorf("heap peak under churn %.1f MB, more than twice the steady one, %.1f MB", m.peak/1e6, steady.peak/1e6)
		}
		b.ReportMetric(0, "ns/op")
	}
}

// heapMeter follows the writer's heap around its seals, where it peaks: the live heap before a
// seal (the open segment at its largest) plus all that the sealing Append allocates bounds the
// peak from above, whatever the collector's timing.
type heapMeter struct {
	base       int64   // the generator's
	peak, live float64 // bytes: the bound at the worst seal, the live heap just after it
	last       time.Time
}

// newHeapMeter measures the heap that is not the writer's: made once the generator is.
func newHeapMeter() *heapMeter {
	return &heapMeter{base: heapInuse()}
}

// append appends a tick, measuring the heap when it seals, and returns the CPU time the
// Append took (not the measuring).
func (m *heapMeter) append(s *Store, t time.Time, recs []rundir.Record) (time.Duration, error) {
	span := int64(DefaultSegmentSpan)
	seal := !m.last.IsZero() && t.UnixNano()/span != m.last.UnixNano()/span
	m.last = t
	var before int64
	var ms runtime.MemStats
	if seal {
		before = heapInuse() - m.base
		runtime.ReadMemStats(&ms)
	}
	alloc, c0 := ms.TotalAlloc, cpuTime()
	err := s.Append(t, recs)
	cpu := cpuTime() - c0
	if seal {
		runtime.ReadMemStats(&ms)
		m.peak = max(m.peak, float64(before)+float64(ms.TotalAlloc-alloc))
		m.live = float64(heapInuse() - m.base)
	}
	return cpu, err
}

func (m *heapMeter) report(b *testing.B) {
	b.ReportMetric(m.peak/1e6, "MB-heap-peak")
	b.ReportMetric(m.live/1e6, "MB-heap-sealed")
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
