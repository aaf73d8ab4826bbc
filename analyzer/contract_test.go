package analyzer

import (
	"bytes"
	"encoding/json"
	"maps"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/nodectl/nodectl/rundir"
)

func keys(t *testing.T, v any) []string {
	t.Helper()
	m, ok := v.(map[string]any)
	if !ok {
		t.Fatalf("%v is not an object", v)
	}
	return slices.Sorted(maps.Keys(m))
}

func TestJSONContract(t *testing.T) {
	rep := diskBusy(t).analyze(t)
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(rep); err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, buf.String())
	}
	if got, want := keys(t, doc), []string{"findings", "run", "summary"}; !reflect.DeepEqual(got, want) {
		t.Errorf("report keys = %v, want %v", got, want)
	}
	run := doc["run"].(map[string]any)
	if got, want := keys(t, run), []string{"id", "kernel", "node", "scenario"}; !reflect.DeepEqual(got, want) {
		t.Errorf("run keys = %v, want %v", got, want)
	}
	if run["id"] != "r1" || run["scenario"] != "noisy" || run["node"] != "node-a" || run["kernel"] != "6.18.0" {
		t.Errorf("run = %v", run)
	}
	finding := doc["findings"].([]any)[0].(map[string]any)
	if got, want := keys(t, finding), []string{"affects", "culprits", "evidence", "id", "severity", "summary", "victim"}; !reflect.DeepEqual(got, want) {
		t.Errorf("finding keys = %v, want %v", got, want)
	}
	if got := finding["affects"].([]any); len(got) != 2 || got[0] != "write_fsync" || got[1] != "fsync" {
		t.Errorf("affects = %v, want [write_fsync fsync]", got)
	}
	if finding["id"] != "disk-contention" || finding["severity"] != "critical" || finding["victim"] != "victim" {
		t.Errorf("finding = %v", finding)
	}
	if got := finding["culprits"].([]any); len(got) != 2 || got[0] != "disk-hog-0" {
		t.Errorf("culprits = %v", got)
	}
	contract := []string{"baseline", "metric", "phase", "unit", "value", "workload"}
	for _, e := range finding["evidence"].([]any) {
		got := slices.DeleteFunc(keys(t, e), func(k string) bool { return k == "culprit" || k == "device" })
		if !reflect.DeepEqual(got, contract) {
			t.Errorf("evidence keys = %v, want %v (plus optional culprit, device)", keys(t, e), contract)
		}
	}
	var e map[string]any
	for _, ev := range finding["evidence"].([]any) {
		if ev.(map[string]any)["metric"] == "probe_fsync_p95" {
			e = ev.(map[string]any)
		}
	}
	if e["metric"] != "probe_fsync_p95" || e["workload"] != "victim" || e["phase"] != "stress" ||
		e["baseline"] != 0.19 || e["value"] != 1.1 || e["unit"] != "seconds" {
		t.Errorf("first evidence = %v", e)
	}
}

func TestJSONQuietRun(t *testing.T) {
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(newRun(victimWorkload()).analyze(t)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), `"findings":[]`) {
		t.Errorf("a quiet run's findings are not an empty list:\n%s", buf.String())
	}
}

func TestFindingsFileRoundTrip(t *testing.T) {
	b := cpuBusy(2).preempted(cpuHog0, 0, 2).preempted(cpuHog1, 0, 2)
	run := b.open(t)
	rep, err := Analyze(run)
	if err != nil {
		t.Fatal(err)
	}
	if err := rundir.WriteFindings(run.Dir, rep); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(run.Dir, rundir.FindingsFile))
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back.Findings, rep.Findings) || back.Run != rep.Run {
		t.Errorf("findings.json does not round-trip:\n%s", raw)
	}
}

// An evidence that is not a finite number is left out with a note: JSON cannot hold it, and the
// report must still render.
func TestNonFiniteEvidenceLeftOut(t *testing.T) {
	f := []Finding{{ID: IDCPUThrottling, Victim: "v", Evidence: []Evidence{
		{Metric: "ok", Value: 1}, {Metric: "bad", Value: math.Inf(1)}, {Metric: "nan", Baseline: math.NaN()},
	}}}
	notes := finiteEvidence(f)
	if len(f[0].Evidence) != 1 || f[0].Evidence[0].Metric != "ok" || len(notes) != 2 {
		t.Errorf("evidence %+v, notes %q; want only the finite one and two notes", f[0].Evidence, notes)
	}
	if _, err := json.Marshal(f); err != nil {
		t.Error(err)
	}
}
