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
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nodectl/nodectl/agent/recorded"
	"github.com/nodectl/nodectl/analyzer"
	"github.com/nodectl/nodectl/internal/atomicfile"
)

// Bounds on incidents, so that a node in trouble for days does not fill the disk or memory
// with them: open at once (more triggers are counted as suppressed) and kept (the oldest closed
// ones go first, and their pins with them).
const (
	maxOpenIncidents = 16
	maxKeptIncidents = 500
)

// maxAnalysisAttempts is how many times an incident's analysis is begun: one that killed the
// agent that many times (its memory limit, a crash) is closed as failed rather than analyzed
// at every start, a crash loop of the node's agent.
const maxAnalysisAttempts = 3

// incidents opens, analyzes and keeps the incidents. It is safe for concurrent use.
type incidents struct {
	dir     string
	windows recorded.Windows
	log     *slog.Logger
	// pin and unpin protect a window in the flight recorder; analyze runs the analyzer on a
	// window; publish tells the API's subscribers; oldest is the oldest data kept.
	pin     func(id string, from, to time.Time) error
	unpin   func(id string) error
	analyze func(recorded.Window) (*analyzer.Report, error)
	publish func(recorded.Incident)
	oldest  func() time.Time

	mu         sync.Mutex
	all        map[string]*recorded.Incident
	seq        int
	suppressed uint64
	opened     map[string]uint64 // by trigger, since the agent started: a counter never going down
	work       chan string       // ids whose window closed, for the one analysis worker
}

// recorded.IncidentsDir is where the data directory keeps them.

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
	given, err := m.read()
	for _, in := range given {
		m.log.Warn("an incident's analysis never ended; not tried again", "id", in.ID, "attempts", in.Attempts)
		m.save(in)
	}
	return err
}

// read reads the incidents in dir without writing anything; one a previous agent left
// analyzing is open again, unless its analysis was begun maxAnalysisAttempts times: those are
// closed as failed, and returned to be saved so.
func (m *incidents) read() (givenUp []*recorded.Incident, err error) {
	m.all = map[string]*recorded.Incident{}
	m.work = make(chan string, maxOpenIncidents+maxKeptIncidents)
	all, err := recorded.LoadIncidents(m.dir, m.log)
	if err != nil {
		return nil, err
	}
	for _, in := range all {
		if in.State == recorded.StateAnalyzing {
			in.State = recorded.StateOpen
			if in.Attempts >= maxAnalysisAttempts {
				in.State = recorded.StateClosed
				in.AnalysisError = fmt.Sprintf("its analysis was begun %d times and never ended (the agent died in it: out of memory, or a crash); not tried again", in.Attempts)
				givenUp = append(givenUp, in)
			}
		}
		m.all[in.ID] = in
	}
	return givenUp, nil
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

func (m *incidents) openFor(trigger, cgroup string) *recorded.Incident {
	for _, in := range m.all {
		if in.State == recorded.StateOpen && in.Trigger == trigger && in.Cgroup == cgroup {
			return in
		}
	}
	return nil
}

func (m *incidents) countOpen() int {
	n := 0
	for _, in := range m.all {
		if in.State != recorded.StateClosed {
			n++
		}
	}
	return n
}

// open makes the incident of f, its window clipped to the data kept, and pins it.
func (m *incidents) open(f firing) *recorded.Incident {
	m.seq++
	id := fmt.Sprintf("%s-%s-%d", f.Time.UTC().Format("20060102-150405"), f.Trigger, m.seq)
	for m.all[id] != nil {
		m.seq++
		id = fmt.Sprintf("%s-%s-%d", f.Time.UTC().Format("20060102-150405"), f.Trigger, m.seq)
	}
	in := &recorded.Incident{ID: id, Opened: f.Time, Trigger: f.Trigger, Cgroup: f.Cgroup, Workload: f.Workload, Evidence: f.Evidence, State: recorded.StateOpen,
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
		if in.State == recorded.StateOpen && !now.Before(in.WindowTo) {
			select {
			case m.work <- in.ID:
			default:
				continue // the worker is behind (many loaded at start): a later tick hands it on
			}
			in.State = recorded.StateAnalyzing
			m.save(in)
			m.publish(*in)
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
			var w recorded.Window
			if in != nil {
				w = in.Window()
				in.Attempts++
				m.save(in) // before it begins: an analysis that kills the agent counts
			}
			m.mu.Unlock()
			if in == nil {
				continue
			}
			report, err := m.analyzeSafely(id, w)
			if errors.Is(err, recorded.ErrStopped) {
				// The agent is stopping: the next one analyzes it (load reopens it).
				return
			}
			m.mu.Lock()
			in.State, in.Report = recorded.StateClosed, report
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

// analyzeSafely is analyze with a panic turned into the analysis's error: a window that
// trips a bug closes its incident, it does not take the node's agent down.
func (m *incidents) analyzeSafely(id string, w recorded.Window) (rep *analyzer.Report, err error) {
	defer func() {
		if r := recover(); r != nil {
			m.log.Error("incident analysis panicked", "id", id, "panic", r, "stack", string(debug.Stack()))
			rep, err = nil, fmt.Errorf("the analysis panicked: %v", r)
		}
	}()
	return m.analyze(w)
}

// evict removes the oldest closed incidents past maxKeptIncidents, with their pins.
func (m *incidents) evict() {
	if len(m.all) <= maxKeptIncidents {
		return
	}
	var closed []*recorded.Incident
	for _, in := range m.all {
		if in.State == recorded.StateClosed {
			closed = append(closed, in)
		}
	}
	slices.SortFunc(closed, func(a, b *recorded.Incident) int { return a.Opened.Compare(b.Opened) })
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
func (m *incidents) save(in *recorded.Incident) {
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
func (m *incidents) list(since time.Time, limit int) []recorded.Incident {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []recorded.Incident
	for _, in := range m.all {
		if !in.Opened.Before(since) {
			out = append(out, *in)
		}
	}
	slices.SortFunc(out, func(a, b recorded.Incident) int {
		return cmp.Or(b.Opened.Compare(a.Opened), strings.Compare(a.ID, b.ID))
	})
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out
}

func (m *incidents) get(id string) (recorded.Incident, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	in, ok := m.all[id]
	if !ok {
		return recorded.Incident{}, false
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
		if in.State != recorded.StateClosed {
			open[in.Trigger]++
		}
	}
	return opened, open
}
