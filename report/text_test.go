package report

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodectl/nodectl/analyzer"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

// The renderers are tested on reports as the analyzer makes them, written out here: what each
// says of a value is theirs, what the values are is the analyzer's (its own tests).

func text(t *testing.T, rep *analyzer.Report) string {
	t.Helper()
	var buf bytes.Buffer
	if err := Text(&buf, rep); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

// scenarioKeys is the top-level keys of what `stress <scenario> -o json` prints for rep.
func scenarioKeys(t *testing.T, rep *analyzer.Report) (map[string]json.RawMessage, []string) {
	t.Helper()
	var buf bytes.Buffer
	if err := ScenarioJSON(&buf, rep); err != nil {
		t.Fatal(err)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, buf.String())
	}
	return doc, slices.Sorted(maps.Keys(doc))
}

// hasLine reports whether a line of text, its runs of spaces made single, is want.
func hasLine(text, want string) bool {
	for line := range strings.Lines(text) {
		if strings.Join(strings.Fields(line), " ") == want {
			return true
		}
	}
	return false
}

func wantIn(t *testing.T, out string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(out, want) {
			t.Errorf("text lacks %q:\n%s", want, out)
		}
	}
}

func noisyReport() *analyzer.Report {
	t0 := time.Unix(1000, 0)
	var h hist.Log2
	h.Buckets = make([]uint64, 24)
	h.Buckets[20], h.Count = 40, 40 // [1.05ms, 2.1ms)
	return &analyzer.Report{
		Run: analyzer.RunInfo{ID: "r1", Scenario: rundir.ScenarioNoisy, Node: "node-a", Kernel: "6.18.0"},
		Summary: analyzer.Summary{
			Phases: []rundir.Window{{Name: rundir.PhaseStress, Start: t0, End: t0.Add(20 * time.Second)}},
			Workloads: []analyzer.WorkloadPhase{
				{Workload: "victim", Phase: rundir.PhaseStress, CPUCores: 0.5, Probe: &analyzer.ProbeStats{Iterations: 20, CPUWorkP50: 0.72, CPUWorkP95: 0.9}},
				{Workload: "cpu-hog-0", Phase: rundir.PhaseStress, CPUCores: 1, ThrottledRatio: 0.25, RunqWait: 1.5, IOBytes: 2 << 30},
			},
			Ranking: analyzer.Ranking{Window: rundir.PhaseStress, RunqWait: []analyzer.Ranked{{Cgroup: "/nodectl/r1/victim", Workload: "victim", Value: 4}}},
		},
		Findings: []analyzer.Finding{{ID: analyzer.IDCPUContention, Severity: "warning", Victim: "victim", Culprits: []string{"cpu-hog-0", "cpu-hog-1"},
			Summary: "the victim waited for a CPU", Evidence: []analyzer.Evidence{
				{Metric: "runq_preempt_wait_seconds", Workload: "victim", Culprit: "cpu-hog-0", Phase: rundir.PhaseStress, Baseline: 0.1, Value: 0.57, Unit: analyzer.UnitSeconds, Histogram: &h},
				{Metric: "blk_queue_p95_seconds", Device: "254:0", Phase: rundir.PhaseStress, Baseline: 0, Value: 0.002, Unit: analyzer.UnitSeconds},
			}}},
		Notes: []string{"tracer program blkio dropped 12 events (inflight_full)"},
	}
}

func TestTextOfANoisyRun(t *testing.T) {
	out := text(t, noisyReport())
	wantIn(t, out, "run r1: scenario noisy on node-a, kernel 6.18.0",
		"victim probe", "cpu work p50", "720ms",
		"WARNING cpu-contention: victim", "culprits: cpu-hog-0, cpu-hog-1",
		"victim ← cpu-hog-0", "device 254:0", "5.7x",
		"runq_preempt_wait_seconds in stress, by duration: [1.05ms, 2.1ms) 40",
		"top cgroups by run-queue wait in stress", "victim (/nodectl/r1/victim)",
		"note: tracer program blkio dropped 12 events")
	if !hasLine(out, "cpu-hog-0 stress 1.00 25% 0 1.50s 2.0 GiB") {
		t.Errorf("the workload table lacks the hog's row:\n%s", out)
	}
	quiet := text(t, &analyzer.Report{Run: analyzer.RunInfo{ID: "r2", Scenario: rundir.ScenarioNoisy}})
	wantIn(t, quiet, "no findings")

	// A noisy run's -o json is the whole report: the findings contract.
	if _, keys := scenarioKeys(t, noisyReport()); !slices.Equal(keys, []string{"findings", "notes", "run", "summary"}) {
		t.Errorf("noisy -o json keys %v, want the whole report", keys)
	}
}

