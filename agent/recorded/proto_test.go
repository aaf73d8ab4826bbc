package recorded

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/nodectl/nodectl/analyzer"
	agentv1 "github.com/nodectl/nodectl/api/agent/v1"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

// fullReport is a window's report with every field the API carries set.
func fullReport() *analyzer.Report {
	t0 := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	h := hist.FromSlots([]uint64{0, 2, 5}, 7, 12345)
	return &analyzer.Report{
		Run: analyzer.RunInfo{ID: "agent-20261201-030000", Scenario: rundir.ScenarioAgent, Node: "node-1", Kernel: "6.1.0"},
		Findings: []analyzer.Finding{
			{ID: analyzer.IDMemoryReclaim, Severity: analyzer.SeverityWarning, Victim: "ns/web/web", Culprits: []string{"ns/hog/hog"},
				Affects: []string{"cpu_work"}, Summary: "reclaim stalls rose",
				Evidence: []analyzer.Evidence{{Metric: "memcg_reclaim_seconds", Workload: "ns/web/web", Culprit: "ns/hog/hog", Device: "8:0",
					Phase: rundir.PhaseWindow, Baseline: 0.5, Value: 2.25, Unit: analyzer.UnitSeconds, Histogram: &h}}},
			{ID: analyzer.IDOOMKill, Severity: analyzer.SeverityCritical, Victim: "ns/db/db", Culprits: []string{}, Evidence: []analyzer.Evidence{}},
		},
		Summary: analyzer.Summary{
			Phases: []rundir.Window{{Name: rundir.PhaseBaseline, Start: t0, End: t0.Add(time.Minute)}, {Name: rundir.PhaseWindow, Start: t0.Add(time.Minute), End: t0.Add(2 * time.Minute)}},
			Workloads: []analyzer.WorkloadPhase{{Workload: "ns/web/web", Kind: rundir.KindObserved, Phase: rundir.PhaseWindow, Seconds: 60, CPUCores: 0.5,
				ThrottledRatio: 0.1, ThrottledSeconds: 2, RunqP99: 0.004, RunqWait: 1.5, IOBytes: 4096, FsyncP95: 0.02,
				Probe:                &analyzer.ProbeStats{Iterations: 9, CPUWorkP50: 1, CPUWorkP95: 2, WriteFsyncP50: 3, WriteFsyncP95: 4, FsyncP95: 5},
				HeartbeatLatenessP99: 0.3, HeartbeatLatenessMax: 0.9}},
			Ranking: analyzer.Ranking{Window: rundir.PhaseWindow, RunqWait: []analyzer.Ranked{{Cgroup: "/kubepods/pod1", Workload: "ns/web/web", Value: 1.5, Count: 30}},
				Fsync: []analyzer.Ranked{}, IOBytes: []analyzer.Ranked{{Cgroup: "/kubepods/pod2", Value: 4096}}},
		},
		Notes: []string{"tracer program fsync not attached"},
	}
}

// A report crosses the API whole: what `-o json` prints of it is the same on both sides.
func TestReportRoundTrip(t *testing.T) {
	for _, rep := range []*analyzer.Report{fullReport(), {Findings: []analyzer.Finding{}, Summary: analyzer.Summary{Phases: []rundir.Window{},
		Workloads: []analyzer.WorkloadPhase{}, Ranking: analyzer.Ranking{RunqWait: []analyzer.Ranked{}, Fsync: []analyzer.Ranked{}, IOBytes: []analyzer.Ranked{}}}}} {
		b, err := proto.Marshal(ReportToProto(rep))
		if err != nil {
			t.Fatal(err)
		}
		var p agentv1.Report
		if err := proto.Unmarshal(b, &p); err != nil {
			t.Fatal(err)
		}
		got, err := ReportFromProto(&p)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := json.Marshal(rep)
		have, _ := json.Marshal(got)
		if string(want) != string(have) {
			t.Errorf("report changed crossing the API:\n got %s\nwant %s", have, want)
		}
	}
}

func TestIncidentRoundTrip(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	in := Incident{ID: "20261201-030000-oom_kill-1", Opened: t0, Trigger: "oom_kill", Cgroup: "/kubepods/pod1", Workload: "ns/web/web",
		Evidence: "oom kill of pid 7 (java)", Repeats: 2, BaselineFrom: t0.Add(-6 * time.Minute), WindowFrom: t0.Add(-time.Minute),
		WindowTo: t0.Add(time.Minute), State: StateClosed, Report: fullReport()}
	got, err := IncidentFromProto(IncidentToProto(in))
	if err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal(in)
	have, _ := json.Marshal(got)
	if string(want) != string(have) {
		t.Errorf("incident changed crossing the API:\n got %s\nwant %s", have, want)
	}
	in.Report, in.State = nil, StateOpen
	if got, err := IncidentFromProto(IncidentToProto(in)); err != nil || got.Report != nil {
		t.Errorf("an open incident came back with report %v, err %v", got.Report, err)
	}
}

// A histogram no agent sends is refused, not read past hist.Slots.
func TestReportFromProtoRefusesOversizedHistogram(t *testing.T) {
	p := ReportToProto(fullReport())
	p.Findings[0].Evidence[0].Histogram.Buckets = make([]uint64, hist.Slots+1)
	if _, err := ReportFromProto(p); err == nil || !strings.Contains(err.Error(), "buckets") {
		t.Errorf("ReportFromProto of %d buckets: %v, want a refusal", hist.Slots+1, err)
	}
}
