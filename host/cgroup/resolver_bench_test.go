package cgroup

import (
	"fmt"
	"testing"
)

// BenchmarkResolverMiss resolves the id of a cgroup the resolver has not seen, among 1,000
// others: by file handle (open_by_handle_at, which needs CAP_DAC_READ_SEARCH), and by walking
// the hierarchy (without it; under churn a miss walks at most every rewalkEvery, two walks a
// second). Run as root: go test -run x -bench ResolverMiss ./host/cgroup.
func BenchmarkResolverMiss(b *testing.B) {
	l, parent := testLayout(b)
	const others = 1000
	for i := range others {
		if err := l.Create(fmt.Sprintf("%s/c%04d", parent, i), Limits{}); err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() {
		for i := range others {
			l.Remove(fmt.Sprintf("%s/c%04d", parent, i))
		}
	})
	path := parent + "/new"
	if err := l.Create(path, Limits{}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Remove(path) })
	id, err := l.ID("cpu", path)
	if err != nil {
		b.Fatal(err)
	}
	for _, handles := range []bool{true, false} {
		name := "handle"
		if !handles {
			name = "walk"
		}
		b.Run(name, func(b *testing.B) {
			r := NewResolver(l)
			r.handles = handles
			for b.Loop() {
				r.trees = map[string]*tree{} // nothing seen: a miss
				if got, ok := r.Path("cpu", id); !ok || got != path {
					b.Fatalf("Path = %q, %v; want %s", got, ok, path)
				}
			}
		})
	}
}
