package main

import (
	"encoding/json"
	"maps"
	"math"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/nodectl/nodectl/internal/browsertest"
	"github.com/nodectl/nodectl/rundir"
)

// renderReport writes the run's HTML report with nodectl report and opens it in headless
// Chromium, failing on any console error or request; its screenshots are kept as name.
func renderReport(t *testing.T, dir, name string) browsertest.Page {
	t.Helper()
	html := filepath.Join(t.TempDir(), name+".html")
	if _, err := nodectl(t, "report", dir, "--out", html); err != nil {
		t.Fatalf("report: %v", err)
	}
	page := browsertest.Open(t, html, name)
	for _, p := range page.Problems {
		t.Errorf("chromium: %s", p)
	}
	return page
}

// wakeReport is what `stress wake -o json` prints.
type wakeReport struct {
	report
	Limits []struct {
		CPU            string  `json:"cpu"`
		Workload       string  `json:"workload"`
		Starts         int     `json:"starts"`
		WakeP50        float64 `json:"wake_p50_seconds"`
		WakeP95        float64 `json:"wake_p95_seconds"`
		ThrottledShare float64 `json:"throttled_share"`
		RunqWaitP50    float64 `json:"runq_wait_p50_seconds"`
		RunqWaitSource string  `json:"runq_wait_source"`
	} `json:"limits"`
}

func TestWakeAt50mIsThrottled(t *testing.T) {
	requireRoot(t)
	dir := filepath.Join(t.TempDir(), "run")
	out, err := nodectl(t, "stress", "wake", "--cpu-limits", "50m,1", "--count", "3", "--trace", "--out", dir, "-o", "json")
	if err != nil {
		t.Fatalf("stress wake: %v", err)
	}
	run, err := rundir.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	assertClean(t, run.Meta.ID)

	var doc map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("stress wake -o json printed no report: %v\n%s", err, out)
	}
	if got := slices.Sorted(maps.Keys(doc)); !reflect.DeepEqual(got, []string{"findings", "limits"}) {
		t.Errorf("stress wake -o json has keys %v, want findings and limits", got)
	}
	var rep wakeReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Limits) != 2 || rep.Limits[0].CPU != "50m" || rep.Limits[1].CPU != "1" {
		t.Fatalf("limits %+v, want 50m then 1", rep.Limits)
	}
	slow, fast := rep.Limits[0], rep.Limits[1]
	t.Logf("wake p50/p95: 50m %.3f/%.3fs, 1 %.3f/%.3fs (x%.1f); throttled share 50m %.2f, 1 %.2f; run-queue wait p50 50m %.3fs, 1 %.4fs (%s); findings %v",
		slow.WakeP50, slow.WakeP95, fast.WakeP50, fast.WakeP95, slow.WakeP50/fast.WakeP50, slow.ThrottledShare, fast.ThrottledShare,
		slow.RunqWaitP50, fast.RunqWaitP50, slow.RunqWaitSource, rep.ids())
	for _, l := range rep.Limits {
		if l.Starts != 3 {
			t.Errorf("limit %s: %d starts answered, want 3", l.CPU, l.Starts)
		}
	}
	if fast.WakeP50 <= 0 || slow.WakeP50/fast.WakeP50 < 4 {
		t.Errorf("the 50m sandbox woke only x%.1f slower than at 1 CPU; want at least x4", slow.WakeP50/fast.WakeP50)
	}
	if slow.ThrottledShare <= 0.5 {
		t.Errorf("the 50m wake was throttled for %.2f of its time, want more than half", slow.ThrottledShare)
	}
	if slow.RunqWaitSource != "runq" || slow.RunqWaitP50 <= fast.RunqWaitP50 {
		t.Errorf("run-queue wait p50 %.4fs at 50m, %.4fs at 1 (from %q); want it from the runq tracer and longer at 50m",
			slow.RunqWaitP50, fast.RunqWaitP50, slow.RunqWaitSource)
	}

	i, ok := finding(rep.report, "cpu-throttling")
	if !ok {
		t.Fatalf("no cpu-throttling finding; %s", rep.said())
	}
	f := rep.Findings[i]
	share := 0.0
	for _, e := range f.Evidence {
		if e.Metric == "wake_throttled_share" && e.Workload == "wake-50m" {
			share = e.Value
		}
	}
	if f.Victim != "wake-50m" || share <= 0.5 {
		t.Errorf("cpu-throttling of %s with a throttled share of %.2f; want wake-50m, above 0.5", f.Victim, share)
	}
	for _, f := range rep.Findings {
		if f.Victim == "wake-1" || f.ID == "cpu-contention" {
			t.Errorf("unexpected %s finding for %s: %s", f.ID, f.Victim, f.Summary)
		}
	}

	// Each start's untraced run-queue wait is recorded too, read from schedstat at its answer.
	for _, w := range run.Meta.Workloads {
		if b, ok := run.Phase(w.Name); !ok || len(run.Series(rundir.MetricSchedRunDelay).Cgroup(w.Cgroup).Samples(b)) != 1 {
			t.Errorf("start %s has no boot phase with one %s sample", w.Name, rundir.MetricSchedRunDelay)
		}
	}

	// The run directory stays, and analyze explains it the same way.
	out, err = nodectl(t, "analyze", dir, "-o", "json")
	if err != nil {
		t.Fatalf("analyze: %v", err)
	}
	var again wakeReport
	if err := json.Unmarshal([]byte(out), &again); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(again.ids(), rep.ids()) || len(again.Limits) != 2 || again.Run["scenario"] != "wake" {
		t.Errorf("analyze of the run found %v with %d limits (scenario %q), stress wake %v", again.ids(), len(again.Limits), again.Run["scenario"], rep.ids())
	}

	// Its HTML report draws the same numbers: each limit's bar split by its throttled share,
	// read back from the page as Chromium laid it out, with nothing fetched and no error.
	page := renderReport(t, dir, "report-wake")
	for _, l := range rep.Limits {
		throttled := l.WakeP50 * min(l.ThrottledShare, 1)
		for series, want := range map[string]float64{"throttled": throttled, "not throttled": l.WakeP50 - throttled} {
			key := "wake-per-limit/" + l.CPU + "/" + series
			if got, ok := page.Bars[key]; !ok || math.Abs(got-want) > 1e-9*max(1, want) {
				t.Errorf("the report's %s = %v (drawn %v), want %v from the analysis", key, got, ok, want)
			}
		}
	}
}

