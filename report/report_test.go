package report

import (
	"bytes"
	"encoding/xml"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodectl/nodectl/analyzer"
	"github.com/nodectl/nodectl/internal/browsertest"
	"github.com/nodectl/nodectl/rundir"
)

// noisyRun writes a small noisy run in the run format: a victim whose probe slows in the
// stress phase, its run-queue wait charged to two hogs, and the node's memory PSI.
func noisyRun(t *testing.T) *rundir.Run {
	t.Helper()
	start := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	meta := rundir.Meta{Format: rundir.FormatVersion, ID: "noisy-test", Scenario: rundir.ScenarioNoisy, Node: "n1", Kernel: "6.18",
		Start: start, Interval: rundir.Duration(time.Second), Workloads: []rundir.Workload{
			{Name: "victim", Kind: rundir.KindVictim, Cgroup: "/nodectl/r/victim"},
			{Name: "hog-cpu-0", Kind: rundir.KindCPU, Cgroup: "/nodectl/r/hog-cpu-0"},
			{Name: "hog-cpu-1", Kind: rundir.KindCPU, Cgroup: "/nodectl/r/hog-cpu-1"}}}
	at := func(s int) time.Time { return start.Add(time.Duration(s) * time.Second) }
	val := func(v float64) *float64 { return &v }
	recs := []rundir.Record{{Type: rundir.TypePhase, Time: at(0), Name: "baseline", Event: rundir.EventStart}}
	for s := 0; s <= 20; s++ {
		if s == 10 {
			recs = append(recs, rundir.Record{Type: rundir.TypePhase, Time: at(10), Name: "baseline", Event: rundir.EventEnd},
				rundir.Record{Type: rundir.TypePhase, Time: at(10), Name: "stress", Event: rundir.EventStart})
		}
		work := 0.010
		hog0, hog1 := 0.0, 0.0
		if s > 10 {
			work = 0.030
			hog0, hog1 = 0.3*float64(s-10), 0.1*float64(s-10)
		}
		recs = append(recs,
			rundir.Record{Type: rundir.TypeSample, Time: at(s), Metric: rundir.MetricProbeCPUWork, Cgroup: "/nodectl/r/victim", Workload: "victim", Value: val(work)},
			rundir.Record{Type: rundir.TypeSample, Time: at(s), Metric: rundir.MetricRunqPreemptWait, Cgroup: "/nodectl/r/victim",
				Labels: map[string]string{rundir.LabelPreemptor: "/nodectl/r/hog-cpu-0"}, Value: val(hog0)},
			rundir.Record{Type: rundir.TypeSample, Time: at(s), Metric: rundir.MetricRunqPreemptWait, Cgroup: "/nodectl/r/victim",
				Labels: map[string]string{rundir.LabelPreemptor: "/nodectl/r/hog-cpu-1"}, Value: val(hog1)},
			rundir.Record{Type: rundir.TypeSample, Time: at(s), Metric: rundir.MetricSystemPressure,
				Labels: map[string]string{rundir.LabelResource: "memory", rundir.LabelKind: "full"}, Value: val(0.05 * float64(s))})
	}
	recs = append(recs, rundir.Record{Type: rundir.TypePhase, Time: at(20), Name: "stress", Event: rundir.EventEnd})
	return writeRun(t, meta, recs)
}

