package analyzer

import (
	"bytes"
	"encoding/json"
	"maps"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

func diff(t *testing.T, a, b *builder) *DiffReport {
	t.Helper()
	d, err := Diff(a.open(t), b.open(t))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func workloadDiff(t *testing.T, d *DiffReport, name string) WorkloadDiff {
	t.Helper()
	for _, wd := range d.Workloads {
		if wd.Workload == name {
			return wd
		}
	}
	t.Fatalf("no workload %s in the diff: %+v", name, d.Workloads)
	return WorkloadDiff{}
}

func metricDiff(wd WorkloadDiff, metric string) (MetricDiff, bool) {
	i := slices.IndexFunc(wd.Metrics, func(m MetricDiff) bool { return m.Metric == metric })
	if i < 0 {
		return MetricDiff{}, false
	}
	return wd.Metrics[i], true
}

// pair says a metric's sides and ratio, rounded to 6 decimals, "-" for an absent one.
func pair(m MetricDiff) string {
	f := func(v *float64) string {
		if v == nil {
			return "-"
		}
		return strconv.FormatFloat(math.Round(*v*1e6)/1e6, 'f', -1, 64)
	}
	return f(m.A) + " " + f(m.B) + " " + f(m.Ratio)
}

// unlimitedHogs is the noisy scenario with two unlimited CPU hogs: contention.
func unlimitedHogs() *builder {
	return cpuBusy(2).
		preempted(cpuHog0, 0, 1.9).
		preempted(cpuHog1, 0, 1.8).
		counter(rundir.MetricCPUUsage, cpuHog0, 0, 20).
		counter(rundir.MetricCPUUsage, cpuHog1, 0, 20)
}

// limitedHog is the same victim next to one hog at cpu=500m, which its quota throttles.
func limitedHog() *builder {
	hog := hogWorkload("cpu", 0)
	hog.CPU = "500m"
	b := newRun(victimWorkload(), hog).
		histogram(rundir.MetricRunqLatency, victim, lat(1000, 20e-6), lat(2000, 40e-6)).
		gauge(rundir.MetricProbeCPUWork, victim, []float64{0.41, 0.40, 0.42}, []float64{0.41, 0.40, 0.42}).
		counter(rundir.MetricCPUUsage, cpuHog0, 0, 10).
		counter(rundir.MetricCPUPeriods, cpuHog0, 0, 200).
		counter(rundir.MetricCPUThrottled, cpuHog0, 0, 100).
		counter(rundir.MetricCPUThrottledTime, cpuHog0, 0, 10)
	b.meta.ID = "r2"
	return b
}

func TestDiffUnlimitedVsLimitedHogs(t *testing.T) {
	d := diff(t, unlimitedHogs(), limitedHog())
	if d.A.Run.ID != "r1" || d.B.Run.ID != "r2" || d.A.Window.Name != "stress" || d.B.Window.Name != "stress" {
		t.Errorf("runs %+v / %+v, want r1 and r2 compared over their stress phases", d.A, d.B)
	}
	var names []string
	for _, wd := range d.Workloads {
		names = append(names, wd.Workload+":"+wd.In)
	}
	if want := []string{"victim:", "cpu-hog-0:", "cpu-hog-1:a"}; !reflect.DeepEqual(names, want) {
		t.Errorf("workloads = %v, want %v", names, want)
	}

	v := workloadDiff(t, d, "victim")
	for metric, want := range map[string]string{
		"cpu_work_p50_seconds": "0.72 0.41 0.569444",
		"cpu_work_p95_seconds": "0.74 0.42 0.567568",
		"throttled_seconds":    "0 0 -", // zero baseline: no ratio
	} {
		if m, ok := metricDiff(v, metric); !ok || pair(m) != want {
			t.Errorf("victim %s = %s, want %s", metric, pair(m), want)
		}
	}
	if m, _ := metricDiff(v, "runq_p99_seconds"); m.Ratio == nil || *m.Ratio > 0.1 {
		t.Errorf("victim run-queue p99 = %s, want B about 100x below A", pair(m))
	}
	for _, metric := range []string{"fsync_p95_seconds", "write_fsync_p95_seconds"} {
		if m, ok := metricDiff(v, metric); ok {
			t.Errorf("victim has %s = %s, but no run measured it", metric, pair(m))
		}
	}

	hog := workloadDiff(t, d, "cpu-hog-0")
	for metric, want := range map[string]string{
		"cpu_cores":         "1 0.5 0.5",
		"throttled_seconds": "0 10 -",
		"throttled_ratio":   "0 0.5 -",
	} {
		if m, ok := metricDiff(hog, metric); !ok || pair(m) != want {
			t.Errorf("cpu-hog-0 %s = %s, want %s", metric, pair(m), want)
		}
	}
	if _, ok := metricDiff(hog, "cpu_work_p50_seconds"); ok {
		t.Error("a hog has probe timings")
	}

	gone := workloadDiff(t, d, "cpu-hog-1")
	if m, ok := metricDiff(gone, "cpu_cores"); !ok || pair(m) != "1 - -" {
		t.Errorf("cpu-hog-1, only in A: cpu cores = %s, want A only", pair(m))
	}

	if want := []FindingChange{{ID: IDCPUContention, Victim: "victim", In: SideA}}; !reflect.DeepEqual(d.FindingsChanged, want) {
		t.Errorf("findings changed = %+v, want cpu-contention gone", d.FindingsChanged)
	}
	if len(d.A.Findings) != 1 || len(d.B.Findings) != 0 || d.B.Findings == nil {
		t.Errorf("findings A %v, B %#v", d.A.Findings, d.B.Findings)
	}
	if len(d.Notes) != 0 {
		t.Errorf("notes = %q, want none for alike windows", d.Notes)
	}
}

func TestDiffFindingsAppearedAndKept(t *testing.T) {
	quiet := newRun(victimWorkload(), hogWorkload("disk", 0), hogWorkload("disk", 1)).
		gauge(rundir.MetricProbeFsync, victim, []float64{0.10, 0.19}, []float64{0.11, 0.18}).
		gauge(rundir.MetricProbeWrite, victim, []float64{0.005}, []float64{0.005})
	throttledBoth := func(b *builder) *builder {
		return b.counter(rundir.MetricCPUPeriods, victim, 100, 200).
			counter(rundir.MetricCPUThrottled, victim, 90, 185).
			counter(rundir.MetricCPUThrottledTime, victim, 8, 17).
			counter(rundir.MetricCPUUsage, victim, 1, 2)
	}
	d := diff(t, throttledBoth(quiet), throttledBoth(diskBusy(t)))
	if want := []FindingChange{{ID: IDDiskContention, Victim: "victim", In: SideB}}; !reflect.DeepEqual(d.FindingsChanged, want) {
		t.Errorf("findings changed = %+v, want disk-contention appeared and cpu-throttling in both", d.FindingsChanged)
	}
	v := workloadDiff(t, d, "victim")
	// The probe's fsync p95 (1.1 s), not the tracer's histogram, and each iteration's write too.
	for metric, want := range map[string]string{
		"fsync_p95_seconds":       "0.18 1.1 6.111111",
		"write_fsync_p95_seconds": "0.185 1.105 5.972973",
		"throttled_seconds":       "17 17 1",
	} {
		if m, ok := metricDiff(v, metric); !ok || pair(m) != want {
			t.Errorf("victim %s = %s, want %s", metric, pair(m), want)
		}
	}
}

// recorded is a record-mode run: no workloads, no phases, the cgroups' own activity.
func recorded(id string, pods map[string]float64) *builder {
	b := &builder{meta: rundir.Meta{ID: id, Scenario: "record", Start: at(-1)}}
	for _, cg := range slices.Sorted(maps.Keys(pods)) {
		b.histogram(rundir.MetricFsyncLatency, cg, hist.Log2{}, lat(10, pods[cg]), rundir.LabelDevice, disk)
		b.counter(rundir.MetricBlkBytes, cg, 0, 1<<20, rundir.LabelDevice, disk, rundir.LabelOp, "write")
	}
	return b
}

func TestDiffRecordModeMatchesCgroups(t *testing.T) {
	d := diff(t,
		recorded("rec-a", map[string]float64{"/kubepods/pod-b": 0.004, "/kubepods/pod-a": 0.1}),
		recorded("rec-b", map[string]float64{"/kubepods/pod-a": 0.01, "/kubepods/pod-c": 0.004}))
	var names []string
	for _, wd := range d.Workloads {
		names = append(names, wd.Workload+":"+wd.In)
	}
	if want := []string{"/kubepods/pod-a:", "/kubepods/pod-b:a", "/kubepods/pod-c:b"}; !reflect.DeepEqual(names, want) {
		t.Errorf("workloads = %v, want every ranked cgroup by path", names)
	}
	if d.A.Window.Name != "run" || len(d.Notes) != 0 {
		t.Errorf("window %q, notes %q: want whole runs, alike", d.A.Window.Name, d.Notes)
	}
	// No probe: the tracer's fsync histogram decides (bucket midpoints, so only the ratio's scale).
	m, ok := metricDiff(workloadDiff(t, d, "/kubepods/pod-a"), "fsync_p95_seconds")
	if !ok || m.Ratio == nil || *m.Ratio > 0.2 || *m.Ratio < 0.05 {
		t.Errorf("pod-a traced fsync p95 = %s, want B about a tenth of A", pair(m))
	}
	if m, _ := metricDiff(workloadDiff(t, d, "/kubepods/pod-c"), "io_bytes"); pair(m) != "- 1048576 -" {
		t.Errorf("pod-c block I/O = %s, want B only", pair(m))
	}
}

func TestDiffZeroBaselinesStayValidJSON(t *testing.T) {
	a := newRun(victimWorkload()).
		gauge(rundir.MetricProbeCPUWork, victim, []float64{0.4}, []float64{0.4})
	b := newRun(victimWorkload()).
		gauge(rundir.MetricProbeCPUWork, victim, []float64{0.4}, []float64{0.5}).
		histogram(rundir.MetricRunqLatency, victim, lat(10, 1e-3), lat(10, 1e-3)).
		counter(rundir.MetricCPUUsage, victim, 1, 2)
	d := diff(t, a, b)
	v := workloadDiff(t, d, "victim")
	for metric, want := range map[string]string{
		"runq_wait_seconds": "0 0.01 -", // from nothing: no ratio, not +Inf
		"cpu_cores":         "0 0.1 -",
		"io_bytes":          "0 0 -",
	} {
		if m, ok := metricDiff(v, metric); !ok || pair(m) != want {
			t.Errorf("victim %s = %s, want %s", metric, pair(m), want)
		}
	}
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(d); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Workloads []struct {
			Metrics []map[string]any `json:"metrics"`
		} `json:"workloads"`
		FindingsChanged []any `json:"findings_changed"`
	}
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatalf("diff JSON does not decode: %v\n%s", err, buf.String())
	}
	for _, m := range doc.Workloads[0].Metrics {
		if _, has := m["ratio"]; has && m["metric"] == "runq_wait_seconds" {
			t.Errorf("runq wait from zero carries a ratio: %v", m)
		}
	}
	if doc.FindingsChanged == nil {
		t.Error("findings_changed is null, want an empty list")
	}
	if got := diffValue(anyRow(func(WorkloadPhase) float64 { return math.Inf(1) }), WorkloadPhase{}, true); got != nil {
		t.Errorf("an infinite measure = %v, want absent", *got)
	}
}