func TestWakeInterruptedLeavesNothing(t *testing.T) {
	requireRoot(t)
	dir := filepath.Join(t.TempDir(), "run")
	// At 10m the boot takes about 15 s: the signal comes while the sandbox boots.
	interruptAt(t, dir, "the sandbox's start", func(r rundir.Record) bool {
		return r.Type == rundir.TypePhase && r.Event == rundir.EventStart
	}, "stress", "wake", "--cpu-limits", "10m", "--count", "1")
	if _, err := nodectl(t, "analyze", dir); err != nil {
		t.Errorf("analyze of the interrupted run: %v", err)
	}
}

func TestWakeCLIErrorsNameTheFlag(t *testing.T) {
	expectCLIErrors(t, []string{"stress", "wake"}, map[string]cliError{
		"bad_limit":         {[]string{"--cpu-limits", "50m,fast"}, `--cpu-limits: bad CPU limit "fast": want Kubernetes notation such as 250m or 1`},
		"limit_too_small":   {[]string{"--cpu-limits", "5m"}, "--cpu-limits: 5m is below 10m"},
		"same_limit":        {[]string{"--cpu-limits", "1,1000m"}, "--cpu-limits: 1 and 1000m are the same limit"},
		"zero_count":        {[]string{"--count", "0"}, "--count 0: want an integer from 1 to 1000"},
		"bad_runtime":       {[]string{"--runtime", "docker"}, `--runtime: unknown runtime "docker": allowed are process, runc, runsc`},
		"bad_boot_work":     {[]string{"--boot-work", "0"}, "--boot-work 0: want at least 1 round"},
		"platform_no_runsc": {[]string{"--runsc-platform", "ptrace"}, "--runsc-platform ptrace: only for --runtime runsc, not process"},
		"short_timeout":     {[]string{"--timeout", "10ms"}, "--timeout 10ms: must be at least 1s"},
		"bad_output":        {[]string{"-o", "yaml"}, `-o "yaml": allowed values are text and json`},
	})
}
