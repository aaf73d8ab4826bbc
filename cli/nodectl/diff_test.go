package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodectl/nodectl/rundir"
)

// writeRun writes a small stress run: the victim probe's CPU work in a 10 s baseline and a
// 10 s stress phase, and the named hogs' CPU use in the stress phase.
func writeRun(t *testing.T, id string, work float64, hogs ...string) string {
	t.Helper()
	start := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(sec int) time.Time { return start.Add(time.Duration(sec) * time.Second) }
	cg := "/nodectl/" + id + "/"
	meta := rundir.Meta{ID: id, Scenario: "noisy", Node: "node-a", Kernel: "6.18.0", Start: start,
		Workloads: []rundir.Workload{{Name: "victim", Kind: "victim", Cgroup: cg + "victim"}}}
	recs := []rundir.Record{
		{Type: rundir.TypePhase, Time: at(0), Name: rundir.PhaseBaseline, Event: rundir.EventStart},
		{Type: rundir.TypePhase, Time: at(10), Name: rundir.PhaseBaseline, Event: rundir.EventEnd},
		{Type: rundir.TypePhase, Time: at(10), Name: rundir.PhaseStress, Event: rundir.EventStart},
		{Type: rundir.TypePhase, Time: at(20), Name: rundir.PhaseStress, Event: rundir.EventEnd},
	}
	num := func(v float64) *float64 { return &v }
	for s := 1; s <= 20; s++ {
		v := 0.1
		if s > 10 {
			v = work
		}
		recs = append(recs, rundir.Record{Type: rundir.TypeSample, Time: at(s), Metric: rundir.MetricProbeCPUWork, Cgroup: cg + "victim", Value: num(v)})
	}
	for _, h := range hogs {
		meta.Workloads = append(meta.Workloads, rundir.Workload{Name: h, Kind: "cpu", Cgroup: cg + h})
		for _, s := range []struct {
			t int
			v float64
		}{{10, 0}, {20, 10}} {
			recs = append(recs, rundir.Record{Type: rundir.TypeSample, Time: at(s.t), Metric: rundir.MetricCPUUsage, Cgroup: cg + h, Value: num(s.v)})
		}
	}
	dir := filepath.Join(t.TempDir(), id)
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
	return dir
}

func TestDiffJSON(t *testing.T) {
	a := writeRun(t, "before", 0.3, "cpu-hog-0", "cpu-hog-1")
	b := writeRun(t, "after", 0.15, "cpu-hog-0")
	out, err := nodectl(t, "diff", a, b, "-o", "json")
	if err != nil {
		t.Fatalf("diff: %v", err)
	}
	var d struct {
		A struct {
			Run      map[string]string `json:"run"`
			Findings []any             `json:"findings"`
		} `json:"a"`
		B struct {
			Run map[string]string `json:"run"`
		} `json:"b"`
		Workloads []struct {
			Workload string `json:"workload"`
			In       string `json:"in"`
			Metrics  []struct {
				Metric string   `json:"metric"`
				A      *float64 `json:"a"`
				B      *float64 `json:"b"`
				Ratio  *float64 `json:"ratio"`
			} `json:"metrics"`
		} `json:"workloads"`
		FindingsChanged []any `json:"findings_changed"`
	}
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		t.Fatalf("diff -o json printed no diff: %v\n%s", err, out)
	}
	if d.A.Run["id"] != "before" || d.B.Run["id"] != "after" || d.A.Findings == nil || d.FindingsChanged == nil {
		t.Errorf("runs %v / %v, findings %v, changed %v", d.A.Run, d.B.Run, d.A.Findings, d.FindingsChanged)
	}
	var got []string
	for _, w := range d.Workloads {
		got = append(got, w.Workload+":"+w.In)
		for _, m := range w.Metrics {
			if w.Workload == "victim" && m.Metric == "cpu_work_p50_seconds" && (m.Ratio == nil || math.Abs(*m.Ratio-0.5) > 1e-9) {
				t.Errorf("victim cpu work p50 ratio = %v, want 0.5 (0.3 s → 0.15 s)", m.Ratio)
			}
		}
	}
	if strings.Join(got, " ") != "victim: cpu-hog-0: cpu-hog-1:a" {
		t.Errorf("workloads = %v, want victim, cpu-hog-0 and cpu-hog-1 only in A", got)
	}
}

func TestDiffNamesTheRunItCannotRead(t *testing.T) {
	a := writeRun(t, "before", 0.3)
	missing := filepath.Join(t.TempDir(), "nothing")
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"run_b_missing": {[]string{"diff", a, missing}, "reading run B (" + missing + ")"},
		"run_a_missing": {[]string{"diff", missing, a}, "reading run A (" + missing + ")"},
		"one_run":       {[]string{"diff", a}, "accepts 2 arg(s)"},
	} {
		t.Run(name, func(t *testing.T) {
			_, stderr, err := nodectlAs(t, os.Args[0], nil, tc.args...)
			if err == nil || !strings.Contains(stderr, tc.want) {
				t.Errorf("nodectl %v: err %v, stderr %q, want it to say %q", tc.args, err, stderr, tc.want)
			}
		})
	}
}