func TestDiffNotesUnalikeWindows(t *testing.T) {
	long := unlimitedHogs()
	long.recs = slices.DeleteFunc(long.recs, func(r rundir.Record) bool { return r.Type == rundir.TypePhase })
	d := diff(t, unlimitedHogs(), long)
	if d.B.Window.Name != "run" || len(d.Notes) != 2 ||
		!strings.Contains(d.Notes[0], "stress window and run B over its run window") ||
		!strings.Contains(d.Notes[1], "A 20.00s, B 31.00s") {
		t.Errorf("window %q, notes %q", d.B.Window.Name, d.Notes)
	}
	if d.B.Run.ID != "r1" || d.B.Window.Seconds() != 31 {
		t.Errorf("B %+v over %s, want run r1 over its 31 s", d.B.Run, d.B.Window.Name)
	}
}

// The diff of an unlimited and a limited hog, as its text shows it (report.DiffText): each
// side's measures and their ratio, a workload of one run only, the finding that went.
func TestDiffSides(t *testing.T) {
	d := diff(t, unlimitedHogs(), limitedHog())
	if d.A.Run.ID != "r1" || d.A.Window.Name != "stress" || d.A.Window.Seconds() != 20 {
		t.Errorf("A %+v over %s %gs, want run r1 over its 20 s stress phase", d.A.Run, d.A.Window.Name, d.A.Window.Seconds())
	}
	for _, c := range []struct{ workload, metric, want string }{
		{"victim", "cpu_work_p50_seconds", "0.72 0.41 0.569444"},
		{"cpu-hog-0", "cpu_cores", "1 0.5 0.5"},
		{"cpu-hog-0", "throttled_seconds", "0 10 -"},
	} {
		if m, ok := metricDiff(workloadDiff(t, d, c.workload), c.metric); !ok || pair(m) != c.want {
			t.Errorf("%s %s = %s, want %s", c.workload, c.metric, pair(m), c.want)
		}
	}
	if m, ok := metricDiff(workloadDiff(t, d, "victim"), "runq_p99_seconds"); !ok || m.Ratio == nil || *m.Ratio > 0.1 {
		t.Errorf("victim run-queue p99 = %s, want B a small share of A", pair(m))
	}
	if m, ok := metricDiff(workloadDiff(t, d, "victim"), "write_fsync_p50_seconds"); ok && (m.A != nil && *m.A != 0 || m.B != nil && *m.B != 0) {
		t.Errorf("victim write+fsync = %s, want nothing measured in either run", pair(m))
	}
	if hog1 := workloadDiff(t, d, "cpu-hog-1"); hog1.In != SideA {
		t.Errorf("cpu-hog-1 in %q, want run A only", hog1.In)
	}
	if !slices.ContainsFunc(d.FindingsChanged, func(c FindingChange) bool { return c.ID == IDCPUContention && c.In == SideA }) {
		t.Errorf("findings changed %+v, want cpu-contention in A only", d.FindingsChanged)
	}
}

func TestDiffNeedsTwoRuns(t *testing.T) {
	if _, err := Diff(nil, newRun().open(t)); err == nil {
		t.Error("Diff with no run A succeeded")
	}
}