// writeRun writes a run directory of meta and recs, and opens it.
func writeRun(t *testing.T, meta rundir.Meta, recs []rundir.Record) *rundir.Run {
	t.Helper()
	dir := t.TempDir()
	w, err := rundir.Create(dir, meta)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Append(recs...); err != nil {
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

// chartData reads every chart of a page back: bar values by chart/category/series, and line
// points by chart/series.
func chartData(t *testing.T, html string) (bars map[string]float64, lines map[string]string) {
	t.Helper()
	bars, lines = map[string]float64{}, map[string]string{}
	for _, m := range regexp.MustCompile(`(?s)<svg class="chart".*?</svg>`).FindAllString(html, -1) {
		var root struct {
			ID   string `xml:"id,attr"`
			Rect []struct {
				Series   string `xml:"data-series,attr"`
				Category string `xml:"data-category,attr"`
				Value    string `xml:"data-value,attr"`
			} `xml:"rect"`
			Polyline []struct {
				Series string `xml:"data-series,attr"`
				Points string `xml:"data-points,attr"`
			} `xml:"polyline"`
		}
		if err := xml.Unmarshal([]byte(m), &root); err != nil {
			t.Fatalf("a chart is not well-formed: %v\n%s", err, m)
		}
		for _, r := range root.Rect {
			if r.Value == "" {
				continue
			}
			v, err := strconv.ParseFloat(r.Value, 64)
			if err != nil {
				t.Fatal(err)
			}
			bars[root.ID+"/"+r.Category+"/"+r.Series] = v
		}
		for _, p := range root.Polyline {
			lines[root.ID+"/"+p.Series] = p.Points
		}
	}
	return bars, lines
}

// A noisy run's report: the victim's run-queue wait per phase by culprit, named by workload,
// equals the counters' growth; the probe's timings are drawn as recorded; PSI is a share.
func TestNoisyReportChartsTheRun(t *testing.T) {
	run := noisyRun(t)
	rep, err := analyzer.Analyze(run)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := FromRun(run, rep).Write(&buf); err != nil {
		t.Fatal(err)
	}
	html := buf.String()
	bars, lines := chartData(t, html)
	for k, want := range map[string]float64{
		"culprits-victim/stress/hog-cpu-0":   3.0,
		"culprits-victim/stress/hog-cpu-1":   1.0,
		"culprits-victim/baseline/hog-cpu-0": 0,
	} {
		if got, ok := bars[k]; !ok || abs(got-want) > 1e-9 {
			t.Errorf("%s = %v (present %v), want %v", k, got, ok, want)
		}
	}
	probe := lines["probe-victim/"+rundir.MetricProbeCPUWork]
	if !strings.HasPrefix(probe, "0,0.01 1,0.01") || !strings.HasSuffix(probe, "20,0.03") {
		t.Errorf("probe points %q", probe)
	}
	psi := lines["psi/memory full"]
	if !strings.Contains(psi, "1,0.05") {
		t.Errorf("memory PSI full points %q: want 5%% a second", psi)
	}
	for _, forbidden := range []string{"<script", "http://", "https://", "src=", "@import", "url("} {
		if strings.Contains(strings.ReplaceAll(html, `xmlns="http://www.w3.org/2000/svg"`, ""), forbidden) {
			t.Errorf("the page holds %q: it must open offline with nothing fetched", forbidden)
		}
	}
}

// A wake report's stacked bars split each limit's median wake by its throttled share.
func TestWakeReportSplitsTheThrottledShare(t *testing.T) {
	rep := &analyzer.Report{Run: analyzer.RunInfo{ID: "w", Scenario: rundir.ScenarioWake},
		Limits: []analyzer.WakeLimit{{CPU: "50m", WakeP50: 8, WakeP95: 10, ThrottledShare: 0.75}, {CPU: "1", WakeP50: 1.2, WakeP95: 1.5}}}
	var buf bytes.Buffer
	if err := FromRun(&rundir.Run{}, rep).Write(&buf); err != nil {
		t.Fatal(err)
	}
	bars, _ := chartData(t, buf.String())
	for k, want := range map[string]float64{
		"wake-per-limit/50m/throttled": 6, "wake-per-limit/50m/not throttled": 2,
		"wake-per-limit/1/throttled": 0, "wake-per-limit/1/not throttled": 1.2,
		"wake-p50-p95/50m/p95": 10,
	} {
		if got := bars[k]; abs(got-want) > 1e-9 {
			t.Errorf("%s = %v, want %v", k, got, want)
		}
	}
}

func abs(v float64) float64 {
	if v < 0 {
		return -v
	}
	return v
}

// The report as a browser shows it: Chromium opens it with no console error and no request of
// any kind, draws every bar the analysis has (read back from the page), and follows dark mode.
func TestReportRendersInChromium(t *testing.T) {
	run := noisyRun(t)
	rep, err := analyzer.Analyze(run)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "report.html")
	if err := WriteFile(file, FromRun(run, rep)); err != nil {
		t.Fatal(err)
	}
	page := browsertest.Open(t, file, "report-noisy")
	for _, p := range page.Problems {
		t.Errorf("chromium: %s", p)
	}
	if got := page.Bars["culprits-victim/stress/hog-cpu-0"]; got != 3 {
		t.Errorf("the page's bar of hog-cpu-0 in stress holds %v, want 3 (bars %v)", got, page.Bars)
	}
	if len(page.Flat) > 0 {
		t.Errorf("bars drawn with no height: %v", page.Flat)
	}
	if page.Light == page.Dark {
		t.Errorf("background %s in light and dark mode: want the page to follow the reader's mode", page.Light)
	}
	if !bytes.HasPrefix(page.PDF, []byte("%PDF")) || len(page.PDF) < 4096 {
		t.Errorf("printing gave %d bytes, not a PDF of the page", len(page.PDF))
	}
}

// Two runs compared: each run's charts side by side under ids of their own side, the same
// numbers as each run's own report.
func TestDiffReportSideBySide(t *testing.T) {
	a, b := noisyRun(t), noisyRun(t)
	d, err := analyzer.Diff(a, b)
	if err != nil {
		t.Fatal(err)
	}
	page, err := FromDiff(a, b, d)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := page.Write(&buf); err != nil {
		t.Fatal(err)
	}
	bars, _ := chartData(t, buf.String())
	for _, side := range []string{"a-", "b-"} {
		if got := bars[side+"culprits-victim/stress/hog-cpu-0"]; got != 3 {
			t.Errorf("%sculprits-victim stress hog-cpu-0 = %v, want 3", side, got)
		}
	}
	if strings.Count(buf.String(), `id="culprits-victim"`) != 0 {
		t.Errorf("a chart keeps its unprefixed id: the two sides' ids collide")
	}
}

// A window of the flight recorder (a post-mortem) charts the node's Lease: each renewal's gap
// at the time the agent saw it, the OOM kill marked where it happened.
func TestIncidentTimeline(t *testing.T) {
	start := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return start.Add(time.Duration(s) * time.Second) }
	recs := []rundir.Record{
		rundir.LeaseRenewal{RenewTime: at(10), Gap: 10 * time.Second, LeaseDuration: 40 * time.Second}.Record(at(10), "/system.slice/kubelet.service"),
		rundir.LeaseRenewal{RenewTime: at(35), Gap: 25 * time.Second, LeaseDuration: 40 * time.Second}.Record(at(35), "/system.slice/kubelet.service"),
		{Type: rundir.TypeEvent, Time: at(30), Name: rundir.EventOOMKill, Cgroup: "/kubepods/pod1/c1"},
		{Type: rundir.TypePhase, Time: at(0), Name: "baseline", Event: rundir.EventStart},
		{Type: rundir.TypePhase, Time: at(20), Name: "baseline", Event: rundir.EventEnd},
		{Type: rundir.TypePhase, Time: at(20), Name: "incident", Event: rundir.EventStart},
		{Type: rundir.TypePhase, Time: at(40), Name: "incident", Event: rundir.EventEnd},
	}
	run := writeRun(t, rundir.Meta{Format: rundir.FormatVersion, ID: "w", Scenario: rundir.ScenarioAgent, Start: start, Interval: rundir.Duration(time.Second)}, recs)
	var buf bytes.Buffer
	if err := FromRun(run, &analyzer.Report{Run: analyzer.RunInfo{Scenario: rundir.ScenarioAgent}}).Write(&buf); err != nil {
		t.Fatal(err)
	}
	_, lines := chartData(t, buf.String())
	if got := lines["lease-gaps/gap since the previous renewal"]; got != "10,10 35,25" {
		t.Errorf("lease gaps %q, want 10 s at 10 and 25 s at 35", got)
	}
	if !strings.Contains(buf.String(), `data-mark="OOM kill" data-x="30"`) {
		t.Errorf("no OOM kill marked at 30 s")
	}
}

