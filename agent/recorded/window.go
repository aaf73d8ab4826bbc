package recorded

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/nodectl/nodectl/agent/flightrec"
	"github.com/nodectl/nodectl/rundir"
)

// Source is the flight recorder read: the live store, or a data directory read offline.
type Source interface {
	Read(from, to time.Time, step time.Duration, fn func(rundir.Record) error) error
}

// seriesSource is a Source that leaves out, undecoded, the series a read does not keep (the
// flight recorder): an incident's reads then cost what they keep, not what the node's churn
// left in the window.
type seriesSource interface {
	ReadSeries(from, to time.Time, step time.Duration, keep flightrec.Keep, fn func(rundir.Record) error) error
}

// readSeries reads src's samples that keep admits (nil: all) and every event.
func readSeries(src Source, from, to time.Time, step time.Duration, keep flightrec.Keep, fn func(rundir.Record) error) error {
	if keep == nil {
		return src.Read(from, to, step, fn)
	}
	if s, ok := src.(seriesSource); ok {
		return s.ReadSeries(from, to, step, keep, fn)
	}
	return src.Read(from, to, step, func(r rundir.Record) error {
		if r.Type == rundir.TypeSample && !keep(r.Cgroup, r.Metric) {
			return nil
		}
		return fn(r)
	})
}

// Window is a stretch of the flight recorder to analyze or export: the window examined, from
// From to To, against the baseline from BaselineFrom to From.
type Window struct {
	BaselineFrom, From, To time.Time
	// Cgroup, if set, is the cgroup under examination (an incident's): a workload of kind
	// observed. Without it the analyzer examines every cgroup whose waits rose.
	Cgroup string
	// Step reads the recorder at ticks at least this far apart; 0 reads every tick for an
	// export and at most Ticks a phase for the analyzer.
	Step time.Duration
	// Ticks bounds the ticks each phase is read at for the analyzer; 0 is analysisTicks,
	// AllTicks every tick recorded (a run of pods, whose window is its whole run).
	Ticks int
	// Stop, if set, ends a read under way when it is closed (an agent shutting down).
	Stop <-chan struct{}
	// Cgroups, if set, are the cgroups whose samples the analyzer's read keeps (an incident's
	// focus); the node's samples and every event are kept whatever it says.
	Cgroups map[string]bool
}

// AllTicks as a Window's Ticks reads every tick the recorder holds.
const AllTicks = -1

// ErrStopped is a window's read ended by its Stop.
var ErrStopped = errors.New("reading the window: stopped")

// analysisTicks bounds the ticks each phase (the baseline, the window) is read at for the
// analyzer: a longer phase is read every phase/analysisTicks. Counters stay exact at every tick
// read and at both edges of each phase, which is what the rules compare; gauges are read that
// much more coarsely, still 60 readings a phase. It keeps an hour of 1,000 cgroups within the
// post-mortem's budget. An export reads every tick unless told a step.
const analysisTicks = 60

// Validate names the bound a window breaks.
func (w Window) Validate() error {
	switch {
	case w.From.IsZero() || w.To.IsZero():
		return fmt.Errorf("window: no start or end")
	case !w.To.After(w.From):
		return fmt.Errorf("window: end %s is not after its start %s", w.To.Format(time.RFC3339), w.From.Format(time.RFC3339))
	case w.BaselineFrom.After(w.From):
		return fmt.Errorf("window: baseline starts at %s, after the window's start", w.BaselineFrom.Format(time.RFC3339))
	case w.Step < 0:
		return fmt.Errorf("window: negative step %v", w.Step)
	}
	return nil
}

// step is the step a phase of that span is read at, for at most ticks ticks (0: every tick).
func (w Window) step(span, interval time.Duration, ticks int) time.Duration {
	if w.Step > 0 {
		return w.Step
	}
	if ticks == 0 || interval <= 0 || span <= time.Duration(ticks)*interval {
		return 0
	}
	return (span / time.Duration(ticks)).Round(interval)
}