func TestTextAndJSONOfAWakeRun(t *testing.T) {
	rep := &analyzer.Report{Run: analyzer.RunInfo{ID: "w1", Scenario: rundir.ScenarioWake},
		Limits: []analyzer.WakeLimit{
			{CPU: "50m", Workload: "wake-50m", Starts: 2, WakeP50: 3, WakeP95: 3.2, ThrottledShare: 0.9, RunqWaitSource: "runq"},
			{CPU: "1", Workload: "wake-1", Starts: 2, WakeP50: 0.16, WakeP95: 0.2, RunqWaitSource: "runq"},
			{CPU: "250m", Workload: "wake-250m"},
		},
		Summary: analyzer.Summary{Workloads: []analyzer.WorkloadPhase{{Workload: "wake-50m-0", Phase: "wake-50m-0"}}},
		Findings: []analyzer.Finding{{ID: analyzer.IDCPUThrottling, Severity: "critical", Victim: "wake-50m", Evidence: []analyzer.Evidence{
			{Metric: "wake_p50_seconds", Workload: "wake-50m", Phase: analyzer.PhaseWake, Baseline: 0.16, Value: 3, Unit: analyzer.UnitSeconds}}}},
	}
	out := text(t, rep)
	wantIn(t, out, "scenario wake", "cpu limit", "throttled share", "3.00s", "90%", "CRITICAL cpu-throttling: wake-50m", "fastest limit")
	if !hasLine(out, "250m 0 - - - - - - -") {
		t.Errorf("a limit with no answer is not a row of dashes:\n%s", out)
	}
	if strings.Contains(out, "wake-50m-0") {
		t.Errorf("text lists the starts one by one:\n%s", out)
	}
	doc, keys := scenarioKeys(t, rep)
	if !slices.Equal(keys, []string{"findings", "limits"}) {
		t.Errorf("wake -o json keys %v, want findings and limits", keys)
	}
	var limits []map[string]any
	if err := json.Unmarshal(doc["limits"], &limits); err != nil || len(limits) != 3 {
		t.Fatalf("limits %s: %v", doc["limits"], err)
	}
	for _, k := range []string{"cpu", "wake_p50_seconds", "wake_p95_seconds", "throttled_share"} {
		if _, ok := limits[0][k]; !ok {
			t.Errorf("limit %v lacks %s", limits[0], k)
		}
	}
}

func TestTextAndJSONOfAStorm(t *testing.T) {
	rep := &analyzer.Report{Run: analyzer.RunInfo{ID: "s1", Scenario: rundir.ScenarioFsyncStorm},
		Summary: analyzer.Summary{Workloads: []analyzer.WorkloadPhase{{Workload: "fsync-writer-0", Phase: "round-1"}}},
		Storm: &analyzer.Storm{
			Writers: []analyzer.StormWriter{
				{Name: "fsync-writer-0", DurableSeconds: []float64{0.4}, DurableP50: 0.4, DurableMax: 0.4, WriteP50: 0.1, FsyncP50: 0.3, Bytes: 64 << 20, QueueMean: 0.002, ServiceMean: 0.001},
				{Name: "fsync-writer-1", DurableSeconds: []float64{1.5}, DurableP50: 1.5, DurableMax: 1.5, WriteP50: 0.1, FsyncP50: 1.4, Bytes: 64 << 20},
			},
			Rounds: []analyzer.StormRound{{Name: "round-1", Writers: 2, DurableP50: 0.95, DurableMax: 1.5, Slowest: "fsync-writer-1",
				QueueMean: 0.002, ServiceMean: 0.001, QueueShare: 0.6, Explanation: "the device's queue held the tail"}},
		}}
	out := text(t, rep)
	wantIn(t, out, "scenario fsync-storm", "durable per storm", "round-1: the device's queue held the tail", "64.0 MiB", "60%")
	if !hasLine(out, "fsync-writer-1 1.50s 1.50s 1.50s 100ms 1.40s 64.0 MiB 0 0") {
		t.Errorf("the writer table lacks fsync-writer-1's row:\n%s", out)
	}
	if strings.Contains(out, "\nworkload") {
		t.Errorf("a storm's text repeats the summary's workload table:\n%s", out)
	}
	if _, keys := scenarioKeys(t, rep); !slices.Equal(keys, []string{"findings", "rounds", "writers"}) {
		t.Errorf("storm -o json keys %v, want writers, rounds and findings", keys)
	}
	// Untraced: the device's side is unknown, not zero.
	rep.Storm.Rounds[0].QueueMean, rep.Storm.Rounds[0].ServiceMean = 0, 0
	if out := text(t, rep); !hasLine(out, "fsync-writer-0 400ms 400ms 400ms 100ms 300ms - - -") {
		t.Errorf("an untraced storm shows the device's side:\n%s", out)
	}
}

