package analyzer

import (
	"fmt"
	"math"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func at(sec float64) time.Time { return t0.Add(time.Duration(sec * float64(time.Second))) }

const (
	runCg   = "/nodectl/r1"
	victim  = runCg + "/victim"
	cpuHog0 = runCg + "/cpu-hog-0"
	cpuHog1 = runCg + "/cpu-hog-1"
	diskHog = runCg + "/disk-hog-"
	disk    = "254:0"
)

// builder collects a synthetic run: baseline is (0 s, 10 s], stress is (10 s, 30 s].
type builder struct {
	meta rundir.Meta
	recs []rundir.Record
}

func newRun(workloads ...rundir.Workload) *builder {
	b := &builder{meta: rundir.Meta{ID: "r1", Scenario: "noisy", Node: "node-a", Kernel: "6.18.0", Start: at(-1), Workloads: workloads}}
	b.recs = append(b.recs,
		rundir.Record{Type: rundir.TypePhase, Time: at(0), Name: rundir.PhaseBaseline, Event: rundir.EventStart},
		rundir.Record{Type: rundir.TypePhase, Time: at(10), Name: rundir.PhaseBaseline, Event: rundir.EventEnd},
		rundir.Record{Type: rundir.TypePhase, Time: at(10), Name: rundir.PhaseStress, Event: rundir.EventStart},
		rundir.Record{Type: rundir.TypePhase, Time: at(30), Name: rundir.PhaseStress, Event: rundir.EventEnd},
	)
	return b
}

func victimWorkload() rundir.Workload {
	return rundir.Workload{Name: "victim", Kind: "victim", Cgroup: victim, CPU: "250m", Device: disk}
}

func hogWorkload(kind string, i int) rundir.Workload {
	name := fmt.Sprintf("%s-hog-%d", kind, i)
	return rundir.Workload{Name: name, Kind: kind, Cgroup: runCg + "/" + name, CPU: "1"}
}

func labels(kv ...string) map[string]string {
	if len(kv) == 0 {
		return nil
	}
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// counter records a cumulative counter that grew by base in the baseline and by stress in the
// stress phase, sampled at 0, 5, 10, 20 and 30 s.
func (b *builder) counter(metric, cgroup string, base, stress float64, kv ...string) *builder {
	for _, s := range []struct{ t, v float64 }{{0, 0}, {5, base / 2}, {10, base}, {20, base + stress/2}, {30, base + stress}} {
		v := s.v
		b.recs = append(b.recs, rundir.Record{Type: rundir.TypeSample, Time: at(s.t), Metric: metric, Cgroup: cgroup, Labels: labels(kv...), Value: &v})
	}
	return b
}

// histogram records a cumulative histogram that gained base in the baseline and stress in the
// stress phase.
func (b *builder) histogram(metric, cgroup string, base, stress hist.Log2, kv ...string) *builder {
	for _, s := range []struct {
		t float64
		h hist.Log2
	}{{0, hist.Log2{}}, {10, base}, {30, base.Add(stress)}} {
		h := s.h
		b.recs = append(b.recs, rundir.Record{Type: rundir.TypeSample, Time: at(s.t), Metric: metric, Cgroup: cgroup, Labels: labels(kv...), Hist: &h})
	}
	return b
}

// gauge records one reading per second of a phase, cycling through values.
func (b *builder) gauge(metric, cgroup string, base, stress []float64) *builder {
	for i := range 10 {
		v := base[i%len(base)]
		b.recs = append(b.recs, rundir.Record{Type: rundir.TypeSample, Time: at(float64(i) + 0.5), Metric: metric, Cgroup: cgroup, Value: &v})
	}
	for i := range 20 {
		v := stress[i%len(stress)]
		b.recs = append(b.recs, rundir.Record{Type: rundir.TypeSample, Time: at(10.5 + float64(i)), Metric: metric, Cgroup: cgroup, Value: &v})
	}
	return b
}

// preempted records the victim's waits caused by preemptor: seconds and switches per phase.
func (b *builder) preempted(preemptor string, baseSec, stressSec float64) *builder {
	b.counter(rundir.MetricRunqPreemptWait, victim, baseSec, stressSec, rundir.LabelPreemptor, preemptor)
	return b.counter(rundir.MetricRunqPreemptions, victim, baseSec*1000, stressSec*1000, rundir.LabelPreemptor, preemptor)
}

// open writes the run through rundir.Writer and reads it back.
func (b *builder) open(t *testing.T) *rundir.Run {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "run")
	w, err := rundir.Create(dir, b.meta)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Append(b.recs...); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	run, err := rundir.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	return run
}

func (b *builder) analyze(t *testing.T) *Report {
	t.Helper()
	rep, err := Analyze(b.open(t))
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// lat is n events of d seconds each.
func lat(n uint64, d float64) hist.Log2 {
	ns := uint64(d * 1e9)
	slots := make([]uint64, hist.Slots)
	slots[min(hist.Slots-1, 63-leadingZeros(ns|1))] = n
	return hist.FromSlots(slots, n, n*ns)
}

func leadingZeros(x uint64) int {
	n := 0
	for i := 63; i >= 0 && x&(1<<i) == 0; i-- {
		n++
	}
	return n
}

func ids(rep *Report) []string {
	var out []string
	for _, f := range rep.Findings {
		out = append(out, f.ID)
	}
	return out
}

func finding(t *testing.T, rep *Report, id string) Finding {
	t.Helper()
	for _, f := range rep.Findings {
		if f.ID == id {
			return f
		}
	}
	t.Fatalf("no %s finding; findings: %v", id, ids(rep))
	return Finding{}
}

func evidence(t *testing.T, f Finding, metric, culprit string) Evidence {
	t.Helper()
	for _, e := range f.Evidence {
		if e.Metric == metric && e.Culprit == culprit {
			return e
		}
	}
	t.Fatalf("%s has no %s evidence (culprit %q): %+v", f.ID, metric, culprit, f.Evidence)
	return Evidence{}
}

// cpuBusy is the victim probe slowed by contention: CPU work 0.4 s → 0.72 s.
func cpuBusy(hogs int) *builder {
	wl := []rundir.Workload{victimWorkload()}
	for i := range hogs {
		wl = append(wl, hogWorkload("cpu", i))
	}
	return newRun(wl...).
		histogram(rundir.MetricRunqLatency, victim, lat(1000, 20e-6), lat(2000, 2e-3)).
		gauge(rundir.MetricProbeCPUWork, victim, []float64{0.41, 0.40, 0.42}, []float64{0.70, 0.72, 0.74})
}

func TestCPUContention(t *testing.T) {
	rep := cpuBusy(2).
		preempted(cpuHog0, 0, 1.9).
		preempted(cpuHog1, 0, 1.8).
		preempted("/system.slice/journald.service", 0.002, 0.2). // 5% of what neighbours added: not named
		preempted("/", 0.3, 0.6).                                // 13% of the wait, but no more than in the baseline
		preempted(rundir.CgroupIdle, 0.01, 0.3).
		preempted(victim, 0.001, 0.05).
		analyze(t)

	if got := ids(rep); !reflect.DeepEqual(got, []string{IDCPUContention}) {
		t.Fatalf("findings = %v, want only cpu-contention", got)
	}
	f := rep.Findings[0]
	if want := []string{"cpu-hog-0", "cpu-hog-1"}; !reflect.DeepEqual(f.Culprits, want) {
		t.Errorf("culprits = %v, want %v", f.Culprits, want)
	}
	if f.Victim != "victim" || f.Severity != SeverityWarning {
		t.Errorf("victim %q severity %q, want victim and warning (1.8x)", f.Victim, f.Severity)
	}
	if e := evidence(t, f, "runq_preempt_wait_seconds", "cpu-hog-0"); e.Value != 1.9 || e.Workload != "victim" || e.Phase != "stress" {
		t.Errorf("hog-0 wait evidence = %+v", e)
	}
	if e := evidence(t, f, "runq_preemptions", "cpu-hog-1"); e.Value != 1800 || e.Unit != UnitCount {
		t.Errorf("hog-1 preemptions evidence = %+v", e)
	}
	if e := evidence(t, f, "runq_latency_p99", ""); e.Value/e.Baseline < 50 {
		t.Errorf("run-queue p99 evidence = %+v, want a rise of about 100x", e)
	}
	if e := evidence(t, f, "probe_cpu_work_p50", ""); e.Baseline != 0.41 || e.Value != 0.72 {
		t.Errorf("cpu work evidence = %+v", e)
	}
	for _, want := range []string{"cpu-hog-0 and cpu-hog-1", "1.8x"} {
		if !strings.Contains(f.Summary, want) {
			t.Errorf("summary %q lacks %q", f.Summary, want)
		}
	}
}

func TestCPUContentionSeverityAndCulprits(t *testing.T) {
	// Three hogs, one of them minor; the victim 2.5x slower.
	rep := newRun(victimWorkload(), hogWorkload("cpu", 0), hogWorkload("cpu", 1), hogWorkload("cpu", 2)).
		histogram(rundir.MetricRunqLatency, victim, lat(1000, 50e-6), lat(4000, 4e-3)).
		gauge(rundir.MetricProbeCPUWork, victim, []float64{0.4}, []float64{1.0}).
		preempted(cpuHog0, 0, 1.0).
		preempted(cpuHog1, 0, 6.0).
		preempted(runCg+"/cpu-hog-2", 0, 0.4). // 5.4%
		analyze(t)
	f := finding(t, rep, IDCPUContention)
	if want := []string{"cpu-hog-1", "cpu-hog-0"}; !reflect.DeepEqual(f.Culprits, want) {
		t.Errorf("culprits = %v, want %v ranked by wait", f.Culprits, want)
	}
	if f.Severity != SeverityCritical {
		t.Errorf("severity = %s, want critical for 2.5x", f.Severity)
	}
}

func TestCPUContentionNamesUnknownCgroupsByPath(t *testing.T) {
	rep := cpuBusy(0).preempted("/kubepods/burstable/pod-x", 0, 4).analyze(t)
	if f := finding(t, rep, IDCPUContention); !reflect.DeepEqual(f.Culprits, []string{"/kubepods/burstable/pod-x"}) {
		t.Errorf("culprits = %v", f.Culprits)
	}
}

func TestNoCPUContention(t *testing.T) {
	for name, b := range map[string]*builder{
		// The victim alone: latency and work as in the baseline, a little system noise.
		"quiet": newRun(victimWorkload()).
			histogram(rundir.MetricRunqLatency, victim, lat(1000, 20e-6), lat(2000, 20e-6)).
			gauge(rundir.MetricProbeCPUWork, victim, []float64{0.41, 0.40}, []float64{0.40, 0.42}).
			preempted("/system.slice/journald.service", 0.001, 0.002),
		// Noise doubled the tail, but the work did not slow and nobody waited long.
		"latency_noise_only": newRun(victimWorkload()).
			histogram(rundir.MetricRunqLatency, victim, lat(1000, 10e-6), lat(2000, 40e-6)).
			gauge(rundir.MetricProbeCPUWork, victim, []float64{0.40}, []float64{0.41}).
			preempted("/system.slice/journald.service", 0.001, 0.004),
		// Work and latency rose, but neighbours caused only a few milliseconds of wait.
		"neighbour_wait_negligible": cpuBusy(0).
			preempted("/system.slice/journald.service", 0, 0.004).
			preempted(rundir.CgroupIdle, 0, 0.001),
		// A neighbour preempted it as much in the baseline: it does not explain the rise.
		"steady_neighbour": cpuBusy(0).preempted("/system.slice/build.service", 1, 2),
		// Without the tracer there is nothing to attribute.
		"no_attribution": cpuBusy(2),
	} {
		t.Run(name, func(t *testing.T) {
			if rep := b.analyze(t); len(rep.Findings) != 0 {
				t.Errorf("findings = %+v, want none", rep.Findings)
			}
		})
	}
}

// throttled is a 100m victim that its quota throttles in both phases.
func throttled() *builder {
	v := victimWorkload()
	v.CPU = "100m"
	return newRun(v).
		counter(rundir.MetricCPUPeriods, victim, 100, 200).
		counter(rundir.MetricCPUThrottled, victim, 90, 185).
		counter(rundir.MetricCPUThrottledTime, victim, 8, 17).
		counter(rundir.MetricCPUUsage, victim, 1, 2)
}

func TestCPUThrottling(t *testing.T) {
	// Stress got worse for the victim, but only through its own quota: no contention.
	rep := throttled().
		histogram(rundir.MetricRunqLatency, victim, lat(1000, 30e-3), lat(2000, 80e-3)).
		gauge(rundir.MetricProbeCPUWork, victim, []float64{0.9}, []float64{2.0}).
		preempted(rundir.CgroupThrottled, 7, 16).
		preempted(rundir.CgroupIdle, 0.5, 1).
		preempted(victim, 0.01, 0.05).
		preempted("/system.slice/journald.service", 0.01, 0.05).
		analyze(t)
	if got := ids(rep); !reflect.DeepEqual(got, []string{IDCPUThrottling}) {
		t.Fatalf("findings = %v, want only cpu-throttling", got)
	}
	f := rep.Findings[0]
	if f.Culprits == nil || len(f.Culprits) != 0 {
		t.Errorf("culprits = %#v, want an empty list: nobody but the victim's quota", f.Culprits)
	}
	if f.Severity != SeverityCritical {
		t.Errorf("severity = %s, want critical (8.5 s throttled for 1 s of work)", f.Severity)
	}
	if e := evidence(t, f, "cpu_throttled_period_ratio", ""); e.Baseline != 0.9 || e.Value != 0.925 || e.Phase != "stress" {
		t.Errorf("period ratio evidence = %+v", e)
	}
	if e := evidence(t, f, "cpu_throttled_seconds", ""); e.Baseline != 8 || e.Value != 17 {
		t.Errorf("throttled time evidence = %+v", e)
	}
	for _, want := range []string{"100m", "baseline", "stress"} {
		if !strings.Contains(f.Summary, want) {
			t.Errorf("summary %q lacks %q", f.Summary, want)
		}
	}
}

func TestCPUThrottlingWithNeighbours(t *testing.T) {
	// Throttled and preempted: both findings, each with its own culprits.
	b := throttled()
	b.meta.Workloads = append(b.meta.Workloads, hogWorkload("cpu", 0))
	rep := b.
		histogram(rundir.MetricRunqLatency, victim, lat(1000, 1e-3), lat(2000, 10e-3)).
		gauge(rundir.MetricProbeCPUWork, victim, []float64{0.9}, []float64{2.0}).
		preempted(rundir.CgroupThrottled, 7, 8).
		preempted(cpuHog0, 0, 12).
		analyze(t)
	if got := ids(rep); !reflect.DeepEqual(got, []string{IDCPUThrottling, IDCPUContention}) {
		t.Fatalf("findings = %v", got)
	}
	if c := finding(t, rep, IDCPUContention).Culprits; !reflect.DeepEqual(c, []string{"cpu-hog-0"}) {
		t.Errorf("contention culprits = %v", c)
	}
}

func TestNoCPUThrottling(t *testing.T) {
	for name, b := range map[string]*builder{
		"unlimited": newRun(victimWorkload()).counter(rundir.MetricCPUUsage, victim, 1, 2),
		"rarely_throttled": newRun(victimWorkload()).
			counter(rundir.MetricCPUPeriods, victim, 100, 200).
			counter(rundir.MetricCPUThrottled, victim, 5, 10).
			counter(rundir.MetricCPUThrottledTime, victim, 0.05, 0.1).
			counter(rundir.MetricCPUUsage, victim, 2.4, 4.8),
		"few_periods": newRun(victimWorkload()).
			counter(rundir.MetricCPUPeriods, victim, 2, 2).
			counter(rundir.MetricCPUThrottled, victim, 1, 1).
			counter(rundir.MetricCPUThrottledTime, victim, 0.05, 0.05).
			counter(rundir.MetricCPUUsage, victim, 0.02, 0.02),
	} {
		t.Run(name, func(t *testing.T) {
			if rep := b.analyze(t); len(rep.Findings) != 0 {
				t.Errorf("findings = %v, want none", ids(rep))
			}
		})
	}
}

func TestCPUThrottlingWithoutPhases(t *testing.T) {
	b := throttled()
	b.recs = slices.DeleteFunc(b.recs, func(r rundir.Record) bool { return r.Type == rundir.TypePhase })
	f := finding(t, b.analyze(t), IDCPUThrottling)
	if e := evidence(t, f, "cpu_throttled_seconds", ""); e.Phase != "run" || e.Value != 25 {
		t.Errorf("evidence = %+v, want the whole run's 25 s", e)
	}
}

// diskBusy is the victim's fsync p95 going 0.19 s → 1.1 s with two disk hogs on its device, a
// little root writeback, and a heavy writer on another disk.
func diskBusy(t *testing.T) *builder {
	t.Helper()
	return newRun(victimWorkload(), hogWorkload("disk", 0), hogWorkload("disk", 1)).
		gauge(rundir.MetricProbeFsync, victim, []float64{0.10, 0.11, 0.10, 0.12, 0.19}, []float64{0.10, 0.2, 0.4, 1.1}).
		gauge(rundir.MetricProbeWrite, victim, []float64{0.005}, []float64{0.005}).
		histogram(rundir.MetricFsyncLatency, victim, lat(10, 0.1), lat(20, 0.9), rundir.LabelSyscall, "fsync", rundir.LabelDevice, disk).
		counter(rundir.MetricBlkBytes, victim, 640<<20, 1280<<20, rundir.LabelDevice, disk, rundir.LabelOp, "write").
		counter(rundir.MetricBlkBytes, diskHog+"0", 0, 2<<30, rundir.LabelDevice, disk, rundir.LabelOp, "write").
		counter(rundir.MetricBlkBytes, diskHog+"1", 0, 1900<<20, rundir.LabelDevice, disk, rundir.LabelOp, "write").
		counter(rundir.MetricBlkBytes, "/", 10<<20, 100<<20, rundir.LabelDevice, disk, rundir.LabelOp, "write").
		counter(rundir.MetricBlkBytes, "/steady", 1<<30, 2<<30, rundir.LabelDevice, disk, rundir.LabelOp, "write"). // as in the baseline
		counter(rundir.MetricBlkBytes, "/elsewhere", 0, 8<<30, rundir.LabelDevice, "8:0", rundir.LabelOp, "write")
}

func TestDiskContention(t *testing.T) {
	for name, tc := range map[string]struct {
		queue, service [2]float64 // mean seconds in baseline and stress
		want           string
	}{
		"queue_grew_more":   {queue: [2]float64{100e-6, 20e-3}, service: [2]float64{1e-3, 2e-3}, want: "queue time grew more"},
		"service_grew_more": {queue: [2]float64{100e-6, 150e-6}, service: [2]float64{1e-3, 8e-3}, want: "service time grew more"},
	} {
		t.Run(name, func(t *testing.T) {
			b := diskBusy(t)
			// Two cgroups' requests: the device-wide figures sum them.
			for _, cg := range []string{victim, diskHog + "0"} {
				b.histogram(rundir.MetricBlkQueue, cg, lat(500, tc.queue[0]), lat(500, tc.queue[1]), rundir.LabelDevice, disk, rundir.LabelOp, "write")
				b.histogram(rundir.MetricBlkService, cg, lat(500, tc.service[0]), lat(500, tc.service[1]), rundir.LabelDevice, disk, rundir.LabelOp, "write")
			}
			rep := b.analyze(t)
			if got := ids(rep); !reflect.DeepEqual(got, []string{IDDiskContention}) {
				t.Fatalf("findings = %v, want only disk-contention", got)
			}
			f := rep.Findings[0]
			if want := []string{"disk-hog-0", "disk-hog-1"}; !reflect.DeepEqual(f.Culprits, want) {
				t.Errorf("culprits = %v, want %v (root writeback is under 10%%, /steady adds nothing, 8:0 is another disk)", f.Culprits, want)
			}
			if f.Severity != SeverityCritical {
				t.Errorf("severity = %s, want critical (5.8x)", f.Severity)
			}
			if !strings.Contains(f.Summary, tc.want) {
				t.Errorf("summary %q lacks %q", f.Summary, tc.want)
			}
			if e := evidence(t, f, "probe_fsync_p95", ""); e.Baseline != 0.19 || e.Value != 1.1 {
				t.Errorf("probe evidence = %+v", e)
			}
			if e := evidence(t, f, "blk_bytes", "disk-hog-0"); e.Value != 2<<30 || e.Device != disk || e.Unit != UnitBytes {
				t.Errorf("hog bytes evidence = %+v", e)
			}
			q := evidence(t, f, "blk_queue_mean", "")
			if q.Device != disk || math.Abs(q.Value-tc.queue[1]) > tc.queue[1]*1e-6 {
				t.Errorf("queue evidence = %+v, want device-wide mean %v", q, tc.queue[1])
			}
		})
	}
}

func TestDiskContentionFindsDeviceFromTracer(t *testing.T) {
	b := diskBusy(t)
	b.meta.Workloads[0].Device = ""
	f := finding(t, b.analyze(t), IDDiskContention)
	if e := evidence(t, f, "blk_bytes", "disk-hog-1"); e.Device != disk {
		t.Errorf("device = %q, want %s from the victim's fsync histogram", e.Device, disk)
	}
}

func TestNoDiskContention(t *testing.T) {
	for name, b := range map[string]*builder{
		"quiet": newRun(victimWorkload()).
			gauge(rundir.MetricProbeFsync, victim, []float64{0.10, 0.19}, []float64{0.11, 0.18}).
			counter(rundir.MetricBlkBytes, victim, 640<<20, 1280<<20, rundir.LabelDevice, disk, rundir.LabelOp, "write"),
		"neighbours_on_another_disk": newRun(victimWorkload(), hogWorkload("disk", 0)).
			gauge(rundir.MetricProbeFsync, victim, []float64{0.1}, []float64{0.5}).
			counter(rundir.MetricBlkBytes, diskHog+"0", 0, 4<<30, rundir.LabelDevice, "8:0", rundir.LabelOp, "write"),
		"rise_too_small_to_matter": newRun(victimWorkload(), hogWorkload("disk", 0)).
			gauge(rundir.MetricProbeFsync, victim, []float64{0.001}, []float64{0.004}).
			counter(rundir.MetricBlkBytes, diskHog+"0", 0, 4<<30, rundir.LabelDevice, disk, rundir.LabelOp, "write"),
		"device_mostly_served_the_victim": newRun(victimWorkload()).
			gauge(rundir.MetricProbeFsync, victim, []float64{0.03}, []float64{0.07}).
			counter(rundir.MetricBlkBytes, victim, 512<<20, 1024<<20, rundir.LabelDevice, disk, rundir.LabelOp, "write").
			counter(rundir.MetricBlkBytes, "/", 0, 18<<20, rundir.LabelDevice, disk, rundir.LabelOp, "write"),
		"neighbour_only_discarded": newRun(victimWorkload(), hogWorkload("disk", 0)).
			gauge(rundir.MetricProbeFsync, victim, []float64{0.1}, []float64{0.5}).
			counter(rundir.MetricBlkBytes, diskHog+"0", 0, 4<<30, rundir.LabelDevice, disk, rundir.LabelOp, "discard"),
		"neighbours_wrote_little": newRun(victimWorkload()).
			gauge(rundir.MetricProbeFsync, victim, []float64{0.1}, []float64{0.5}).
			counter(rundir.MetricBlkBytes, "/system.slice/journald.service", 1<<20, 2<<20, rundir.LabelDevice, disk, rundir.LabelOp, "write"),
	} {
		t.Run(name, func(t *testing.T) {
			if rep := b.analyze(t); len(rep.Findings) != 0 {
				t.Errorf("findings = %+v, want none", rep.Findings)
			}
		})
	}
}

func TestSummaryTable(t *testing.T) {
	b := diskBusy(t).
		counter(rundir.MetricCPUUsage, victim, 2.5, 5).
		histogram(rundir.MetricRunqLatency, victim, lat(100, 1e-3), lat(100, 8e-3))
	rep := b.analyze(t)
	var base, stress *WorkloadPhase
	for i, wp := range rep.Summary.Workloads {
		if wp.Workload == "victim" && wp.Phase == "baseline" {
			base = &rep.Summary.Workloads[i]
		}
		if wp.Workload == "victim" && wp.Phase == "stress" {
			stress = &rep.Summary.Workloads[i]
		}
	}
	if base == nil || stress == nil || base.Probe == nil || stress.Probe == nil {
		t.Fatalf("victim rows missing: %+v", rep.Summary.Workloads)
	}
	if got := len(rep.Summary.Workloads); got != 6 {
		t.Errorf("%d workload rows, want 3 workloads x 2 phases", got)
	}
	if base.CPUCores != 0.25 || stress.CPUCores != 0.25 || base.Seconds != 10 || stress.Seconds != 20 {
		t.Errorf("cpu cores %v/%v over %v/%v s, want 0.25 in both", base.CPUCores, stress.CPUCores, base.Seconds, stress.Seconds)
	}
	if base.Probe.Iterations != 10 || stress.Probe.Iterations != 20 {
		t.Errorf("iterations = %d/%d", base.Probe.Iterations, stress.Probe.Iterations)
	}
	// write (5 ms) + fsync of the same iteration.
	if got, want := stress.Probe.WriteFsyncP95, 1.105; math.Abs(got-want) > 1e-9 {
		t.Errorf("stress write+fsync p95 = %v, want %v", got, want)
	}
	if got, want := base.Probe.WriteFsyncP50, 0.115; math.Abs(got-want) > 1e-9 {
		t.Errorf("baseline write+fsync p50 = %v, want %v", got, want)
	}
	if base.IOBytes != 640<<20 || stress.RunqWait != 0.8 {
		t.Errorf("io bytes %v, runq wait %v", base.IOBytes, stress.RunqWait)
	}
	if rk := rep.Summary.Ranking; rk.Window != "stress" || rk.IOBytes[0].Cgroup != "/elsewhere" || rk.IOBytes[1].Workload != "disk-hog-0" {
		t.Errorf("ranking = %+v", rk)
	}
}

func TestRecordModeRanking(t *testing.T) {
	b := &builder{meta: rundir.Meta{ID: "rec", Scenario: "record", Start: at(-1)}}
	for i := range 12 {
		cg := fmt.Sprintf("/kubepods/pod-%02d", i)
		b.histogram(rundir.MetricRunqLatency, cg, hist.Log2{}, lat(100, float64(i+1)*1e-3))
		b.histogram(rundir.MetricFsyncLatency, cg, hist.Log2{}, lat(uint64(i+1), float64(int(1)<<(12-i))*1e-5), rundir.LabelDevice, disk)
		b.counter(rundir.MetricBlkBytes, cg, 0, float64(i)*(1<<20), rundir.LabelDevice, disk, rundir.LabelOp, "write")
	}
	rep := b.analyze(t)
	if len(rep.Findings) != 0 || rep.Findings == nil {
		t.Errorf("findings = %#v, want an empty list", rep.Findings)
	}
	rk := rep.Summary.Ranking
	if rk.Window != "run" || len(rk.RunqWait) != 10 || len(rk.Fsync) != 10 || len(rk.IOBytes) != 10 {
		t.Fatalf("ranking = %+v, want the whole run, 10 each", rk)
	}
	if rk.RunqWait[0].Cgroup != "/kubepods/pod-11" || rk.RunqWait[0].Count != 100 || rk.RunqWait[9].Cgroup != "/kubepods/pod-02" {
		t.Errorf("run-queue ranking = %+v", rk.RunqWait)
	}
	if rk.Fsync[0].Cgroup != "/kubepods/pod-00" || rk.Fsync[0].Count != 1 {
		t.Errorf("fsync ranking = %+v", rk.Fsync)
	}
	if rk.IOBytes[0].Cgroup != "/kubepods/pod-11" || rk.IOBytes[0].Value != 11<<20 {
		t.Errorf("io ranking = %+v", rk.IOBytes)
	}
	if len(rep.Summary.Phases) != 1 || rep.Summary.Phases[0].Name != "run" {
		t.Errorf("phases = %+v", rep.Summary.Phases)
	}
}

func TestCulprits(t *testing.T) {
	for name, tc := range map[string]struct {
		in   []share
		want []string
	}{
		"two_equal":         {in: []share{{"b", 5}, {"a", 5}}, want: []string{"a", "b"}},
		"minor_left_out":    {in: []share{{"a", 10}, {"minor", 1}, {"b", 9}}, want: []string{"a", "b"}},
		"crowd_names_top":   {in: []share{{"a", 1}, {"b", 1.2}, {"c", 1}, {"d", 1}, {"e", 1}, {"f", 1}, {"g", 1}, {"h", 1}, {"i", 1}, {"j", 1}, {"k", 1}}, want: []string{"b"}},
		"zero_is_not_named": {in: []share{{"a", 0}}, want: nil},
	} {
		t.Run(name, func(t *testing.T) {
			var got []string
			for _, s := range culprits(tc.in) {
				got = append(got, s.cgroup)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("culprits = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestWriteFsyncPairsIterations(t *testing.T) {
	rec := func(sec, v float64) rundir.Record { return rundir.Record{Time: at(sec), Value: &v} }
	writes := []rundir.Record{rec(1, 0.01), rec(2, 0.02), rec(2.5, 0.025), rec(4, 0.04)}
	fsyncs := []rundir.Record{rec(1, 0.1), rec(3, 0.3), rec(3.5, 0.35), rec(4, 0.4)}
	// 2 s's write was superseded by 2.5 s's; 3.5 s's fsync has no write of its own.
	if got, want := writeFsync(writes, fsyncs), []float64{0.11, 0.325, 0.44}; !reflect.DeepEqual(got, want) {
		t.Errorf("writeFsync = %v, want %v", got, want)
	}
}

func TestQuantile(t *testing.T) {
	v := []float64{5, 1, 4, 2, 3, 6, 7, 8, 9, 10}
	for q, want := range map[float64]float64{0: 1, 0.5: 5, 0.95: 10, 0.9: 9, 1: 10} {
		if got := quantile(v, q); got != want {
			t.Errorf("quantile(%v) = %v, want %v", q, got, want)
		}
	}
	if quantile(nil, 0.5) != 0 {
		t.Error("quantile of nothing is not 0")
	}
}

func TestNotesSayWhatTheRunMisses(t *testing.T) {
	b := newRun(victimWorkload())
	b.meta.Tracer = map[string]string{"runq": "attached", "fsync": "tracefs is not mounted"}
	b.counter(rundir.MetricBPFDrops, "", 0, 12, rundir.LabelProgram, "blkio", rundir.LabelReason, "inflight_full")
	b.counter(rundir.MetricBPFDrops, "", 0, 0, rundir.LabelProgram, "runq", rundir.LabelReason, "latency_map_full")
	rep := b.analyze(t)
	if len(rep.Notes) != 2 {
		t.Fatalf("notes = %q, want the unattached fsync program and blkio's 12 drops", rep.Notes)
	}
	if !strings.Contains(rep.Notes[0], "fsync did not attach (tracefs is not mounted)") ||
		!strings.Contains(rep.Notes[1], "blkio dropped 12 events (inflight_full)") {
		t.Errorf("notes = %q", rep.Notes)
	}
}