// seenPods are the pods a window's read met in pod_info samples, by cgroup: the agent named
// them then, whether or not it still does.
type seenPods map[string]rundir.Pod

// add takes r when it is a pod_info sample, keeping for each cgroup the pod known best (a
// pod's QoS, owner and requests may come a moment after its name).
func (s seenPods) add(r rundir.Record) bool {
	p, ok := rundir.ParsePodInfo(r)
	if !ok {
		return r.Metric == rundir.MetricPodInfo
	}
	if old, ok := s[p.Cgroup]; !ok || known(p) >= known(old) {
		s[p.Cgroup] = p
	}
	return true
}

// known counts the fields of a pod that are set.
func known(p rundir.Pod) int {
	n := 0
	for _, f := range []string{p.Container, p.UID, p.QoS, p.RuntimeClass, p.Handler, p.Owner, p.CPURequest, p.MemoryRequest} {
		if f != "" {
			n++
		}
	}
	return n
}

// meta is the agent's meta for this window: scenario agent, the observed cgroup and the
// daemons the agent followed as workloads, and the pods the agent names now with those seen
// in the window's pod_info samples (gone since, or not).
func (w Window) meta(agent rundir.Meta, seen seenPods) rundir.Meta {
	m := agent
	m.Format = rundir.FormatVersion
	m.Scenario = rundir.ScenarioAgent
	m.ID = "agent-" + w.From.UTC().Format("20060102-150405")
	m.Start = w.BaselineFrom
	pods := slices.Clone(agent.Pods)
	named := map[string]bool{}
	for _, p := range pods {
		named[p.Cgroup] = true
	}
	for _, cg := range slices.Sorted(maps.Keys(seen)) {
		if !named[cg] {
			pods = append(pods, seen[cg])
		}
	}
	m.Pods = pods
	if w.Cgroups != nil {
		// The focus's pods only: the analyzer names what it reads.
		m.Pods = nil
		for _, p := range pods {
			if w.Cgroups[p.Cgroup] {
				m.Pods = append(m.Pods, p)
			}
		}
	}
	var wl []rundir.Workload
	if w.Cgroup != "" {
		name := w.Cgroup
		for _, p := range pods {
			if p.Cgroup == w.Cgroup {
				name = p.Name
			}
		}
		wl = append(wl, rundir.Workload{Name: name, Kind: rundir.KindObserved, Cgroup: w.Cgroup})
	}
	for _, d := range agent.Workloads {
		if d.Kind == rundir.KindDaemon && d.Cgroup != w.Cgroup {
			wl = append(wl, d)
		}
	}
	m.Workloads = wl
	return m
}

// read streams the window's records with its phase records: the baseline from its first tick
// read (so that every series has its reference there) to From, then the window to To. Each
// phase is read on its own, so that both of its edges are ticks read whatever its step.
//
// The baseline's start record is timed at its first tick, known once the baseline is read. With
// a patch function, it is passed first timed at BaselineFrom and patch gets the first tick's
// time at the end of the baseline, for a caller that holds the records to correct it in place;
// without, the baseline is held until then.
func (w Window) read(src Source, interval time.Duration, ticks int, keep flightrec.Keep, fn func(rundir.Record) error, patch func(first time.Time)) error {
	if err := w.Validate(); err != nil {
		return err
	}
	start := rundir.Record{Type: rundir.TypePhase, Time: w.BaselineFrom, Name: rundir.PhaseBaseline, Event: rundir.EventStart}
	if patch != nil {
		if err := fn(start); err != nil {
			return err
		}
	}
	var first time.Time
	var baseline []rundir.Record
	n := 0
	err := readSeries(src, w.BaselineFrom, w.From, w.step(w.From.Sub(w.BaselineFrom), interval, ticks), keep, func(r rundir.Record) error {
		if first.IsZero() || r.Time.Before(first) {
			first = r.Time
		}
		n++
		if patch != nil {
			return fn(r)
		}
		baseline = append(baseline, r)
		return nil
	})
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("the flight recorder has nothing from %s to %s", w.BaselineFrom.Format(time.RFC3339), w.From.Format(time.RFC3339))
	}
	if first.Before(w.BaselineFrom) {
		first = w.BaselineFrom
	}
	if patch != nil {
		patch(first)
	} else {
		start.Time = first
		if err := fn(start); err != nil {
			return err
		}
		for _, r := range baseline {
			if err := fn(r); err != nil {
				return err
			}
		}
		baseline = nil
	}
	for _, p := range []rundir.Record{
		{Type: rundir.TypePhase, Time: w.From, Name: rundir.PhaseBaseline, Event: rundir.EventEnd},
		{Type: rundir.TypePhase, Time: w.From, Name: rundir.PhaseWindow, Event: rundir.EventStart},
	} {
		if err := fn(p); err != nil {
			return err
		}
	}
	// The window's read starts with every series' state at its first tick; its changes since
	// the baseline's last tick (at or before From) count in the window.
	if err := readSeries(src, w.From, w.To, w.step(w.To.Sub(w.From), interval, ticks), keep, fn); err != nil {
		return err
	}
	return fn(rundir.Record{Type: rundir.TypePhase, Time: w.To, Name: rundir.PhaseWindow, Event: rundir.EventEnd})
}

