package agent

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodectl/nodectl/agent/recorded"
	"github.com/nodectl/nodectl/analyzer"
)

// testIncidents is an incidents manager over dir whose analysis is analyze.
func testIncidents(t *testing.T, dir string, analyze func(recorded.Window) (*analyzer.Report, error)) *incidents {
	t.Helper()
	m := &incidents{dir: dir, windows: recorded.DefaultWindows, log: slog.New(slog.DiscardHandler),
		pin:     func(string, time.Time, time.Time) error { return nil },
		unpin:   func(string) error { return nil },
		analyze: analyze, publish: func(recorded.Incident) {}, oldest: func() time.Time { return time.Time{} }}
	if err := m.load(); err != nil {
		t.Fatal(err)
	}
	return m
}

// writeIncident writes an incident's file as an agent would have left it.
func writeIncident(t *testing.T, dir string, in recorded.Incident) {
	t.Helper()
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, in.ID+".json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func incidentAt(id string, state string, attempts int) recorded.Incident {
	at := time.Date(2026, 12, 5, 3, 0, 0, 0, time.UTC)
	return recorded.Incident{ID: id, Opened: at, Trigger: TriggerRunqStall, State: state, Attempts: attempts,
		BaselineFrom: at.Add(-time.Minute), WindowFrom: at.Add(-10 * time.Second), WindowTo: at.Add(10 * time.Second)}
}

// An analysis that panics closes its incident with the panic as its error, and the worker goes
// on to the next one: the node's agent does not fall over on a window that trips a bug.
func TestIncidentAnalysisPanicClosesIt(t *testing.T) {
	dir := t.TempDir()
	var mu sync.Mutex
	calls := 0
	m := testIncidents(t, dir, func(recorded.Window) (*analyzer.Report, error) {
		mu.Lock()
		calls++
		n := calls
		mu.Unlock()
		if n == 1 {
			var nilMap map[string]int
			nilMap["boom"]++
		}
		return &analyzer.Report{}, nil
	})
	now := time.Now()
	m.fire([]firing{{Time: now.Add(-time.Hour), Trigger: TriggerRunqStall, Cgroup: "/a"}, {Time: now.Add(-time.Hour), Trigger: TriggerRunqStall, Cgroup: "/b"}})
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() { m.analyzeLoop(done); close(stopped) }()
	defer func() { close(done); <-stopped }()
	m.tick(now)
	var list []recorded.Incident
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if list = m.list(time.Time{}, 0); len(list) == 2 && list[0].State == recorded.StateClosed && list[1].State == recorded.StateClosed {
			break
		}
	}
	panicked, analyzed := 0, 0
	for _, in := range list {
		switch {
		case in.State != recorded.StateClosed:
			t.Errorf("incident %s still %s", in.ID, in.State)
		case strings.Contains(in.AnalysisError, "the analysis panicked: assignment to entry in nil map"):
			panicked++
		case in.AnalysisError == "" && in.Report != nil:
			analyzed++
		}
		if in.Attempts != 1 {
			t.Errorf("incident %s: %d attempts, want 1", in.ID, in.Attempts)
		}
	}
	if panicked != 1 || analyzed != 1 {
		t.Errorf("%d closed by a panic and %d analyzed, want 1 of each: %+v", panicked, analyzed, list)
	}
}

// An incident left analyzing by agents that died in its analysis is begun again only until
// maxAnalysisAttempts, then closed as failed, on disk too.
func TestIncidentAnalysisAttemptsAreBounded(t *testing.T) {
	dir := t.TempDir()
	writeIncident(t, dir, incidentAt("again", recorded.StateAnalyzing, maxAnalysisAttempts-1))
	writeIncident(t, dir, incidentAt("poisoned", recorded.StateAnalyzing, maxAnalysisAttempts))
	m := testIncidents(t, dir, nil)
	if in, _ := m.get("again"); in.State != recorded.StateOpen {
		t.Errorf("an incident begun %d times is %s, want open for another attempt", in.Attempts, in.State)
	}
	in, _ := m.get("poisoned")
	if in.State != recorded.StateClosed || !strings.Contains(in.AnalysisError, fmt.Sprintf("begun %d times and never ended", maxAnalysisAttempts)) {
		t.Errorf("an incident begun %d times: %s, %q; want closed as failed", in.Attempts, in.State, in.AnalysisError)
	}
	kept, err := recorded.LoadIncidents(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if kept["poisoned"].State != recorded.StateClosed {
		t.Errorf("the poisoned incident is %s on disk, want closed", kept["poisoned"].State)
	}
}

// More incidents due than the worker's queue holds (an agent loading many left open) do not
// block the tick, which holds the manager's lock the worker needs: the rest wait for a later
// tick.
func TestIncidentTickNeverBlocksOnAFullQueue(t *testing.T) {
	dir := t.TempDir()
	const n = 12
	for i := range n {
		writeIncident(t, dir, incidentAt(fmt.Sprint("open-", i), recorded.StateOpen, 0))
	}
	m := testIncidents(t, dir, nil)
	m.work = make(chan string, 4) // a short queue: each incident handed on is saved, with an fsync
	ticked := make(chan struct{})
	go func() { m.tick(time.Now()); close(ticked) }()
	select {
	case <-ticked:
	case <-time.After(10 * time.Second):
		t.Fatal("tick blocked on the full queue")
	}
	queued := 0
	for _, in := range m.list(time.Time{}, 0) {
		if in.State == recorded.StateAnalyzing {
			queued++
		}
	}
	if queued != cap(m.work) {
		t.Errorf("%d of %d incidents handed to the worker, want the queue's %d", queued, n, cap(m.work))
	}
}
