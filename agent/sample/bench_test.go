//go:build linux

package sample

import (
	"fmt"
	"testing"
	"time"

	"github.com/nodectl/nodectl/agent/cgroup"
)

// BenchmarkCgroupSampling measures one collection of n real cgroups with CPU and memory limits
// (under /nodectl/bench-*, removed after) and reports its cost per cgroup and the share of one
// core it takes at a 1 s interval (the target at 1,000 cgroups: under 1%).
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
			s := NewCgroups(l, func() []string { return paths })
			var recs int
			for b.Loop() {
				out, err := s.Sample(time.Now())
				if err != nil {
					b.Fatal(err)
				}
				recs = len(out)
			}
			perCollection := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			b.ReportMetric(perCollection/float64(n), "ns/cgroup")
			b.ReportMetric(float64(recs)/float64(n), "records/cgroup")
			b.ReportMetric(100*perCollection/1e9, "%core@1s")
		})
	}
}
