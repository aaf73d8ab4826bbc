//go:build linux

package sample

import (
	"fmt"
	"testing"
	"time"

	"github.com/nodectl/nodectl/host/cgroup"
)

// BenchmarkCgroupSampling measures one collection of n real cgroups with CPU and memory limits
// (under /nodectl/bench-*, removed after), reading every file (full: SampleFull, the window
// edges), as the interval ticks do without the tracer (rotating: Sample, the slow tier of
// slowBudget cgroups), and as they do in the agent (active: the fast tier only of the cgroups
// the tracer saw run, here a fifth of them, a different fifth at each tick). It reports the
// cost per cgroup and the share of one core each takes at a 1 s interval, and logs the ratios.
func BenchmarkCgroupSampling(b *testing.B) {
	for _, n := range []int{100, 1000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			l, parent := testParent(b, "bench")
			paths := make([]string, n)
			for i := range paths {
				paths[i] = fmt.Sprintf("%s/c%04d", parent, i)
				if err := l.Create(paths[i], cgroup.Limits{CPUMilli: 500, MemoryBytes: 256 << 20}); err != nil {
					b.Fatal(err)
				}
			}
			index := map[string]int{}
			for i, p := range paths {
				index[p] = i
			}
			cost := map[string]float64{}
			for _, mode := range []string{"full", "rotating", "active"} {
				b.Run(mode, func(b *testing.B) {
					s := NewCgroups(l, func() []string { return paths })
					tick := 0
					if mode == "active" {
						s.Active(func(p string) bool { return index[p]%5 == tick%5 })
					}
					sample := s.Sample
					if mode == "full" {
						sample = s.SampleFull
					}
					var recs int
					for b.Loop() {
						tick++
						out, err := sample(time.Now())
						if err != nil {
							b.Fatal(err)
						}
						recs += len(out)
					}
					perCollection := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
					cost[mode] = perCollection
					b.ReportMetric(perCollection/float64(n), "ns/cgroup")
					b.ReportMetric(float64(recs)/float64(b.N*n), "records/cgroup")
					b.ReportMetric(100*perCollection/1e9, "%core@1s")
				})
			}
			if cost["rotating"] > 0 && cost["active"] > 0 {
				b.Logf("%d cgroups: full %.2f%%core@1s, rotating %.2f%%core@1s (slow tier of %d a collection): x%.2f; active (a fifth ran) %.2f%%core@1s: x%.2f",
					n, 100*cost["full"]/1e9, 100*cost["rotating"]/1e9, min(n, slowBudget), cost["full"]/cost["rotating"],
					100*cost["active"]/1e9, cost["full"]/cost["active"])
			}
		})
	}
}
