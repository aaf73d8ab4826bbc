package recorded

import (
	"cmp"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nodectl/nodectl/analyzer"
	"github.com/nodectl/nodectl/internal/badvalue"
)

// Settings of the incident windows, as badvalue names them (the CLI maps them to its flags).
const (
	FieldBefore   = "Windows.Before"
	FieldAfter    = "Windows.After"
	FieldBaseline = "Windows.Baseline"
)

// Incident states.
const (
	StateOpen      = "open"      // its window is still being recorded
	StateAnalyzing = "analyzing" // the window closed; the analyzer runs on it
	StateClosed    = "closed"    // analyzed: Report (or AnalysisError) is final
)

// Incident is a trigger that fired, the window around it and, once that closed, the analyzer's
// report on it. It is kept as JSON in the data directory's incidents/ and served by the API.
type Incident struct {
	ID       string    `json:"id"`
	Opened   time.Time `json:"opened"`
	Trigger  string    `json:"trigger"`
	Cgroup   string    `json:"cgroup,omitempty"`   // empty for the node
	Workload string    `json:"workload,omitempty"` // the cgroup's daemon or pod (namespace/pod[/container]), when known
	Evidence string    `json:"evidence"`           // the first evidence
	// Repeats counts the same trigger in the same cgroup again while the window was open.
	Repeats      int       `json:"repeats,omitempty"`
	BaselineFrom time.Time `json:"baseline_from"`
	WindowFrom   time.Time `json:"window_from"`
	WindowTo     time.Time `json:"window_to"`
	State        string    `json:"state"`
	// Report is the analyzer's report of the window against the baseline.
	Report        *analyzer.Report `json:"report,omitempty"`
	AnalysisError string           `json:"analysis_error,omitempty"`
	// Attempts counts the analyses begun, saved before each: one the agent died in (out of
	// memory, a crash) is begun again by the next agent only a few times.
	Attempts int `json:"attempts,omitempty"`
}

// Where names what the incident fired for: its workload (a daemon, a pod) with its cgroup, else
// its cgroup's path, else the node.
func (in *Incident) Where() string {
	switch {
	case in.Workload != "" && in.Cgroup != "":
		return in.Workload + " (" + in.Cgroup + ")"
	case in.Cgroup == "":
		return "the node"
	}
	return in.Cgroup
}

// Window is the incident's window for the analyzer and exports.
func (in *Incident) Window() Window {
	return Window{BaselineFrom: in.BaselineFrom, From: in.WindowFrom, To: in.WindowTo, Cgroup: in.Cgroup}
}

// Windows configures the window around an incident.
type Windows struct {
	Before   time.Duration // of the window, before the trigger
	After    time.Duration // after it: the analysis runs once this has passed
	Baseline time.Duration // the quiet stretch before the window it is compared with
}

// DefaultWindows: a minute before and after the trigger, against the two minutes before that.
var DefaultWindows = Windows{Before: time.Minute, After: time.Minute, Baseline: 2 * time.Minute}

// Validate names a bad duration.
func (w Windows) Validate() error {
	switch {
	case w.Before < 0:
		return badvalue.Errorf(FieldBefore, w.Before.String(), "must not be negative")
	case w.After <= 0:
		return badvalue.Errorf(FieldAfter, w.After.String(), "must be more than 0")
	case w.Baseline <= 0:
		return badvalue.Errorf(FieldBaseline, w.Baseline.String(), "must be more than 0")
	}
	return nil
}

// IncidentsDir is where a data directory keeps the incidents, one JSON file each.
const IncidentsDir = "incidents"

// LoadIncidents reads the incidents kept in dir, by id, skipping (and logging) an unreadable
// one; it writes nothing.
func LoadIncidents(dir string, log *slog.Logger) (map[string]*Incident, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("incidents: %w", err)
	}
	all := map[string]*Incident{}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		var in Incident
		if err == nil {
			err = json.Unmarshal(b, &in)
		}
		if err != nil || in.ID == "" {
			log.Warn("skipping an unreadable incident", "file", e.Name(), "err", err)
			continue
		}
		all[in.ID] = &in
	}
	return all, nil
}

// Newest sorts incidents newest first (ties by id).
func Newest(list []Incident) {
	slices.SortFunc(list, func(a, b Incident) int { return cmp.Or(b.Opened.Compare(a.Opened), strings.Compare(a.ID, b.ID)) })
}

// ReadIncidents reads the incidents kept in a data directory, for a post-mortem without the
// agent, newest first.
func ReadIncidents(dataDir string) ([]Incident, error) {
	dir := filepath.Join(dataDir, IncidentsDir)
	if _, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("no incidents in %s: %w", dataDir, err)
	}
	all, err := LoadIncidents(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, err
	}
	out := make([]Incident, 0, len(all))
	for _, in := range all {
		out = append(out, *in)
	}
	Newest(out)
	return out, nil
}
