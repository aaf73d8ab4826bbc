package session

import (
	"slices"
	"testing"

	"github.com/nodectl/nodectl/rundir"
)

// The follower keeps at most max cgroups, counts those that found no room, and forgets the
// removed ones at its next look, making room for new ones.
func TestFollowerBoundsAndForgets(t *testing.T) {
	live := map[string]bool{"/a": true, "/b": true, "/c": true}
	f := &follower{max: 2, seen: map[string]bool{}, exists: func(p string) bool { return live[p] }}
	batch := func(cgs ...string) []rundir.Record {
		var out []rundir.Record
		for _, c := range cgs {
			out = append(out, rundir.Record{Type: rundir.TypeSample, Cgroup: c})
		}
		return out
	}
	f.observe(batch("/a", "/b", "/c", "<idle>", ""))
	if tracked, overflow := f.counts(); tracked != 2 || overflow != 1 {
		t.Fatalf("tracked %d, overflow %d; want 2 and 1", tracked, overflow)
	}
	delete(live, "/a")
	for range pruneEvery {
		f.observe(batch("/c"))
	}
	if got := f.paths(); !slices.Equal(got, []string{"/b", "/c"}) {
		t.Errorf("following %v after /a went, want /b and /c", got)
	}
	if _, overflow := f.counts(); overflow != 0 {
		t.Errorf("overflow %d once there is room", overflow)
	}
}