// A density report draws each step's readiness at its density and marks the collapse; a storm
// report draws each writer's time to durable in each storm.
func TestDensityAndStormReadBack(t *testing.T) {
	density := &analyzer.Report{Run: analyzer.RunInfo{Scenario: rundir.ScenarioDensity}, Density: &analyzer.DensityReport{
		Steps: []analyzer.DensityStep{
			{Density: 4, ReadinessP50: 0.1, ReadinessP99: 0.2, WorkingSet: 1 << 30},
			{Density: 8, ReadinessP50: 0.3, ReadinessP99: 1.5, WorkingSet: 2 << 30, PSIMemoryFull: 0.4},
		},
		MaxStable: 4, Collapse: &analyzer.DensityCollapse{Density: 8, Signal: "readiness"},
		Ceiling: &analyzer.DensityCeiling{Resource: "memory-working-set", Explanation: "the working set filled the node"}}}
	storm := &analyzer.Report{Run: analyzer.RunInfo{Scenario: rundir.ScenarioFsyncStorm}, Storm: &analyzer.Storm{
		Writers: []analyzer.StormWriter{{Name: "fsync-writer-0", DurableSeconds: []float64{0.042, 0.058}}, {Name: "fsync-writer-1", DurableSeconds: []float64{0.05}}},
		Rounds:  []analyzer.StormRound{{Name: "round-1", QueueMean: 0.002, ServiceMean: 0.001}, {Name: "round-2"}}}}
	render := func(rep *analyzer.Report) string {
		var buf bytes.Buffer
		if err := FromRun(&rundir.Run{}, rep).Write(&buf); err != nil {
			t.Fatal(err)
		}
		return buf.String()
	}
	html := render(density)
	_, lines := chartData(t, html)
	if got := lines["density-readiness/p99"]; got != "4,0.2 8,1.5" {
		t.Errorf("readiness p99 points %q", got)
	}
	if got := lines["density-memory/working set"]; got != "4,1.073741824e+09 8,2.147483648e+09" {
		t.Errorf("working set points %q", got)
	}
	if !strings.Contains(html, `data-mark="collapse: readiness" data-x="8"`) || !strings.Contains(html, "Ceiling: memory-working-set") {
		t.Errorf("the collapse is not marked at 8, or the ceiling not named")
	}
	bars, _ := chartData(t, render(storm))
	for k, want := range map[string]float64{
		"storm-durable/fsync-writer-0/round-1": 0.042, "storm-durable/fsync-writer-0/round-2": 0.058,
		"storm-durable/fsync-writer-1/round-1": 0.05, "storm-device/round-1/queue": 0.002,
	} {
		if got, ok := bars[k]; !ok || got != want {
			t.Errorf("%s = %v (drawn %v), want %v", k, got, ok, want)
		}
	}
	if v, ok := bars["storm-durable/fsync-writer-1/round-2"]; ok {
		t.Errorf("a bar of %v for the storm writer-1 did not finish: want none", v)
	}
}
