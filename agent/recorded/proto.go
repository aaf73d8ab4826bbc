package recorded

import (
	"fmt"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodectl/nodectl/analyzer"
	agentv1 "github.com/nodectl/nodectl/api/agent/v1"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

// IncidentToProto is the API's form of an incident.
func IncidentToProto(in Incident) *agentv1.Incident {
	return &agentv1.Incident{Id: in.ID, Opened: timestamppb.New(in.Opened), Trigger: in.Trigger, Cgroup: in.Cgroup,
		Workload: in.Workload, Evidence: in.Evidence, WindowFrom: timestamppb.New(in.WindowFrom), WindowTo: timestamppb.New(in.WindowTo),
		BaselineFrom: timestamppb.New(in.BaselineFrom), BaselineTo: timestamppb.New(in.WindowFrom), State: in.State,
		Report: ReportToProto(in.Report), AnalysisError: in.AnalysisError, Repeats: uint32(in.Repeats)}
}

// IncidentFromProto is an incident read from the API; a report the API could not have sent
// (a histogram past hist.Slots) is an error.
func IncidentFromProto(p *agentv1.Incident) (Incident, error) {
	in := Incident{ID: p.GetId(), Opened: p.GetOpened().AsTime(), Trigger: p.GetTrigger(), Cgroup: p.GetCgroup(),
		Workload: p.GetWorkload(), Evidence: p.GetEvidence(), WindowFrom: p.GetWindowFrom().AsTime(), WindowTo: p.GetWindowTo().AsTime(),
		BaselineFrom: p.GetBaselineFrom().AsTime(), State: p.GetState(), AnalysisError: p.GetAnalysisError(), Repeats: int(p.GetRepeats())}
	if p.GetReport() != nil {
		rep, err := ReportFromProto(p.GetReport())
		if err != nil {
			return in, fmt.Errorf("incident %s: %w", in.ID, err)
		}
		in.Report = rep
	}
	return in, nil
}

// ReportToProto is the API's form of a window's report; nil for nil. A window's report has
// no scenario tables (Limits, Storm, Density), so the API has none.
func ReportToProto(r *analyzer.Report) *agentv1.Report {
	if r == nil {
		return nil
	}
	p := &agentv1.Report{Run: &agentv1.RunInfo{Id: r.Run.ID, Scenario: r.Run.Scenario, Node: r.Run.Node, Kernel: r.Run.Kernel},
		Notes: r.Notes, Summary: summaryToProto(r.Summary)}
	for _, f := range r.Findings {
		pf := &agentv1.Finding{Id: f.ID, Severity: f.Severity, Victim: f.Victim, Culprits: f.Culprits, Affects: f.Affects, Summary: f.Summary}
		for _, e := range f.Evidence {
			pe := &agentv1.Evidence{Metric: e.Metric, Workload: e.Workload, Culprit: e.Culprit, Device: e.Device, Phase: e.Phase,
				Baseline: e.Baseline, Value: e.Value, Unit: e.Unit}
			if e.Histogram != nil {
				pe.Histogram = &agentv1.Histogram{Buckets: e.Histogram.Buckets, Count: e.Histogram.Count, SumNs: e.Histogram.SumNs}
			}
			pf.Evidence = append(pf.Evidence, pe)
		}
		p.Findings = append(p.Findings, pf)
	}
	return p
}

func summaryToProto(s analyzer.Summary) *agentv1.Summary {
	p := &agentv1.Summary{Ranking: &agentv1.Ranking{Window: s.Ranking.Window, RunqWait: rankedToProto(s.Ranking.RunqWait),
		Fsync: rankedToProto(s.Ranking.Fsync), IoBytes: rankedToProto(s.Ranking.IOBytes)}}
	for _, w := range s.Phases {
		p.Phases = append(p.Phases, &agentv1.Phase{Name: w.Name, Start: timestamppb.New(w.Start), End: timestamppb.New(w.End)})
	}
	for _, w := range s.Workloads {
		pw := &agentv1.WorkloadPhase{Workload: w.Workload, Kind: w.Kind, Phase: w.Phase, Seconds: w.Seconds, CpuCores: w.CPUCores,
			ThrottledRatio: w.ThrottledRatio, ThrottledSeconds: w.ThrottledSeconds, RunqP99Seconds: w.RunqP99, RunqWaitSeconds: w.RunqWait,
			IoBytes: w.IOBytes, FsyncP95Seconds: w.FsyncP95, HeartbeatLatenessP99Seconds: w.HeartbeatLatenessP99,
			HeartbeatLatenessMaxSeconds: w.HeartbeatLatenessMax}
		if pr := w.Probe; pr != nil {
			pw.Probe = &agentv1.ProbeStats{Iterations: int64(pr.Iterations), CpuWorkP50Seconds: pr.CPUWorkP50, CpuWorkP95Seconds: pr.CPUWorkP95,
				WriteFsyncP50Seconds: pr.WriteFsyncP50, WriteFsyncP95Seconds: pr.WriteFsyncP95, FsyncP95Seconds: pr.FsyncP95}
		}
		p.Workloads = append(p.Workloads, pw)
	}
	return p
}

func rankedToProto(list []analyzer.Ranked) []*agentv1.Ranked {
	var out []*agentv1.Ranked
	for _, r := range list {
		out = append(out, &agentv1.Ranked{Cgroup: r.Cgroup, Workload: r.Workload, Value: r.Value, Count: r.Count})
	}
	return out
}

// ReportFromProto is a report read from the API, as the analyzer made it: the lists its JSON
// always has are empty, not absent. A histogram with more buckets than hist.Slots, which no
// agent sends, is an error.
func ReportFromProto(p *agentv1.Report) (*analyzer.Report, error) {
	r := &analyzer.Report{Run: analyzer.RunInfo{ID: p.GetRun().GetId(), Scenario: p.GetRun().GetScenario(), Node: p.GetRun().GetNode(),
		Kernel: p.GetRun().GetKernel()}, Notes: p.GetNotes(), Findings: []analyzer.Finding{}}
	for _, pf := range p.GetFindings() {
		f := analyzer.Finding{ID: pf.GetId(), Severity: pf.GetSeverity(), Victim: pf.GetVictim(), Culprits: nonNil(pf.GetCulprits()),
			Affects: pf.GetAffects(), Summary: pf.GetSummary(), Evidence: []analyzer.Evidence{}}
		for _, pe := range pf.GetEvidence() {
			e := analyzer.Evidence{Metric: pe.GetMetric(), Workload: pe.GetWorkload(), Culprit: pe.GetCulprit(), Device: pe.GetDevice(),
				Phase: pe.GetPhase(), Baseline: pe.GetBaseline(), Value: pe.GetValue(), Unit: pe.GetUnit()}
			if h := pe.GetHistogram(); h != nil {
				if len(h.GetBuckets()) > hist.Slots {
					return nil, fmt.Errorf("report: finding %s: histogram of %d buckets, at most %d", f.ID, len(h.GetBuckets()), hist.Slots)
				}
				l := hist.FromSlots(h.GetBuckets(), h.GetCount(), h.GetSumNs())
				e.Histogram = &l
			}
			f.Evidence = append(f.Evidence, e)
		}
		r.Findings = append(r.Findings, f)
	}
	s := p.GetSummary()
	r.Summary = analyzer.Summary{Phases: []rundir.Window{}, Workloads: []analyzer.WorkloadPhase{}, Ranking: analyzer.Ranking{
		Window: s.GetRanking().GetWindow(), RunqWait: rankedFromProto(s.GetRanking().GetRunqWait()),
		Fsync: rankedFromProto(s.GetRanking().GetFsync()), IOBytes: rankedFromProto(s.GetRanking().GetIoBytes())}}
	for _, ph := range s.GetPhases() {
		r.Summary.Phases = append(r.Summary.Phases, rundir.Window{Name: ph.GetName(), Start: ph.GetStart().AsTime(), End: ph.GetEnd().AsTime()})
	}
	for _, pw := range s.GetWorkloads() {
		w := analyzer.WorkloadPhase{Workload: pw.GetWorkload(), Kind: pw.GetKind(), Phase: pw.GetPhase(), Seconds: pw.GetSeconds(),
			CPUCores: pw.GetCpuCores(), ThrottledRatio: pw.GetThrottledRatio(), ThrottledSeconds: pw.GetThrottledSeconds(),
			RunqP99: pw.GetRunqP99Seconds(), RunqWait: pw.GetRunqWaitSeconds(), IOBytes: pw.GetIoBytes(), FsyncP95: pw.GetFsyncP95Seconds(),
			HeartbeatLatenessP99: pw.GetHeartbeatLatenessP99Seconds(), HeartbeatLatenessMax: pw.GetHeartbeatLatenessMaxSeconds()}
		if pr := pw.GetProbe(); pr != nil {
			w.Probe = &analyzer.ProbeStats{Iterations: int(pr.GetIterations()), CPUWorkP50: pr.GetCpuWorkP50Seconds(), CPUWorkP95: pr.GetCpuWorkP95Seconds(),
				WriteFsyncP50: pr.GetWriteFsyncP50Seconds(), WriteFsyncP95: pr.GetWriteFsyncP95Seconds(), FsyncP95: pr.GetFsyncP95Seconds()}
		}
		r.Summary.Workloads = append(r.Summary.Workloads, w)
	}
	return r, nil
}

func rankedFromProto(list []*agentv1.Ranked) []analyzer.Ranked {
	out := []analyzer.Ranked{}
	for _, p := range list {
		out = append(out, analyzer.Ranked{Cgroup: p.GetCgroup(), Workload: p.GetWorkload(), Value: p.GetValue(), Count: p.GetCount()})
	}
	return out
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
