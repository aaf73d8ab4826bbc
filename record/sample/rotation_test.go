//go:build linux

package sample

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/rundir"
)

// fastMetrics are the series of the fast tier, read at every Sample.
var fastMetrics = []string{rundir.MetricCPUUsage, rundir.MetricCPUPeriods, rundir.MetricCPUThrottled,
	rundir.MetricCPUThrottledTime, rundir.MetricMemoryUsage}

// tiers splits recs by cgroup into the keys (metric and labels) of the fast and the slow tier.
func tiers(recs []rundir.Record) (fast, slow map[string][]string) {
	fast, slow = map[string][]string{}, map[string][]string{}
	for _, r := range recs {
		key := r.Metric
		for _, k := range slices.Sorted(maps.Keys(r.Labels)) {
			key += "," + k + "=" + r.Labels[k]
		}
		if slices.Contains(fastMetrics, r.Metric) {
			fast[r.Cgroup] = append(fast[r.Cgroup], key)
		} else {
			slow[r.Cgroup] = append(slow[r.Cgroup], key)
		}
	}
	return fast, slow
}

// makeCgroups makes n cgroups under a fresh test parent.
func makeCgroups(t *testing.T, n int) (*cgroup.Layout, []string) {
	t.Helper()
	l, parent := testParent(t, "test")
	paths := make([]string, n)
	for i := range paths {
		paths[i] = fmt.Sprintf("%s/c%d", parent, i)
		if err := l.Create(paths[i], cgroup.Limits{CPUMilli: 500, MemoryBytes: 64 << 20}); err != nil {
			t.Fatal(err)
		}
	}
	return l, paths
}

// spinIn makes cgroup cg, with no limit, and a shell spinning in it until the test ends.
func spinIn(t *testing.T, l *cgroup.Layout, cg string) string {
	t.Helper()
	if err := l.Create(cg, cgroup.Limits{}); err != nil {
		t.Fatal(err)
	}
	spin := exec.Command("sh", "-c", "while :; do :; done")
	if err := spin.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { spin.Process.Kill(); spin.Wait() })
	if err := l.AddProc(cg, spin.Process.Pid); err != nil {
		t.Fatal(err)
	}
	return cg
}

