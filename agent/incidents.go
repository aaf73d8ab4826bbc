package agent

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nodectl/nodectl/internal/atomicfile"
	"github.com/nodectl/nodectl/internal/badvalue"
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
	// Report is the analyzer's JSON report of the window against the baseline.
	Report        json.RawMessage `json:"report,omitempty"`
	AnalysisError string          `json:"analysis_error,omitempty"`
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

// Bounds on incidents, so that a node in trouble for days does not fill the disk or memory
// with them: open at once (more triggers are counted as suppressed) and kept (the oldest closed
// ones go first, and their pins with them).
const (
	maxOpenIncidents = 16
	maxKeptIncidents = 500
)

// incidents opens, analyzes and keeps the incidents. It is safe for concurrent use.
type incidents struct {
	dir     string
	windows Windows
	log     *slog.Logger
	// pin and unpin protect a window in the flight recorder; analyze runs the analyzer on a
	// window; publish tells the API's subscribers; oldest is the oldest data kept.
	pin     func(id string, from, to time.Time) error
	unpin   func(id string) error
	analyze func(Window) (json.RawMessage, error)
	publish func(Incident)
	oldest  func() time.Time

	mu         sync.Mutex
	all        map[string]*Incident
	seq        int
	suppressed uint64
	opened     map[string]uint64 // by trigger, since the agent started: a counter never going down
	work       chan string       // ids whose window closed, for the one analysis worker
}

// incidentsDir is where the data directory keeps them.
const incidentsDir = "incidents"

// load reads the incidents kept in dir, after removing the half-written ones a crash left;
// one left open or analyzing by a previous agent is analyzed again once its window has passed.
func (m *incidents) load() error {
	if err := os.MkdirAll(m.dir, 0o700); err != nil {
		return fmt.Errorf("incidents: %w", err)
	}
	entries, err := os.ReadDir(m.dir)
	if err != nil {
		return fmt.Errorf("incidents: %w", err)
	}
	for _, e := range entries {
		if atomicfile.Pending(e.Name()) {
			if err := os.Remove(filepath.Join(m.dir, e.Name())); err != nil {
				m.log.Warn("removing a half-written incident", "file", e.Name(), "err", err)
			}
		}
	}
	return m.read()
}

// read reads the incidents in dir without writing anything.
func (m *incidents) read() error {
	m.all = map[string]*Incident{}
	m.work = make(chan string, maxOpenIncidents+maxKeptIncidents)
	entries, err := os.ReadDir(m.dir)
	if err != nil {
		return fmt.Errorf("incidents: %w", err)
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(m.dir, e.Name()))
		var in Incident
		if err == nil {
			err = json.Unmarshal(b, &in)
		}
		if err != nil || in.ID == "" {
			m.log.Warn("skipping an unreadable incident", "file", e.Name(), "err", err)
			continue
		}
		if in.State == StateAnalyzing {
			in.State = StateOpen
		}
		m.all[in.ID] = &in
	}
	return nil
}

// fire opens an incident for each firing that has none open for its trigger and cgroup.
func (m *incidents) fire(fs []firing) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, f := range fs {
		if in := m.openFor(f.Trigger, f.Cgroup); in != nil {
			in.Repeats++
			continue
		}
		if m.countOpen() >= maxOpenIncidents {
			m.suppressed++
			continue
		}
		in := m.open(f)
		if m.opened == nil {
			m.opened = map[string]uint64{}
		}
		m.opened[f.Trigger]++
		m.log.Info("incident opened", "id", in.ID, "trigger", in.Trigger, "cgroup", in.Cgroup, "workload", in.Workload, "evidence", in.Evidence)
		m.save(in)
		m.publish(*in)
	}
}

func (m *incidents) openFor(trigger, cgroup string) *Incident {
	for _, in := range m.all {
		if in.State == StateOpen && in.Trigger == trigger && in.Cgroup == cgroup {
			return in
		}
	}
	return nil
}

func (m *incidents) countOpen() int {
	n := 0
	for _, in := range m.all {
		if in.State != StateClosed {
			n++
		}
	}
	return n
}

// open makes the incident of f, its window clipped to the data kept, and pins it.
func (m *incidents) open(f firing) *Incident {
	m.seq++
	id := fmt.Sprintf("%s-%s-%d", f.Time.UTC().Format("20060102-150405"), f.Trigger, m.seq)
	for m.all[id] != nil {
		m.seq++
		id = fmt.Sprintf("%s-%s-%d", f.Time.UTC().Format("20060102-150405"), f.Trigger, m.seq)
	}
	in := &Incident{ID: id, Opened: f.Time, Trigger: f.Trigger, Cgroup: f.Cgroup, Workload: f.Workload, Evidence: f.Evidence, State: StateOpen,
		WindowFrom: f.Time.Add(-m.windows.Before), WindowTo: f.Time.Add(m.windows.After)}
	in.BaselineFrom = in.WindowFrom.Add(-m.windows.Baseline)
	// The quiet stretch before is what the agent has: it may have started just before.
	if oldest := m.oldest(); !oldest.IsZero() {
		if in.BaselineFrom.Before(oldest) {
			in.BaselineFrom = oldest
		}
		if in.WindowFrom.Before(in.BaselineFrom) {
			in.WindowFrom = in.BaselineFrom
		}
	}
	if err := m.pin(id, in.BaselineFrom, in.WindowTo); err != nil {
		m.log.Warn("could not pin an incident's window", "id", id, "err", err)
	}
	m.all[id] = in
	return in
}

