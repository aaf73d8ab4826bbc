package recorded

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodectl/nodectl/agent/rpc"
	agentv1 "github.com/nodectl/nodectl/api/agent/v1"
)

// incidentsOnly is an agent's API backend with incidents alone.
type incidentsOnly struct {
	rpc.Backend // the rest is not called
	incidents   []*agentv1.Incident
	gets        int
}

func (b *incidentsOnly) Incidents(_ time.Time, limit int) []*agentv1.Incident {
	var out []*agentv1.Incident
	for _, in := range b.incidents[:min(limit, len(b.incidents))] {
		out = append(out, proto.CloneOf(in))
	}
	return out
}

func (b *incidentsOnly) Incident(id string) (*agentv1.Incident, bool) {
	b.gets++
	for _, in := range b.incidents {
		if in.GetId() == id {
			return proto.CloneOf(in), true
		}
	}
	return nil, false
}

// serve serves b's API on a socket until the test ends and returns a recorder reading it.
func serve(t *testing.T, b rpc.Backend) Recorder {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "agent.sock")
	s, err := rpc.New(rpc.Config{Socket: socket, Log: slog.New(slog.DiscardHandler)}, b)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	c, closer, err := rpc.Dial(ctx, rpc.DialConfig{Socket: socket})
	if err != nil {
		t.Fatal(err)
	}
	rec := FromAgent(c, closer)
	t.Cleanup(func() { rec.Close() })
	return rec
}

// Reports the agent's list left out (to bound its reply) are fetched one by one: the CLI's
// list has every incident whole; one incident asked for by id is fetched alone.
func TestRemoteIncidentsWhole(t *testing.T) {
	b := &incidentsOnly{}
	opened := time.Date(2026, 12, 6, 1, 0, 0, 0, time.UTC)
	for i := range 300 {
		b.incidents = append(b.incidents, &agentv1.Incident{Id: fmt.Sprintf("inc-%03d", 300-i), Opened: timestamppb.New(opened.Add(-time.Duration(i) * time.Minute)),
			Trigger: "oom_kill", State: "closed", WindowFrom: timestamppb.New(opened), WindowTo: timestamppb.New(opened),
			BaselineFrom: timestamppb.New(opened), BaselineTo: timestamppb.New(opened),
			Report: &agentv1.Report{Run: &agentv1.RunInfo{Id: "agent"}, Notes: []string{strings.Repeat("n", 20<<10)}}})
	}
	rec := serve(t, b)
	list, err := rec.Incidents(context.Background(), time.Time{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 300 {
		t.Fatalf("%d incidents, want 300", len(list))
	}
	for _, in := range list {
		if in.Report == nil || len(in.Report.Notes) != 1 {
			t.Fatalf("incident %s has no whole report", in.ID)
		}
	}
	t.Logf("%d reports fetched alone", b.gets)
	if b.gets == 0 || b.gets == 300 {
		t.Errorf("%d of 300 reports fetched alone: want those the list left out", b.gets)
	}
	b.gets = 0
	if in, ok, err := rec.Incident(context.Background(), "inc-007"); err != nil || !ok || in.ID != "inc-007" || b.gets != 1 {
		t.Errorf("Incident(inc-007): %s %v %v after %d gets", in.ID, ok, err, b.gets)
	}
	if _, ok, err := rec.Incident(context.Background(), "inc-999"); err != nil || ok {
		t.Errorf("Incident of an unknown id: %v %v", ok, err)
	}

	// More than a reply holds even without reports: an error that says what to do.
	for i := range b.incidents {
		b.incidents[i].Report = nil
	}
	for len(b.incidents) < rpc.MaxListLimit {
		b.incidents = append(b.incidents, &agentv1.Incident{Id: fmt.Sprintf("old-%05d", len(b.incidents)), Cgroup: "/" + strings.Repeat("c", 400)})
	}
	if _, err := rec.Incidents(context.Background(), time.Time{}, 0); err == nil || !strings.Contains(err.Error(), "--limit") {
		t.Errorf("listing more than a reply holds: %v, want an error naming --limit", err)
	}
}
