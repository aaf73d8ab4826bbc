package analyzer

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/nodectl/nodectl/rundir"
)

// The probe's readings of one measure: ten in the baseline, twenty in the stress phase.
var (
	steadyWork  = []float64{0.0698, 0.0701, 0.0695, 0.0710, 0.0720, 0.0699, 0.0703, 0.0697, 0.0705, 0.0700}
	steadyFsync = []float64{0.030, 0.031, 0.029, 0.032, 0.030, 0.031, 0.030, 0.029, 0.031, 0.030}
	steadyWrite = []float64{0.040}
	slowFsync   = []float64{0.110, 0.120, 0.125, 0.118, 0.130, 0.115, 0.122, 0.119, 0.121, 0.117}
)

// probe records the victim probe's three readings per iteration.
func (b *builder) probe(work, write, fsync [2][]float64) *builder {
	b.gauge(rundir.MetricProbeCPUWork, victim, work[0], work[1])
	b.gauge(rundir.MetricProbeWrite, victim, write[0], write[1])
	return b.gauge(rundir.MetricProbeFsync, victim, fsync[0], fsync[1])
}

// device records the victim's device: bytes and requests of cgroup in each phase, each request
// taking the same time in both phases unless slower says otherwise.
func (b *builder) device(cgroup string, baseBytes, stressBytes float64, requests uint64, slower float64) *builder {
	dev := []string{rundir.LabelDevice, disk, rundir.LabelOp, "write"}
	b.counter(rundir.MetricBlkBytes, cgroup, baseBytes, stressBytes, dev...)
	b.histogram(rundir.MetricBlkQueue, cgroup, lat(requests, 50e-6), lat(requests, 50e-6*slower), dev...)
	return b.histogram(rundir.MetricBlkService, cgroup, lat(requests, 20e-3), lat(2*requests, 20e-3*slower), dev...)
}

// contended is a victim whose run queue filled with two CPU hogs' waits.
func contended(probe [3][2][]float64, wl ...rundir.Workload) *builder {
	return newRun(append([]rundir.Workload{victimWorkload(), hogWorkload("cpu", 0), hogWorkload("cpu", 1)}, wl...)...).
		histogram(rundir.MetricRunqLatency, victim, lat(1000, 20e-6), lat(2000, 2e-3)).
		probe(probe[0], probe[1], probe[2]).
		preempted(cpuHog0, 0, 1.5).
		preempted(cpuHog1, 0, 1.2)
}

func TestTailSlowdownIsCPUContention(t *testing.T) {
	// p50 1.18x (not enough), p95 7x: two iterations of twenty held up for 0.4 s.
	tail := []float64{0.082, 0.083, 0.084, 0.082, 0.083, 0.50, 0.083, 0.084, 0.082, 0.083,
		0.083, 0.082, 0.084, 0.083, 0.082, 0.45, 0.083, 0.084, 0.082, 0.083}
	rep := contended([3][2][]float64{{steadyWork, tail}, {steadyWrite, steadyWrite}, {steadyFsync, steadyFsync}}).
		device(victim, 640<<20, 1280<<20, 100, 1).analyze(t)
	if got := ids(rep); !reflect.DeepEqual(got, []string{IDCPUContention}) {
		t.Fatalf("findings %v, want cpu-contention", got)
	}
	f := rep.Findings[0]
	if !reflect.DeepEqual(f.Affects, []string{"cpu_work"}) || !reflect.DeepEqual(f.Culprits, []string{"cpu-hog-0", "cpu-hog-1"}) {
		t.Errorf("affects %v culprits %v", f.Affects, f.Culprits)
	}
	if f.Severity != SeverityCritical {
		t.Errorf("severity %s, want critical for a 7x tail", f.Severity)
	}
	for _, want := range []string{"the tail slowed", "p95 of 20 iterations against 10 in the baseline", "20 of them over 5ms slower than every baseline one"} {
		if !strings.Contains(f.Summary, want) {
			t.Errorf("summary %q lacks %q", f.Summary, want)
		}
	}
	if e := evidence(t, f, "probe_cpu_work_iterations", ""); e.Baseline != 10 || e.Value != 20 {
		t.Errorf("iterations evidence %+v", e)
	}
	if e := evidence(t, f, "probe_cpu_work_rise_chance", ""); e.Value <= 0 || e.Value > probeAlpha {
		t.Errorf("rise chance %+v", e)
	}
}

