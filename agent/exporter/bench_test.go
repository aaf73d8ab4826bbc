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

// BenchmarkScrape500Pods is a scrape of a node of 500 pods, 10 of them busy (TestSeriesBudget's
// node): series is what it holds, and it fails past the default series budget, the gate of
// make bench on issue 33's row "series per node at 500 pods".
func BenchmarkScrape500Pods(b *testing.B) {
	e := New(Config{MaxSeries: 2000})
	d := &denseNode{n: 500, busy: 10}
	var series float64
	for b.Loop() {
		b.StopTimer()
		e.Observe(d.tick())
		b.StartTimer()
		var ok bool
		if series, ok = scrapeSeries(e); !ok {
			b.Fatal("no nodectl_exporter_series in the scrape")
		}
	}
	b.ReportMetric(series, "series")
	// The same node with no budget, for the ratio.
	all := New(Config{MaxSeries: 2000, SeriesBudget: 1 << 30})
	all.Observe((&denseNode{n: 500, busy: 10}).tick())
	if got, ok := scrapeSeries(all); ok {
		b.ReportMetric(got, "series-unbudgeted")
	}
	if series > DefaultSeriesBudget {
		b.Fatalf("%v series at 500 pods, budget %d", series, DefaultSeriesBudget)
	}
}

// scrapeSeries gathers e and returns its nodectl_exporter_series.
func scrapeSeries(e *Exporter) (float64, bool) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(e)
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "nodectl_exporter_series" {
			return mf.Metric[0].GetGauge().GetValue(), true
		}
	}
	return 0, false
}
