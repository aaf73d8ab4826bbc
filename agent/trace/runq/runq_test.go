//go:build linux

package runq

import (
	"errors"
	"io/fs"
	"log/slog"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/nodectl/nodectl/agent/trace/internal/cgtest"
)

func newTracer(t *testing.T, cfg Config) *Tracer {
	t.Helper()
	cgtest.RequireRoot(t)
	cfg.CgroupV1 = cgtest.V1()
	tr, err := New(cfg, slog.New(slog.DiscardHandler))
	if errors.Is(err, ebpf.ErrNotSupported) {
		t.Skipf("kernel lacks a feature the run-queue tracer needs: %v", err)
	}
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

func read(t *testing.T, tr *Tracer) Stats {
	t.Helper()
	st, err := tr.Read()
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	return st
}

// waitFor reads until ok holds or timeout passes, and returns the last read. On a loaded
// machine the test's pinned loops may take a while to meet.
func waitFor(t *testing.T, tr *Tracer, timeout time.Duration, ok func(Stats) bool) Stats {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		st := read(t, tr)
		if ok(st) || time.Now().After(deadline) {
			return st
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func pair(st Stats, victim, preemptor uint64) Pair {
	for _, p := range st.Pairs {
		if p.Victim == victim && p.Preemptor == preemptor {
			return p
		}
	}
	return Pair{}
}

// Two busy loops sharing one CPU preempt each other: both wait in the run queue, and each
// pair is charged to the other's cgroup.
func TestPreemptionPairs(t *testing.T) {
	tr := newTracer(t, Config{})
	g := cgtest.Make(t, "cpu", "a", "b")
	cpu := cgtest.LastCPU(t)
	g["a"].Busy(t, cpu)
	g["b"].Busy(t, cpu)
	a, b := g["a"].ID, g["b"].ID
	st := waitFor(t, tr, 15*time.Second, func(st Stats) bool {
		return st.Latency[a].Count > 0 && st.Latency[b].Count > 0 &&
			pair(st, a, b).WaitNs > 0 && pair(st, b, a).WaitNs > 0
	})
	for name, id := range map[string]uint64{"a": a, "b": b} {
		if h := st.Latency[id]; h.Count == 0 || h.SumNs == 0 {
			t.Errorf("cgroup %s (id %d): run-queue histogram %+v, want waits", name, id, h)
		}
	}
	for _, c := range []struct{ name, victim, preemptor string }{
		{"a_by_b", "a", "b"},
		{"b_by_a", "b", "a"},
	} {
		p := pair(st, g[c.victim].ID, g[c.preemptor].ID)
		if p.Count == 0 || p.WaitNs == 0 {
			t.Errorf("%s: %+v, want preemptions with waits", c.name, p)
		}
	}
	for r, n := range st.Drops {
		if n != 0 {
			t.Errorf("drops %s = %d, want 0", r, n)
		}
	}
	want := max(float64(len(st.Latency))/DefaultMaxCgroups, float64(len(st.Pairs))/DefaultMaxPairs)
	if st.Fill != want {
		t.Errorf("fill %g, want %g: the fuller map's entries over its capacity", st.Fill, want)
	}
}

// A cgroup out of quota waits for its next period, not for its neighbour: the waits are
// charged to the throttled preemptor.
func TestThrottledAttribution(t *testing.T) {
	tr := newTracer(t, Config{})
	g := cgtest.Make(t, "cpu", "capped", "neighbour")
	if cgtest.V1() {
		g["capped"].Write(t, "cpu.cfs_period_us", "100000")
		g["capped"].Write(t, "cpu.cfs_quota_us", "5000")
	} else {
		g["capped"].Write(t, "cpu.max", "5000 100000")
	}
	cpu := cgtest.LastCPU(t)
	g["capped"].Busy(t, cpu)
	g["neighbour"].Busy(t, cpu)
	// Twenty periods, for a ratio that does not hang on one period.
	time.Sleep(2 * time.Second)
	capped, neighbour := g["capped"].ID, g["neighbour"].ID
	st := waitFor(t, tr, 10*time.Second, func(st Stats) bool {
		return pair(st, capped, PreemptorThrottled).WaitNs > 0
	})
	throttled := pair(st, capped, PreemptorThrottled)
	byNeighbour := pair(st, capped, neighbour)
	t.Logf("capped by <throttled>: %+v; by neighbour: %+v", throttled, byNeighbour)
	if throttled.Count == 0 || throttled.WaitNs == 0 {
		t.Fatalf("capped by <throttled>: %+v, want throttled waits", throttled)
	}
	// 5 ms of quota per 100 ms: about 95 ms of each period is throttling, a few ms at most
	// is the neighbour's turn.
	if throttled.WaitNs < 3*byNeighbour.WaitNs {
		t.Errorf("capped waited %d ns throttled and %d ns for its neighbour, want throttling to dominate",
			throttled.WaitNs, byNeighbour.WaitNs)
	}
	if p := pair(st, neighbour, PreemptorThrottled); p.Count != 0 {
		t.Errorf("unlimited neighbour charged to <throttled>: %+v", p)
	}
}

// Entries of a removed cgroup go at the next Forget; a live one's stay.
func TestForget(t *testing.T) {
	tr := newTracer(t, Config{})
	g := cgtest.Make(t, "cpu", "gone", "kept")
	cpu := cgtest.LastCPU(t)
	g["gone"].Busy(t, cpu)
	g["kept"].Busy(t, cpu)
	gone, kept := g["gone"].ID, g["kept"].ID
	st := waitFor(t, tr, 15*time.Second, func(st Stats) bool {
		return st.Latency[gone].Count > 0 && pair(st, kept, gone).Count > 0
	})
	if st.Latency[gone].Count == 0 || pair(st, kept, gone).Count == 0 {
		t.Fatalf("no entries for cgroup gone before removal: latency %+v, pair %+v",
			st.Latency[gone], pair(st, kept, gone))
	}

	g["gone"].Remove(t)
	live := liveIDs(t, cgtest.Mount("cpu"))
	n, err := tr.Forget(func(id uint64) bool { return live[id] })
	if err != nil {
		t.Fatalf("Forget: %v", err)
	}
	if n < 2 {
		t.Errorf("Forget deleted %d entries, want at least the latency and one pair", n)
	}
	st = read(t, tr)
	if _, ok := st.Latency[gone]; ok {
		t.Errorf("latency of removed cgroup still present")
	}
	for _, p := range st.Pairs {
		if p.Victim == gone || p.Preemptor == gone {
			t.Errorf("pair of removed cgroup still present: %+v", p)
		}
	}
	if st.Latency[kept].Count == 0 {
		t.Errorf("latency of live cgroup forgotten")
	}
}

// liveIDs returns the ids (directory inodes) of every cgroup in the hierarchy at mount.
func liveIDs(t *testing.T, mount string) map[uint64]bool {
	t.Helper()
	ids := map[uint64]bool{}
	err := filepath.WalkDir(mount, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			// A cgroup removed during the walk.
			return nil
		}
		if !d.IsDir() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		ids[fi.Sys().(*syscall.Stat_t).Ino] = true
		return nil
	})
	if err != nil {
		t.Fatalf("walking %s: %v", mount, err)
	}
	return ids
}

// Full maps count drops instead of failing silently.
func TestDropsWhenFull(t *testing.T) {
	tr := newTracer(t, Config{MaxCgroups: 1, MaxPairs: 1})
	g := cgtest.Make(t, "cpu", "a", "b")
	cpu := cgtest.LastCPU(t)
	g["a"].Busy(t, cpu)
	g["b"].Busy(t, cpu)
	st := waitFor(t, tr, 15*time.Second, func(st Stats) bool {
		return st.Drops["latency_map_full"] > 0 && st.Drops["pairs_map_full"] > 0
	})
	if len(st.Latency) > 1 || len(st.Pairs) > 1 {
		t.Errorf("maps over capacity: %d cgroups, %d pairs", len(st.Latency), len(st.Pairs))
	}
	for _, r := range []string{"latency_map_full", "pairs_map_full"} {
		if st.Drops[r] == 0 {
			t.Errorf("drops %s = 0, want > 0 (all drops: %v)", r, st.Drops)
		}
	}
}

func TestCloseTwice(t *testing.T) {
	cgtest.CheckClose(t, newTracer(t, Config{}))
}