// The victim's fsync slowed, its device served it as fast as before, and neighbours held its
// CPU: cpu-contention lists the I/O, and no disk-contention, whether or not a disk neighbour
// wrote to the device meanwhile.
func TestFsyncSlowedByTheCPUIsCPUContention(t *testing.T) {
	io := [3][2][]float64{{steadyWork, steadyWork}, {steadyWrite, steadyWrite}, {steadyFsync, slowFsync}}
	for name, b := range map[string]*builder{
		"no_disk_neighbour": contended(io).device(victim, 640<<20, 1280<<20, 100, 1),
		"disk_neighbour_device_unchanged": contended(io, hogWorkload("disk", 0)).
			device(victim, 640<<20, 1280<<20, 100, 1).device(diskHog+"0", 0, 1<<30, 100, 1),
	} {
		t.Run(name, func(t *testing.T) {
			rep := b.analyze(t)
			if got := ids(rep); !reflect.DeepEqual(got, []string{IDCPUContention}) {
				t.Fatalf("findings %v, want cpu-contention only", got)
			}
			f := rep.Findings[0]
			if !reflect.DeepEqual(f.Affects, []string{"write_fsync", "fsync"}) {
				t.Errorf("affects %v, want the I/O measures", f.Affects)
			}
			if e := evidence(t, f, "blk_request_mean", ""); e.Device != disk || e.Value > 1.1*e.Baseline {
				t.Errorf("the victim's request time %+v, want it flat", e)
			}
			if e := evidence(t, f, "probe_fsync_p95", ""); e.Value < 3*e.Baseline {
				t.Errorf("fsync p95 evidence %+v", e)
			}
			for _, want := range []string{"fsync p50 30ms → 119ms", "its device does not explain it", "waited for a CPU, not for the disk"} {
				if !strings.Contains(f.Summary, want) {
					t.Errorf("summary %q lacks %q", f.Summary, want)
				}
			}
		})
	}
}

// A wait that went into the CPU work did not delay the I/O: with the victim's write+fsync
// 1.78 s slower in all and neighbours adding 1.2 s of wait, cpu-contention names the I/O,
// unless its CPU work lost 0.66 s (two iterations 0.33 s long, not a slowdown): 0.54 s left is
// not half the I/O's loss.
func TestWaitInTheCPUWorkDoesNotExplainTheIO(t *testing.T) {
	oneLong := slices.Clone(steadyWork)
	oneLong[4] = 0.400
	for name, work := range map[string][]float64{"steady_work": steadyWork, "one_long_wait_in_the_work": oneLong} {
		t.Run(name, func(t *testing.T) {
			rep := newRun(victimWorkload(), hogWorkload("cpu", 0)).
				histogram(rundir.MetricRunqLatency, victim, lat(1000, 20e-6), lat(2000, 2e-3)).
				probe([2][]float64{steadyWork, work}, [2][]float64{steadyWrite, steadyWrite}, [2][]float64{steadyFsync, slowFsync}).
				preempted(cpuHog0, 0, 1.2).analyze(t)
			t.Logf("findings %v, notes %q", ids(rep), rep.Notes)
			if name == "steady_work" {
				if f := finding(t, rep, IDCPUContention); !reflect.DeepEqual(f.Affects, []string{"write_fsync", "fsync"}) {
					t.Errorf("affects %v, want the I/O", f.Affects)
				}
				return
			}
			if len(rep.Findings) != 0 {
				t.Fatalf("findings %v, want none", ids(rep))
			}
			if !slices.ContainsFunc(rep.Notes, func(n string) bool { return strings.Contains(n, "less the 656ms its CPU work lost") }) {
				t.Errorf("notes %q do not say the CPU work's loss was deducted", rep.Notes)
			}
		})
	}
}