func TestTextAndJSONOfASweep(t *testing.T) {
	collapse := &analyzer.DensityCollapse{Density: 6, Signal: rundir.SignalPSIFull, Value: 0.4, Bound: 0.1}
	rep := &analyzer.Report{Run: analyzer.RunInfo{ID: "d1", Scenario: rundir.ScenarioDensity},
		Density: &analyzer.DensityReport{MaxStable: 4, Collapse: collapse,
			Steps:   []analyzer.DensityStep{{Density: 2, Started: 2, Ready: 2}, {Density: 4, Started: 2, Ready: 2}, {Density: 6, Started: 2, Ready: 1, Signals: []string{rundir.SignalPSIFull}}},
			Ceiling: &analyzer.DensityCeiling{Resource: analyzer.CeilingMemory, Explanation: "the working set filled the node"}}}
	out := text(t, rep)
	wantIn(t, out, "collapse at 6 sandboxes: psi-memory-full (40% of the time, over its bound 10%); max stable 4",
		"ceiling: memory-working-set: the working set filled the node", "1/2")
	doc, keys := scenarioKeys(t, rep)
	if !slices.Equal(keys, []string{"ceiling", "collapse", "findings", "max_stable", "steps"}) {
		t.Errorf("density -o json keys %v", keys)
	}
	rep.Density.Collapse, rep.Density.Ceiling = nil, nil
	wantIn(t, text(t, rep), "no collapse up to 4 sandboxes")
	if doc, _ = scenarioKeys(t, rep); string(doc["collapse"]) != "null" {
		t.Errorf("a sweep without a collapse says collapse %s, want null", doc["collapse"])
	}
}

func TestDiffText(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	t0 := time.Unix(1000, 0)
	hogs := analyzer.Finding{ID: analyzer.IDCPUContention, Severity: "warning", Victim: "victim", Culprits: []string{"cpu-hog-0", "cpu-hog-1"}}
	throttled := analyzer.Finding{ID: analyzer.IDCPUThrottling, Severity: "critical", Victim: "victim"}
	d := &analyzer.DiffReport{
		A: analyzer.DiffRun{Run: analyzer.RunInfo{ID: "r1", Scenario: rundir.ScenarioNoisy, Node: "node-a", Kernel: "6.18.0"},
			Window: rundir.Window{Name: rundir.PhaseStress, Start: t0, End: t0.Add(20 * time.Second)}, Findings: []analyzer.Finding{hogs, throttled}},
		B: analyzer.DiffRun{Run: analyzer.RunInfo{ID: "r2", Scenario: rundir.ScenarioNoisy, Node: "node-a", Kernel: "6.18.0"},
			Window: rundir.Window{Name: rundir.PhaseStress, Start: t0, End: t0.Add(20 * time.Second)}, Findings: []analyzer.Finding{throttled}},
		Workloads: []analyzer.WorkloadDiff{
			{Workload: "victim", Metrics: []analyzer.MetricDiff{
				{Metric: "cpu_work_p50_seconds", Unit: analyzer.UnitSeconds, A: f(0.72), B: f(0.41), Ratio: f(0.41 / 0.72)},
				{Metric: "write_fsync_p50_seconds", Unit: analyzer.UnitSeconds, A: f(0), B: f(0)},
			}},
			{Workload: "cpu-hog-0", Metrics: []analyzer.MetricDiff{{Metric: "cpu_cores", Unit: analyzer.UnitCores, A: f(1), B: f(0.5), Ratio: f(0.5)}}},
			{Workload: "cpu-hog-1", In: analyzer.SideA, Metrics: []analyzer.MetricDiff{{Metric: "cpu_cores", Unit: analyzer.UnitCores, A: f(1)}}},
		},
		FindingsChanged: []analyzer.FindingChange{{ID: analyzer.IDCPUContention, Victim: "victim", In: analyzer.SideA}},
		Density:         &analyzer.DensityDiff{MaxStableA: 4, MaxStableB: 8, Gain: f(2), CollapseA: &analyzer.DensityCollapse{Density: 6, Signal: rundir.SignalPSIFull}},
		Notes:           []string{"the windows differ in length"},
	}
	var buf bytes.Buffer
	if err := DiffText(&buf, d); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"A: run r1: scenario noisy on node-a, kernel 6.18.0; stress 20.00s",
		"victim cpu work p50 720ms 410ms 0.57x",
		"cpu-hog-0 cpu cores 1.00 0.50 0.5x",
		"cpu-hog-1 (A only) cpu cores 1.00 -",
		"cpu-contention victim warning: cpu-hog-0, cpu-hog-1 - gone",
		"cpu-throttling victim critical critical",
		"max stable 4 8 2.0x",
		"collapse collapsed at 6 (psi-memory-full) no collapse",
		"note: the windows differ in length",
	} {
		if !hasLine(out, want) {
			t.Errorf("text diff lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "write+fsync") {
		t.Errorf("text diff shows a measure zero in both runs:\n%s", out)
	}
	buf.Reset()
	if err := DiffJSON(&buf, d); err != nil || !json.Valid(buf.Bytes()) {
		t.Errorf("diff JSON (%v):\n%s", err, buf.String())
	}
}

func TestUnits(t *testing.T) {
	for got, want := range map[string]string{
		fmtUnit(42, analyzer.UnitCount):      "42",
		fmtUnit(0.192, analyzer.UnitSeconds): "192ms",
		fmtUnit(2<<30, analyzer.UnitBytes):   "2.0 GiB",
		fmtUnit(0.25, analyzer.UnitRatio):    "25%",
	} {
		if got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
}
