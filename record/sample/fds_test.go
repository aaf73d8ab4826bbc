//go:build linux

package sample

import (
	"testing"
	"time"

	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/rundir"
)

// The sampler keeps each cgroup's files open: a cgroup removed and made again under the same
// path is read anew, and the files of a cgroup no longer listed are closed.
func TestCgroupFilesReopened(t *testing.T) {
	l, parent := testParent(t, "test")
	a, b := parent+"/a", parent+"/b"
	for _, p := range []string{a, b} {
		if err := l.Create(p, cgroup.Limits{MemoryBytes: 64 << 20}); err != nil {
			t.Fatal(err)
		}
	}
	listed := []string{a, b}
	s := NewCgroups(l, func() []string { return listed })
	if _, err := s.Sample(time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := l.Remove(a); err != nil {
		t.Fatal(err)
	}
	if err := l.Create(a, cgroup.Limits{MemoryBytes: 32 << 20}); err != nil {
		t.Fatal(err)
	}
	recs, err := s.Sample(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	value(t, recs, a, rundir.MetricCPUUsage)
	value(t, recs, b, rundir.MetricCPUUsage)
	listed = []string{b}
	if _, err := s.Sample(time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, open := s.open.by[a]; open || len(s.open.by) != 1 {
		t.Fatalf("files of %d cgroups open, want only b's", len(s.open.by))
	}
}

// Past its descriptor budget the sampler opens, reads and closes each file every time.
func TestCgroupFilesBudget(t *testing.T) {
	l, parent := testParent(t, "test")
	path := parent + "/a"
	if err := l.Create(path, cgroup.Limits{MemoryBytes: 64 << 20}); err != nil {
		t.Fatal(err)
	}
	s := NewCgroups(l, func() []string { return []string{path} })
	s.open.budget = 2
	for range 2 {
		recs, err := s.Sample(time.Now())
		if err != nil {
			t.Fatal(err)
		}
		value(t, recs, path, rundir.MetricMemoryUsage)
		value(t, recs, path, rundir.MetricCPUUsage)
		if s.open.held != 2 {
			t.Fatalf("%d descriptors held, want the budget of 2", s.open.held)
		}
	}
}