// When the device did slow under the disk neighbour, the slower fsync is disk-contention's,
// and CPU contention that left the CPU work alone has nothing to explain.
func TestFsyncSlowedByTheDiskIsDiskContention(t *testing.T) {
	io := [3][2][]float64{{steadyWork, steadyWork}, {steadyWrite, steadyWrite}, {steadyFsync, slowFsync}}
	rep := contended(io, hogWorkload("disk", 0)).
		device(victim, 640<<20, 1280<<20, 100, 3).device(diskHog+"0", 0, 1<<30, 100, 3).analyze(t)
	if got := ids(rep); !reflect.DeepEqual(got, []string{IDDiskContention}) {
		t.Fatalf("findings %v, want disk-contention only", got)
	}
	if f := rep.Findings[0]; !reflect.DeepEqual(f.Affects, []string{"write_fsync", "fsync"}) || f.Culprits[0] != "disk-hog-0" {
		t.Errorf("affects %v culprits %v", f.Affects, f.Culprits)
	}
}

// The victim stalled in reclaim against a limit above it while a neighbour grew, and its
// writes slowed with the stalls: memory-reclaim lists them.
func TestFsyncSlowedByReclaimIsMemoryReclaim(t *testing.T) {
	memcg := []string{rundir.LabelKind, rundir.ReclaimMemcg}
	rep := newRun(victimWorkload(), memHogWorkload()).
		probe([2][]float64{steadyWork, steadyWork}, [2][]float64{steadyWrite, steadyWrite}, [2][]float64{steadyFsync, slowFsync}).
		device(victim, 640<<20, 1280<<20, 100, 1).
		histogram(rundir.MetricReclaimStall, victim, lat(0, 0), lat(400, 0.005), memcg...).
		gauge(rundir.MetricMemoryUsage, memHog, []float64{1 << 20}, []float64{1 << 20, 900 << 20}).
		analyze(t)
	if got := ids(rep); !reflect.DeepEqual(got, []string{IDMemoryReclaim}) {
		t.Fatalf("findings %v, want memory-reclaim only", got)
	}
	f := rep.Findings[0]
	if !reflect.DeepEqual(f.Affects, []string{"write_fsync", "fsync"}) || !reflect.DeepEqual(f.Culprits, []string{"memory-hog-0"}) {
		t.Errorf("affects %v culprits %v", f.Affects, f.Culprits)
	}
	if !strings.Contains(f.Summary, "with the stalls, not with its device") {
		t.Errorf("summary %q", f.Summary)
	}
}

func TestUnexplainedSlowdownIsANote(t *testing.T) {
	rep := newRun(victimWorkload()).
		probe([2][]float64{steadyWork, steadyWork}, [2][]float64{steadyWrite, steadyWrite}, [2][]float64{steadyFsync, slowFsync}).
		device(victim, 640<<20, 1280<<20, 100, 1).analyze(t)
	if len(rep.Findings) != 0 {
		t.Fatalf("findings %v, want none: nothing explains it", ids(rep))
	}
	if !slices.ContainsFunc(rep.Notes, func(n string) bool {
		return strings.Contains(n, "victim's fsync got slower but no finding explains it")
	}) {
		t.Errorf("notes %q do not name the unexplained fsync", rep.Notes)
	}
}

func TestTooFewIterationsIsANote(t *testing.T) {
	b := newRun(victimWorkload())
	for i, v := range []float64{0.07, 0.07, 0.5, 0.6, 0.7} {
		v := v
		b.recs = append(b.recs, rundir.Record{Type: rundir.TypeSample, Time: at([]float64{3, 7, 12, 18, 25}[i]),
			Metric: rundir.MetricProbeCPUWork, Cgroup: victim, Value: &v})
	}
	rep := b.histogram(rundir.MetricRunqLatency, victim, lat(1000, 20e-6), lat(2000, 2e-3)).
		preempted(cpuHog0, 0, 3).analyze(t)
	if len(rep.Findings) != 0 {
		t.Errorf("findings %v from 2 and 3 iterations", ids(rep))
	}
	if !slices.ContainsFunc(rep.Notes, func(n string) bool { return strings.Contains(n, "too few for a slowdown to count") }) {
		t.Errorf("notes %q do not say the run was too short", rep.Notes)
	}
}

