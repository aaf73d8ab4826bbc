package agent

import (
	"errors"
	"testing"

	"github.com/nodectl/nodectl/agent/recorded"
	"github.com/nodectl/nodectl/analyzer"
	agentv1 "github.com/nodectl/nodectl/api/agent/v1"
)

func TestStatusSeverity(t *testing.T) {
	writable := &agentv1.Store{Writable: true}
	for _, c := range []struct {
		name string
		st   *agentv1.Status
		err  error
		want string
	}{
		{"unreachable", nil, errors.New("port-forward: refused"), analyzer.SeverityCritical},
		{"store_not_writable", &agentv1.Status{Store: &agentv1.Store{}}, nil, analyzer.SeverityCritical},
		{"incident_open", &agentv1.Status{Store: writable, IncidentsOpen: 1}, nil, analyzer.SeverityWarning},
		{"dropped", &agentv1.Status{Store: writable, Drops: []*agentv1.Drop{{Stage: "ringbuf", Count: 3}}}, nil, analyzer.SeverityWarning},
		{"fine", &agentv1.Status{Store: writable, IncidentsTotal: 4}, nil, "ok"},
	} {
		if got := statusSeverity(c.st, c.err); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}

func TestIncidentSeverityIsTheWorstFinding(t *testing.T) {
	rep := &analyzer.Report{Findings: []analyzer.Finding{
		{ID: "a", Severity: analyzer.SeverityInfo}, {ID: "b", Severity: analyzer.SeverityCritical}, {ID: "c", Severity: analyzer.SeverityWarning},
	}}
	if got := incidentSeverity(recorded.Incident{Report: rep}); got != analyzer.SeverityCritical {
		t.Errorf("severity %q, want critical", got)
	}
	if got := incidentSeverity(recorded.Incident{}); got != "" {
		t.Errorf("an incident not yet analyzed: %q, want none", got)
	}
}
