package recorded

import (
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/nodectl/nodectl/api/agent/v1"
)

// IncidentToProto is the API's form of an incident.
func IncidentToProto(in Incident) *agentv1.Incident {
	return &agentv1.Incident{Id: in.ID, Opened: timestamppb.New(in.Opened), Trigger: in.Trigger, Cgroup: in.Cgroup,
		Workload: in.Workload, Evidence: in.Evidence, WindowFrom: timestamppb.New(in.WindowFrom), WindowTo: timestamppb.New(in.WindowTo),
		BaselineFrom: timestamppb.New(in.BaselineFrom), BaselineTo: timestamppb.New(in.WindowFrom), State: in.State,
		ReportJson: string(in.Report), AnalysisError: in.AnalysisError, Repeats: uint32(in.Repeats)}
}

// IncidentFromProto is an incident read from the API.
func IncidentFromProto(p *agentv1.Incident) Incident {
	in := Incident{ID: p.GetId(), Opened: p.GetOpened().AsTime(), Trigger: p.GetTrigger(), Cgroup: p.GetCgroup(),
		Workload: p.GetWorkload(), Evidence: p.GetEvidence(), WindowFrom: p.GetWindowFrom().AsTime(), WindowTo: p.GetWindowTo().AsTime(),
		BaselineFrom: p.GetBaselineFrom().AsTime(), State: p.GetState(), AnalysisError: p.GetAnalysisError(), Repeats: int(p.GetRepeats())}
	if p.GetReportJson() != "" {
		in.Report = []byte(p.GetReportJson())
	}
	return in
}
