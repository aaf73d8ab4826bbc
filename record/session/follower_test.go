package session

import (
	"slices"
	"testing"
	"time"

	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
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

// A cgroup is busy when its tasks waited a millisecond a second for a CPU, or got one ten times
// a second, since the last collection; a sleeping sandbox's one wake-up and a few microseconds
// of wait are not.
func TestBusyWaits(t *testing.T) {
	was := hist.Log2{Count: 100, SumNs: 5e6}
	for _, c := range []struct {
		name         string
		count, sumNs uint64
		span         time.Duration
		want         bool
	}{
		{"a sleeper's wake-up", 101, 5e6 + 20e3, time.Second, false},
		{"starved: 2 waits, 300 ms", 102, 5e6 + 300e6, time.Second, true},
		{"a millisecond a second, over 2 s", 101, 5e6 + 2e6, 2 * time.Second, true},
		{"under it, over 2 s", 101, 5e6 + 1.9e6, 2 * time.Second, false},
		{"ten wake-ups a second", 110, 5e6 + 50e3, time.Second, true},
		{"nine", 109, 5e6 + 50e3, time.Second, false},
		{"counts of a cgroup forgotten since", 3, 1e6, time.Second, false},
	} {
		if got := busyWaits(was, hist.Log2{Count: c.count, SumNs: c.sumNs}, c.span); got != c.want {
			t.Errorf("%s: busy %v, want %v", c.name, got, c.want)
		}
	}
}

// A cgroup's waits are judged over the span since they last changed: a sleeper that waits
// 2 ms at a wake-up every 5 s is not busy, the same 2 ms a second later is.
func TestLastWaitsSpan(t *testing.T) {
	start := time.Now()
	waits := lastWaits{}
	at := func(s int, count, sumNs uint64) bool {
		return waits.busy("/pod/a", hist.Log2{Count: count, SumNs: sumNs}, start.Add(time.Duration(s)*time.Second))
	}
	if at(0, 1, 2e6) {
		t.Error("busy at its first change: nothing to compare with")
	}
	if at(5, 2, 4e6) {
		t.Error("busy after one 2 ms wait in 5 s")
	}
	if !at(6, 3, 6e6) {
		t.Error("not busy after a 2 ms wait in 1 s")
	}
}
