package agentd

import (
	"fmt"
	"time"

	"github.com/nodectl/nodectl/rundir"
)

// Source is the flight recorder read: the live store, or a data directory read offline.
type Source interface {
	Read(from, to time.Time, step time.Duration, fn func(rundir.Record) error) error
}

// Window is a stretch of the flight recorder to analyze or export: the window examined, from
// From to To, against the baseline from BaselineFrom to From.
type Window struct {
	BaselineFrom, From, To time.Time
	// Cgroup, if set, is the cgroup under examination (an incident's): a workload of kind
	// observed. Without it the analyzer examines every cgroup whose waits rose.
	Cgroup string
	// Step reads the recorder at ticks at least this far apart; 0 picks one from the span
	// (every tick up to maxFullTicks of them).
	Step time.Duration
}

// maxFullTicks bounds the ticks a window is read at by default: a longer span is read every
// span/maxFullTicks, which keeps counters exact at each tick read and an hour of 1,000 cgroups
// within the post-mortem's budget.
const maxFullTicks = 1200

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

func (w Window) step(interval time.Duration) time.Duration {
	if w.Step > 0 {
		return w.Step
	}
	span := w.To.Sub(w.BaselineFrom)
	if interval <= 0 || span <= maxFullTicks*interval {
		return 0
	}
	return (span / maxFullTicks).Round(interval)
}

// meta is the agent's meta for this window: scenario agent, the observed cgroup and the
// daemons the agent followed as workloads.
func (w Window) meta(agent rundir.Meta) rundir.Meta {
	m := agent
	m.Format = rundir.FormatVersion
	m.Scenario = rundir.ScenarioAgent
	m.ID = "agent-" + w.From.UTC().Format("20060102-150405")
	m.Start = w.BaselineFrom
	var wl []rundir.Workload
	if w.Cgroup != "" {
		wl = append(wl, rundir.Workload{Name: w.Cgroup, Kind: rundir.KindObserved, Cgroup: w.Cgroup})
	}
	for _, d := range agent.Workloads {
		if d.Kind == rundir.KindDaemon && d.Cgroup != w.Cgroup {
			wl = append(wl, d)
		}
	}
	m.Workloads = wl
	return m
}

// read streams the window's records with its phase records: the baseline from the first tick
// read (so that every series has its reference there) to From, then the window to To.
func (w Window) read(src Source, interval time.Duration, fn func(rundir.Record) error) error {
	if err := w.Validate(); err != nil {
		return err
	}
	started := false
	phase := func(t time.Time, name, event string) error {
		return fn(rundir.Record{Type: rundir.TypePhase, Time: t, Name: name, Event: event})
	}
	err := src.Read(w.BaselineFrom, w.To, w.step(interval), func(r rundir.Record) error {
		if !started {
			started = true
			start := r.Time
			if start.Before(w.BaselineFrom) {
				start = w.BaselineFrom
			}
			if start.After(w.From) {
				start = w.From
			}
			if err := phase(start, rundir.PhaseBaseline, rundir.EventStart); err != nil {
				return err
			}
		}
		return fn(r)
	})
	if err != nil {
		return err
	}
	if !started {
		return fmt.Errorf("the flight recorder has nothing from %s to %s", w.BaselineFrom.Format(time.RFC3339), w.To.Format(time.RFC3339))
	}
	for _, p := range []rundir.Record{
		{Type: rundir.TypePhase, Time: w.From, Name: rundir.PhaseBaseline, Event: rundir.EventEnd},
		{Type: rundir.TypePhase, Time: w.From, Name: rundir.PhaseWindow, Event: rundir.EventStart},
		{Type: rundir.TypePhase, Time: w.To, Name: rundir.PhaseWindow, Event: rundir.EventEnd},
	} {
		if err := fn(p); err != nil {
			return err
		}
	}
	return nil
}

// Run reads the window into memory, for the analyzer.
func (w Window) Run(src Source, agent rundir.Meta) (*rundir.Run, error) {
	run := &rundir.Run{Meta: w.meta(agent)}
	err := w.read(src, time.Duration(agent.Interval), func(r rundir.Record) error {
		run.Records = append(run.Records, r)
		return nil
	})
	return run, err
}

// Export writes the window as a run directory that `analyze` and `diff` read offline.
func (w Window) Export(src Source, agent rundir.Meta, dir string) error {
	out, err := rundir.Create(dir, w.meta(agent))
	if err != nil {
		return err
	}
	const batch = 4096
	buf := make([]rundir.Record, 0, batch)
	err = w.read(src, time.Duration(agent.Interval), func(r rundir.Record) error {
		if buf = append(buf, r); len(buf) == batch {
			err := out.Append(buf...)
			buf = buf[:0]
			return err
		}
		return nil
	})
	if err == nil {
		err = out.Append(buf...)
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}
