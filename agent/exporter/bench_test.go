package exporter

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkObserve1000Cgroups is one interval of a node of 1,000 cgroups: every sampler
// reading and the tracer's changed series, about 19 records a cgroup.
func BenchmarkObserve1000Cgroups(b *testing.B) {
	const cgroups = 1000
	e := New(Config{})
	e.Observe(nodeOf(cgroups, 1))
	batch := nodeOf(cgroups, 2)
	for b.Loop() {
		e.Observe(batch)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(batch)), "ns/record")
}

// BenchmarkScrape1000Cgroups is a scrape of that node; copy-ns is the part under the lock,
// the longest an Observe can wait for a scrape.
func BenchmarkScrape1000Cgroups(b *testing.B) {
	e := New(Config{})
	e.Observe(nodeOf(1000, 1))
	ch := make(chan prometheus.Metric, 1024)
	go func() {
		for range ch {
		}
	}()
	var copying time.Duration
	for b.Loop() {
		start := time.Now()
		e.snapshot(0, nil)
		copying += time.Since(start)
		e.Collect(ch)
	}
	close(ch)
	b.ReportMetric(float64(copying.Nanoseconds())/float64(b.N), "copy-ns")
}