func (w Window) stopped() bool {
	select {
	case <-w.Stop:
		return true
	default:
		return false
	}
}

// Run reads the window into memory, for the analyzer. The records are gathered in blocks and
// joined once: growing one slice of millions of records copies it again and again under the
// garbage collector. (Sizing one slice from the recorder's series was tried for the agent:
// after a churn of cgroups the series counted were many times those a window reads, and the
// room reserved made the agent's RSS 320 MiB.)
func (w Window) Run(src Source, agent rundir.Meta) (*rundir.Run, error) {
	const block = 1 << 16
	var blocks [][]rundir.Record
	n := 0
	ticks := w.Ticks
	switch {
	case ticks == AllTicks:
		ticks = 0
	case ticks <= 0:
		ticks = analysisTicks
	}
	seen := seenPods{}
	add := func(r rundir.Record) error {
		if n%4096 == 0 && w.stopped() {
			return ErrStopped
		}
		if seen.add(r) {
			return nil
		}
		if len(blocks) == 0 || len(blocks[len(blocks)-1]) == block {
			blocks = append(blocks, make([]rundir.Record, 0, block))
		}
		blocks[len(blocks)-1] = append(blocks[len(blocks)-1], r)
		n++
		return nil
	}
	// The baseline's start record is the first of all.
	patch := func(first time.Time) { blocks[0][0].Time = first }
	var keep flightrec.Keep
	if w.Cgroups != nil {
		keep = func(cgroup, _ string) bool { return cgroup == "" || w.Cgroups[cgroup] }
	}
	err := w.read(src, time.Duration(agent.Interval), ticks, keep, add, patch)
	run := &rundir.Run{Meta: w.meta(agent, seen), Records: make([]rundir.Record, 0, n)}
	for i := range blocks {
		run.Records = append(run.Records, blocks[i]...)
		blocks[i] = nil
	}
	return run, err
}

// Export writes the window as a run directory that `analyze` and `diff` read offline.
func (w Window) Export(src Source, agent rundir.Meta, dir string) error {
	out, err := rundir.Create(dir, w.meta(agent, nil))
	if err != nil {
		return err
	}
	const batch = 4096
	buf := make([]rundir.Record, 0, batch)
	seen := seenPods{}
	err = w.read(src, time.Duration(agent.Interval), 0, nil, func(r rundir.Record) error {
		if seen.add(r) {
			return nil
		}
		if buf = append(buf, r); len(buf) == batch {
			err := out.Append(buf...)
			buf = buf[:0]
			return err
		}
		return nil
	}, nil)
	if err == nil {
		err = out.Append(buf...)
	}
	if err == nil && len(seen) > 0 {
		err = out.UpdateMeta(func(m *rundir.Meta) { m.Pods = w.meta(agent, seen).Pods })
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}