// tick hands the incidents whose window has passed to the analysis worker.
func (m *incidents) tick(now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, in := range m.all {
		if in.State == StateOpen && !now.Before(in.WindowTo) {
			in.State = StateAnalyzing
			m.save(in)
			m.publish(*in)
			m.work <- in.ID
		}
	}
}

// analyzeLoop runs the analyses one at a time until done is closed, so that a burst of
// incidents costs one core at most.
func (m *incidents) analyzeLoop(done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case id := <-m.work:
			m.mu.Lock()
			in := m.all[id]
			var w Window
			if in != nil {
				w = in.Window()
			}
			m.mu.Unlock()
			if in == nil {
				continue
			}
			report, err := m.analyze(w)
			if errors.Is(err, ErrStopped) {
				// The agent is stopping: the next one analyzes it (load reopens it).
				return
			}
			m.mu.Lock()
			in.State, in.Report = StateClosed, report
			if err != nil {
				in.AnalysisError = err.Error()
				m.log.Warn("incident analysis failed", "id", id, "err", err)
			} else {
				m.log.Info("incident analyzed", "id", id)
			}
			m.save(in)
			m.publish(*in)
			m.evict()
			m.mu.Unlock()
		}
	}
}

// evict removes the oldest closed incidents past maxKeptIncidents, with their pins.
func (m *incidents) evict() {
	if len(m.all) <= maxKeptIncidents {
		return
	}
	var closed []*Incident
	for _, in := range m.all {
		if in.State == StateClosed {
			closed = append(closed, in)
		}
	}
	slices.SortFunc(closed, func(a, b *Incident) int { return a.Opened.Compare(b.Opened) })
	for _, in := range closed[:min(len(closed), len(m.all)-maxKeptIncidents)] {
		delete(m.all, in.ID)
		if err := errors.Join(os.Remove(m.path(in.ID)), m.unpin(in.ID)); err != nil {
			m.log.Warn("removing an old incident", "id", in.ID, "err", err)
		}
	}
}

func (m *incidents) path(id string) string { return filepath.Join(m.dir, id+".json") }

// save replaces in's file whole (internal/atomicfile); a failure (a full disk) is logged: the
// incident lives on in memory and is saved at its next change.
func (m *incidents) save(in *Incident) {
	b, err := json.MarshalIndent(in, "", "  ")
	if err == nil {
		err = atomicfile.Write(m.path(in.ID), b, 0o600)
	}
	if err != nil {
		m.log.Warn("saving an incident", "id", in.ID, "err", err)
	}
}

// list returns copies of the incidents opened at or after since, newest first, at most limit
// (0: all).
func (m *incidents) list(since time.Time, limit int) []Incident {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Incident
	for _, in := range m.all {
		if !in.Opened.Before(since) {
			out = append(out, *in)
		}
	}
	slices.SortFunc(out, func(a, b Incident) int { return cmp.Or(b.Opened.Compare(a.Opened), strings.Compare(a.ID, b.ID)) })
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out
}

func (m *incidents) get(id string) (Incident, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	in, ok := m.all[id]
	if !ok {
		return Incident{}, false
	}
	return *in, true
}

// counts are the open incidents, all kept, and the triggers suppressed past maxOpenIncidents.
func (m *incidents) counts() (open, total int, suppressed uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.countOpen(), len(m.all), m.suppressed
}

// byTrigger is, by trigger, the incidents opened since the agent started and those open now.
func (m *incidents) byTrigger() (opened map[string]uint64, open map[string]int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	opened, open = maps.Clone(m.opened), map[string]int{}
	for _, in := range m.all {
		if in.State != StateClosed {
			open[in.Trigger]++
		}
	}
	return opened, open
}

// ReadIncidents reads the incidents kept in a data directory, for a post-mortem without the
// agent, newest first.
func ReadIncidents(dataDir string) ([]Incident, error) {
	m := &incidents{dir: filepath.Join(dataDir, incidentsDir), log: slog.New(slog.DiscardHandler)}
	if _, err := os.Stat(m.dir); err != nil {
		return nil, fmt.Errorf("no incidents in %s: %w", dataDir, err)
	}
	if err := m.read(); err != nil {
		return nil, err
	}
	return m.list(time.Time{}, 0), nil
}