// A gVisor victim's run-queue wait is summed over its Sentry's threads: the evidence splits what
// held up the probe from what did not, and the finding is the same in every runtime.
func TestGVisorVictimSplitsItsWait(t *testing.T) {
	slow := []float64{0.15, 0.16, 0.14, 0.15, 0.16}
	var got [][]string
	for _, rt := range []string{"process", "runc", "runsc"} {
		b := contended([3][2][]float64{{steadyWork, slow}, {steadyWrite, steadyWrite}, {steadyFsync, steadyFsync}})
		b.meta.Workloads[0].Runtime = rt
		f := finding(t, b.analyze(t), IDCPUContention)
		got = append(got, append([]string{f.ID}, f.Culprits...))
		delay, outside := evidence(t, f, "probe_delay_seconds", ""), evidence(t, f, "runq_wait_outside_probe_seconds", "")
		wait := evidence(t, f, "runq_wait_seconds", "")
		if !near(delay.Value+outside.Value, wait.Value) || delay.Value < 1.5 || outside.Value <= 0 {
			t.Errorf("%s: delay %v + outside %v, want the wait %v split", rt, delay.Value, outside.Value, wait.Value)
		}
		if says := strings.Contains(f.Summary, "Sentry's, gofer's and stubs' threads"); says != (rt == "runsc") {
			t.Errorf("%s: summary %q speaks of the Sentry: %v", rt, f.Summary, says)
		}
	}
	if !reflect.DeepEqual(got[0], got[1]) || !reflect.DeepEqual(got[0], got[2]) {
		t.Errorf("findings and culprits by runtime %v, want the same", got)
	}
}

// A victim held for the whole stress phase finishes no iteration there: no finding can compare
// it, and the report says so rather than nothing.
func TestStalledProbeIsANote(t *testing.T) {
	b := newRun(victimWorkload())
	b.gauge(rundir.MetricProbeCPUWork, victim, steadyWork, steadyWork)
	b.recs = slices.DeleteFunc(b.recs, func(r rundir.Record) bool {
		return r.Metric == rundir.MetricProbeCPUWork && r.Time.After(at(10))
	})
	rep := b.histogram(rundir.MetricRunqLatency, victim, lat(1000, 20e-6), lat(10, 8)).analyze(t)
	if !slices.ContainsFunc(rep.Notes, func(n string) bool { return strings.Contains(n, "finished no iteration in the stress phase") }) {
		t.Errorf("notes %q do not say the probe was held the whole phase", rep.Notes)
	}
}

// Neighbours that only took turns from the victim's own waits (its total wait as in the
// baseline) explain no slower fsync, however consistent: no cpu-contention, a note instead.
func TestWaitsThatDidNotGrowExplainNothing(t *testing.T) {
	shifted := []float64{0.037, 0.038, 0.036, 0.039, 0.037, 0.038, 0.037, 0.036, 0.038, 0.037}
	rep := newRun(victimWorkload(), hogWorkload("cpu", 0)).
		histogram(rundir.MetricRunqLatency, victim, lat(2000, 80e-6), lat(4000, 80e-6)).
		probe([2][]float64{steadyWork, steadyWork}, [2][]float64{steadyWrite, steadyWrite}, [2][]float64{steadyFsync, shifted}).
		device(victim, 640<<20, 1280<<20, 100, 1).
		preempted(cpuHog0, 0, 0.1).
		analyze(t)
	if len(rep.Findings) != 0 {
		t.Fatalf("findings %v, want none: the victim waited no more than alone", ids(rep))
	}
	if !slices.ContainsFunc(rep.Notes, func(n string) bool { return strings.Contains(n, "run-queue wait's rise") }) {
		t.Errorf("notes %q do not say its waiting did not grow", rep.Notes)
	}
}