// Past the budget, each Sample reads every cgroup's fast tier and a staggered share's slow
// tier, each cgroup's at least once in every `every` samples and the priority one's always;
// SampleFull reads everything.
func TestCgroupRotation(t *testing.T) {
	l, paths := makeCgroups(t, 7)
	s := NewCgroups(l, func() []string { return paths }).Priority(func(p string) bool { return p == paths[0] })
	s.slowBudget = 2
	const every = 4 // ceil(7/2)

	full, err := s.SampleFull(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	wantFast, wantSlow := tiers(full)
	for _, p := range paths {
		if len(wantFast[p]) == 0 || len(wantSlow[p]) == 0 {
			t.Fatalf("cgroup %s: fast tier %v, slow tier %v; want both", p, wantFast[p], wantSlow[p])
		}
	}

	lastSlow := map[string]int{}
	for _, p := range paths {
		lastSlow[p] = 0 // SampleFull read it
	}
	const ticks = 3 * every
	for tick := 1; tick <= ticks; tick++ {
		recs, err := s.Sample(time.Now())
		if err != nil {
			t.Fatal(err)
		}
		fast, slow := tiers(recs)
		var rotated int
		for i, p := range paths {
			// Idle, off its turn, a cgroup's CPU usage is read and the rest of its fast tier
			// left, it did not move; once its parent's usage is known not to move (from the
			// second Sample on), nothing of it is read (TestCgroupIdleSubtreeNotRead).
			want := wantFast[p]
			if i > 0 && len(slow[p]) == 0 {
				want = cpuUsageOnly(l, want)
				if tick > 1 {
					want = nil
				}
			}
			if !slices.Equal(fast[p], want) {
				t.Fatalf("tick %d, cgroup %d: fast tier %v, want %v", tick, i, fast[p], want)
			}
			switch {
			case len(slow[p]) == 0:
				if i == 0 {
					t.Fatalf("tick %d: the priority cgroup's slow tier was not read", tick)
				}
				if tick-lastSlow[p] >= every {
					t.Fatalf("tick %d, cgroup %d: slow tier last read at tick %d, want once in every %d", tick, i, lastSlow[p], every)
				}
			case slices.Equal(slow[p], wantSlow[p]):
				lastSlow[p] = tick
				if i > 0 {
					rotated++
				}
			default:
				t.Fatalf("tick %d, cgroup %d: slow tier %v, want all of %v or none", tick, i, slow[p], wantSlow[p])
			}
		}
		if rotated > s.slowBudget {
			t.Fatalf("tick %d: %d cgroups read their slow tier, budget %d", tick, rotated, s.slowBudget)
		}
	}

	full, err = s.SampleFull(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	fast, slow := tiers(full)
	for _, p := range paths {
		if !slices.Equal(fast[p], wantFast[p]) || !slices.Equal(slow[p], wantSlow[p]) {
			t.Fatalf("SampleFull after rotating, cgroup %s: %v %v, want %v %v", p, fast[p], slow[p], wantFast[p], wantSlow[p])
		}
	}
}

// cpuUsageOnly keeps, of a cgroup's fast-tier keys, those of the file its CPU usage is read from:
// on v1 cpuacct.usage, the usage alone; on v2 cpu.stat, the usage with the throttling counters
// (one read gives them all).
func cpuUsageOnly(l *cgroup.Layout, keys []string) []string {
	usageFile := []string{rundir.MetricCPUUsage}
	if !l.V1 {
		usageFile = nil
		for _, k := range v2CPUStat {
			usageFile = append(usageFile, k.metric)
		}
	}
	return slices.DeleteFunc(slices.Clone(keys), func(k string) bool { return !slices.Contains(usageFile, k) })
}

// Past the budget, off its turn, a cgroup whose CPU usage moved since its previous read has
// its whole fast tier read, at every Sample; one whose usage stayed has its usage alone read.
func TestCgroupIdleReadsItsUsageOnly(t *testing.T) {
	l, paths := makeCgroups(t, 6)
	busy := spinIn(t, l, path.Dir(paths[0])+"/busy")
	// Throttled, so its cpu.stat moves; 900m, so that it runs in every 50 ms between two
	// Samples (at 500m it sat throttled through a whole one in a CI run: usage still, its usage
	// alone read).
	if err := l.Create(busy, cgroup.Limits{CPUMilli: 900}); err != nil {
		t.Fatal(err)
	}
	paths = append(paths, busy)
	time.Sleep(300 * time.Millisecond) // periods throttled by now: its cpu.stat is not all zeros
	s := NewCgroups(l, func() []string { return paths })
	s.slowBudget = 2
	full, err := s.SampleFull(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	wantFast, _ := tiers(full)
	if usage := cpuUsageOnly(l, wantFast[paths[0]]); len(usage) == 0 || len(usage) >= len(wantFast[paths[0]]) {
		t.Fatalf("fast tier %v: want the CPU usage and more", wantFast[paths[0]])
	}
	for tick := 1; tick <= 8; tick++ {
		time.Sleep(50 * time.Millisecond)
		recs, err := s.Sample(time.Now())
		if err != nil {
			t.Fatal(err)
		}
		fast, slow := tiers(recs)
		// Its memory usage may read 0 (the shell's pages were charged before it moved in),
		// and a fast file of zeros is read on turns only; its throttling moves.
		if !slices.Contains(fast[busy], rundir.MetricCPUThrottled) {
			t.Errorf("tick %d: the busy cgroup's fast tier %v, want its throttling too", tick, fast[busy])
		}
		for i, p := range paths[:len(paths)-1] {
			want := cpuUsageOnly(l, wantFast[p])
			if len(slow[p]) > 0 {
				want = wantFast[p]
			}
			if !slices.Equal(fast[p], want) {
				t.Errorf("tick %d, idle cgroup %d: fast tier %v, want %v", tick, i, fast[p], want)
			}
		}
	}
}

// Up to the budget, Sample reads everything, as SampleFull does.
func TestCgroupWithinBudget(t *testing.T) {
	l, paths := makeCgroups(t, 3)
	s := NewCgroups(l, func() []string { return paths })
	full, err := s.SampleFull(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	wantFast, wantSlow := tiers(full)
	for range 3 {
		recs, err := s.Sample(time.Now())
		if err != nil {
			t.Fatal(err)
		}
		fast, slow := tiers(recs)
		for _, p := range paths {
			if !slices.Equal(fast[p], wantFast[p]) || !slices.Equal(slow[p], wantSlow[p]) {
				t.Fatalf("cgroup %s: %v %v, want %v %v", p, fast[p], slow[p], wantFast[p], wantSlow[p])
			}
		}
	}
}

// A slow-tier file missing at first (a hybrid host's v2 cgroup made late) is found again while
// rotating: within retryAbsent samples of its last look plus one rotation.
func TestCgroupRotationFindsLateFile(t *testing.T) {
	host, paths := makeCgroups(t, 5)
	if !host.V1 || host.Unified == "" {
		t.Skip("not a hybrid host")
	}
	late := paths[0] + "/late"
	v1 := &cgroup.Layout{Root: host.Root, V1: true, Mounts: host.Mounts}
	if err := v1.Create(late, cgroup.Limits{}); err != nil {
		t.Fatal(err)
	}
	paths = append(paths, late)
	s := NewCgroups(host, func() []string { return paths })
	s.slowBudget = 2
	const every = 3 // ceil(6/2)
	pressure := func() bool {
		recs, err := s.Sample(time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(recs, func(r rundir.Record) bool {
			return r.Cgroup == late && r.Metric == rundir.MetricCgroupPressure
		})
	}
	for range 2 * every {
		if pressure() {
			t.Fatal("pressure of a cgroup with no v2 directory")
		}
	}
	if err := os.Mkdir(filepath.Join(host.Unified, strings.TrimPrefix(late, "/")), 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range retryAbsent + every {
		if pressure() {
			t.Logf("pressure read %d samples after its v2 cgroup was made", i+1)
			return
		}
	}
	t.Fatalf("no pressure %d samples after the v2 cgroup was made", retryAbsent+every)
}

// With Active, past the budget a Sample reads the fast tier of the cgroups named active and of
// those whose slow turn it is, and no other; a named one that uses no CPU (light) every
// lightEvery samples, one that spins at every sample. A cgroup that used CPU with cpu.stat all
// zeros (no CPU limit) has cpu.stat read on its turns only.
func TestCgroupActiveReadsWhatMayHaveChanged(t *testing.T) {
	l, paths := makeCgroups(t, 6)
	spinning := spinIn(t, l, path.Dir(paths[0])+"/spin") // no CPU limit: cpu.stat stays all zeros
	paths = append(paths, spinning)
	named := paths[1]
	time.Sleep(20 * time.Millisecond) // it has used CPU
	s := NewCgroups(l, func() []string { return paths }).Active(func(p string) bool { return p == named || p == spinning })
	s.slowBudget = 2
	const every = 4                                 // ceil(7/2)
	if _, err := s.Sample(time.Now()); err != nil { // the first read of each: all of them
		t.Fatal(err)
	}
	fastReads, periodReads := map[string]int{}, map[string]int{}
	const ticks = 3 * every
	for tick := 1; tick <= ticks; tick++ {
		// The kernel charges CPU time at its ticks and switches: samples a few milliseconds
		// apart could see the spinning cgroup's usage stand still, and call it light.
		time.Sleep(50 * time.Millisecond)
		recs, err := s.Sample(time.Now())
		if err != nil {
			t.Fatal(err)
		}
		fast, slow := tiers(recs)
		for _, p := range paths {
			if len(fast[p]) > 0 {
				fastReads[p]++
			}
			if slices.Contains(fast[p], rundir.MetricCPUPeriods) {
				periodReads[p]++
			}
			if len(slow[p]) > 0 && len(fast[p]) == 0 {
				t.Fatalf("tick %d: %s's slow tier read without its fast tier", tick, p)
			}
		}
	}
	turns := ticks / every
	for _, p := range paths {
		if p == named {
			continue
		}
		want := turns
		if p == spinning {
			want = ticks
		}
		if fastReads[p] != want {
			t.Errorf("%s: fast tier read at %d of %d ticks, want %d", p, fastReads[p], ticks, want)
		}
	}
	// The named cgroup has no process: light, it is read every lightEvery ticks or on its turn.
	if n := fastReads[named]; n < ticks/lightEvery || n > ticks/lightEvery+turns {
		t.Errorf("%s (light): fast tier read at %d of %d ticks, want %d to %d", named, n, ticks, ticks/lightEvery, ticks/lightEvery+turns)
	}
	if !l.V1 {
		return // v2's cpu.stat has the CPU usage: never quiet
	}
	if periodReads[named] != fastReads[named] || periodReads[spinning] != turns {
		t.Errorf("cpu.stat read at %d ticks of the limited cgroup named active (want its %d fast reads), at %d of the unlimited one (want its %d turns)",
			periodReads[named], fastReads[named], periodReads[spinning], turns)
	}
}

// With Active, a cgroup that stays light is read less and less often, down to its turns, however
// often the tracer names it; named busy (on a CPU at the collection), it is read at every sample.
func TestCgroupLightBacksOff(t *testing.T) {
	l, paths := makeCgroups(t, 8)
	named := paths[3] // no process: light at every read
	for _, busy := range []bool{false, true} {
		s := NewCgroups(l, func() []string { return paths }).Active(func(p string) bool { return p == named }).
			Busy(func(p string) bool { return busy && p == named })
		s.slowBudget = 1 // a turn every 8 samples
		const ticks, turns = 4 * lightMaxEvery, 4 * lightMaxEvery / 8
		start := time.Now()
		reads := 0
		for tick := range ticks {
			recs, err := s.Sample(start.Add(time.Duration(tick) * time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if fast, _ := tiers(recs); len(fast[named]) > 0 {
				reads++
			}
		}
		t.Logf("busy %v: read at %d of %d samples, %d turns", busy, reads, ticks, turns)
		if busy && reads != ticks {
			t.Errorf("named busy: read at %d of %d samples, want every one", reads, ticks)
		}
		// Read every lightEvery samples, it would be read about twice as often as its turns.
		if !busy && (reads < turns || reads > turns+ticks/lightEvery/4) {
			t.Errorf("light: read at %d of %d samples, want its %d turns and at most %d more", reads, ticks, turns, ticks/lightEvery/4)
		}
	}
}

// ranOnceIn makes cgroup cg, with no limit, where a shell counts for a moment and exits: a
// cgroup that used some CPU, whose cpu.stat (v1) reads all zeros.
func ranOnceIn(t *testing.T, l *cgroup.Layout, cg string) string {
	t.Helper()
	if err := l.Create(cg, cgroup.Limits{}); err != nil {
		t.Fatal(err)
	}
	sh := exec.Command("sh", "-c", "read x; i=0; while [ $i -lt 2000 ]; do i=$((i+1)); done")
	in, err := sh.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	defer sh.Wait()
	defer in.Close()
	if err := l.AddProc(cg, sh.Process.Pid); err != nil {
		sh.Process.Kill()
		t.Fatal(err)
	}
	return cg
}

// allZeros says whether every value of flat-keyed file name is 0.
func allZeros(t *testing.T, name string) bool {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if _, v, _ := strings.Cut(strings.TrimSpace(line), " "); v != "0" {
			t.Logf("%s: %q is not 0", name, strings.TrimSpace(line))
			return false
		}
	}
	return true
}

// With Active, a cgroup quiet since its last slow read has its slow tier read on one turn in
// quietEvery; a busy one at each of its turns, and SampleFull reads everything. A cgroup that
// ran once without a CPU limit has its cpu.stat (all zeros) read on the turns not passed over.
func TestCgroupQuietTurnsPassedOver(t *testing.T) {
	l, paths := makeCgroups(t, 4)
	spinning := spinIn(t, l, path.Dir(paths[0])+"/spin")
	ranOnce := ranOnceIn(t, l, path.Dir(paths[0])+"/once")
	paths = append(paths, spinning, ranOnce)
	s := NewCgroups(l, func() []string { return paths }).Active(func(p string) bool { return p == spinning })
	s.slowBudget = 1
	const every, turns = 6, 2 * quietEvery // ceil(6/1)
	if _, err := s.Sample(time.Now()); err != nil {
		t.Fatal(err)
	}
	slowReads, statReads := map[string]int{}, 0
	for range every * turns {
		time.Sleep(20 * time.Millisecond) // the spinning cgroup's usage moves between samples
		recs, err := s.Sample(time.Now())
		if err != nil {
			t.Fatal(err)
		}
		_, slow := tiers(recs)
		for p := range slow {
			slowReads[p]++
		}
		for _, r := range recs {
			if r.Cgroup == ranOnce && r.Metric == rundir.MetricCPUPeriods {
				statReads++
			}
		}
	}
	for _, p := range paths {
		want := turns / quietEvery // the first turn, then one in quietEvery
		if p == spinning {
			want = turns
		}
		if slowReads[p] != want {
			t.Errorf("%s: slow tier read at %d of its %d turns, want %d", p, slowReads[p], turns, want)
		}
	}
	// Where the kernel keeps schedstats (kernel.sched_schedstats), v1's cpu.stat has wait_sum too.
	if want := turns / quietEvery; l.V1 && allZeros(t, l.Dir(cgroup.CPU, ranOnce)+"/cpu.stat") && statReads != want {
		t.Errorf("%s: cpu.stat (all zeros, no limit) read at %d of its %d turns, want %d: those not passed over", ranOnce, statReads, turns, want)
	}
	recs, err := s.SampleFull(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, slow := tiers(recs); len(slow) != len(paths) {
		t.Errorf("SampleFull read the slow tier of %d cgroups of %d", len(slow), len(paths))
	}
}

func TestZeros(t *testing.T) {
	for in, want := range map[string]bool{
		"0\n": true,
		"nr_periods 0\nnr_throttled 0\nthrottled_time 0\nnr_bursts 0\nburst_time 0\n": true,
		"nr_periods 10\nnr_throttled 0\n":                                             false,
		"pgpgin2 0\n":                                                                 true, // a digit in a key is no number
		"usage 3\n":                                                                   false,
		"":                                                                            true,
	} {
		if got := zeros([]byte(in)); got != want {
			t.Errorf("zeros(%q) = %v, want %v", in, got, want)
		}
	}
}

// Past the budget, off their turn, the cgroups under a parent whose CPU usage did not move are
// not read at all (the usage counts the descendants'); one that runs moves its parent and is
// read at the next Sample, its usage up to date.
func TestCgroupIdleSubtreeNotRead(t *testing.T) {
	l, paths := makeCgroups(t, 6)
	_, other := testParent(t, "test")
	busy := spinIn(t, l, other+"/busy")
	idle := slices.Clone(paths)
	paths = append(paths, busy)
	s := NewCgroups(l, func() []string { return paths })
	s.slowBudget = 2
	first, err := s.Sample(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for tick := 1; tick <= 6; tick++ {
		time.Sleep(50 * time.Millisecond)
		recs, err := s.Sample(time.Now())
		if err != nil {
			t.Fatal(err)
		}
		fast, slow := tiers(recs)
		if len(fast[busy]) == 0 {
			t.Errorf("tick %d: the busy cgroup was not read", tick)
		}
		for i, p := range idle {
			switch {
			case len(slow[p]) == 0 && len(fast[p]) > 0:
				t.Errorf("tick %d, idle cgroup %d: read off its turn (%v), its parent still", tick, i, fast[p])
			case len(slow[p]) > 0 && len(fast[p]) == 0:
				t.Errorf("tick %d, idle cgroup %d: its turn without its fast tier", tick, i)
			}
		}
	}
	// c2 runs for a moment: its parent moves, and the next Sample reads it.
	run := exec.Command("sh", "-c", "read x; i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done")
	gate, err := run.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	if err := l.AddProc(idle[2], run.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if _, err := gate.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	if err := run.Wait(); err != nil {
		t.Fatal(err)
	}
	recs, err := s.Sample(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	before, after := value(t, first, idle[2], rundir.MetricCPUUsage), value(t, recs, idle[2], rundir.MetricCPUUsage)
	if after <= before {
		t.Errorf("c2 ran: its usage read %v, %v before", after, before)
	}
}

// A turn is quiet when the cgroup stayed light and its memory usage moved less than quietMem
// since its last slow read: the per-CPU charge stocks move an idle sandbox's usage by pages.
func TestQuietTurnToleratesChargeBatches(t *testing.T) {
	t0 := time.Now()
	const mem = 50 << 20
	for _, c := range []struct {
		name     string
		cpu, mem float64 // since the slow read, 10 s before
		want     bool
	}{
		{"still", 0, 0, true},
		{"a wake-up: 2 ms of CPU and a charge batch", 2e-3, 256 << 10, true},
		{"a batch returned", 2e-3, -256 << 10, true},
		{"grew by a MiB", 2e-3, 1 << 20, false},
		{"ran 10 ms a second", 0.1, 0, false},
	} {
		o := &cgOpen{slowCPU: 1, slowMem: mem, slowTime: t0}
		cpu, m := 1+c.cpu, mem+c.mem
		recs := []rundir.Record{{Metric: rundir.MetricCPUUsage, Value: &cpu}, {Metric: rundir.MetricMemoryUsage, Value: &m}}
		if got := o.quietTurn(recs, t0.Add(10*time.Second)); got != c.want {
			t.Errorf("%s: quiet %v, want %v", c.name, got, c.want)
		}
	}
}
