// Package session assembles a recording: the tracer, the cgroup and node samplers, a scenario's
// own sources, and the collector that reads them every interval and appends what they return.
// `nodectl record`, every stress scenario and the agent start one; none wires these parts itself.
package session

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nodectl/nodectl/host"
	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/record/collect"
	"github.com/nodectl/nodectl/record/sample"
	"github.com/nodectl/nodectl/record/trace"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

// DefaultMaxCgroups bounds the cgroups a session follows when it is not told which to sample.
const DefaultMaxCgroups = 1000

// Names of the session's own sources, in warnings about a failing one.
const (
	sourceTrace   = "trace"
	sourceCgroups = "cgroups"
	sourceNode    = "node"
)

// Config says what a session records.
type Config struct {
	Host     host.FS
	Layout   *cgroup.Layout
	Interval time.Duration // 0 = 1s

	// Trace loads the tracer's Programs (nil: all of them); Resolver names its cgroup ids (nil:
	// a new one; pass one shared with code that makes cgroups while the session runs).
	Trace    bool
	Programs []string
	Resolver *cgroup.Resolver

	// Cgroups lists the cgroups the cgroup sampler reads each interval. Nil follows the cgroups
	// the tracer and the other sources name, in order of first appearance, at most MaxCgroups
	// (0 = DefaultMaxCgroups) of them, so that a node of thousands of cgroups stays cheap.
	Cgroups    func() []string
	MaxCgroups int
	// Exists tells the follower which of its cgroups are gone; nil: a CgroupExists of its own
	// (pass one shared with another look at the same cgroups, made with Resolver).
	Exists func(string) bool
	// Priority picks, of the sampled cgroups, those whose costlier files are read in full at
	// every interval, not in the sampler's rotation; nil: none.
	Priority func(cgroup string) bool
	// Devices are the disks (MAJ:MIN) whose diskstats the node sampler records; nil: all.
	Devices func() []string
	// Sources are a scenario's own, read with the others at every interval and snapshot.
	Sources map[string]collect.Source
	// Observe, if set, sees every batch appended (progress display).
	Observe func([]rundir.Record)
	Log     *slog.Logger // nil = discard
}

// Session is a running recording.
type Session struct {
	tracer    *trace.Tracer
	status    map[string]string
	collector *collect.Collector
	follower  *follower // nil when told which cgroups to sample
	stop      func()    // stops Background; nil when not running
}

// New loads the tracer (when cfg.Trace) and assembles the sources; nothing is read until
// Snapshot, Run or Background. Close releases what it loaded.
func New(cfg Config, out collect.Appender) (*Session, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.MaxCgroups <= 0 {
		cfg.MaxCgroups = DefaultMaxCgroups
	}
	s := &Session{status: map[string]string{}}
	var ran map[string]bool  // cgroups the tracer saw run since the last collection; nil: no tracer
	var busy map[string]bool // of those, the ones to read however little CPU they used (busyWait)
	sources := maps.Clone(cfg.Sources)
	if sources == nil {
		sources = map[string]collect.Source{}
	}
	var res *cgroup.Resolver // the tracer's
	if cfg.Trace {
		res = cfg.Resolver
		if res == nil {
			res = cgroup.NewResolver(cfg.Layout)
		}
		t, err := trace.New(trace.Config{CgroupV1: cfg.Layout.V1, Programs: cfg.Programs, Sysfs: cfg.Host.Sysfs, Tracefs: cfg.Host.Tracefs, Procfs: cfg.Host.Procfs},
			res, cfg.Log.With("component", "trace"))
		if err != nil {
			return nil, fmt.Errorf("starting the tracer: %w", err)
		}
		s.tracer = t
		s.status = t.Status()
		ran, busy = map[string]bool{}, map[string]bool{}
		if cfg.Programs != nil {
			// A program left out on purpose is no missing evidence.
			maps.DeleteFunc(s.status, func(prog, _ string) bool { return !slices.Contains(cfg.Programs, prog) })
		}
		// The tracer's snapshots are full; the recording keeps what changed. The cgroups that
		// may have used CPU since the last collection are those a task of which was switched
		// to (their run-queue histogram changed) and those on a CPU at the last one: the tracer
		// samples first, and the cgroup sampler reads the CPU and memory counters of those.
		var changes collect.Changes
		var running, parents []string
		waits := lastWaits{}
		sources[sourceTrace] = traceSource(func(now time.Time, full bool) ([]rundir.Record, error) {
			snapshot := t.Snapshot
			if full {
				snapshot = t.SnapshotFull
			}
			snap, err := snapshot(now)
			changed := changes.Filter(snap.Samples)
			clear(ran)
			clear(busy)
			if len(waits) > 4*cfg.MaxCgroups {
				clear(waits) // a churn's: each cgroup's next change starts it again
			}
			for _, r := range changed {
				if r.Metric != rundir.MetricRunqLatency {
					continue
				}
				ran[r.Cgroup] = true
				if r.Hist == nil {
					continue
				}
				if waits.busy(r.Cgroup, *r.Hist, now) {
					busy[r.Cgroup], busy[path.Dir(r.Cgroup)] = true, true
				}
			}
			for _, cg := range running {
				ran[cg] = true
			}
			// A cgroup's parent runs what it runs: its CPU counters moved too, and a quota set
			// there (a pod's, above its containers') throttles where the kernel counts it, on
			// the parent. Unread, its counters would be stale at every window's edge.
			parents = parents[:0]
			for cg := range ran {
				if p := path.Dir(cg); p != "/" && p != "." {
					parents = append(parents, p)
				}
			}
			for _, p := range parents {
				ran[p] = true
			}
			running = snap.Running
			for _, cg := range running {
				busy[cg] = true
			}
			return append(changed, snap.Events...), err
		})
	}
	observe := cfg.Observe
	cgroups := cfg.Cgroups
	if cgroups == nil {
		exists := cfg.Exists
		if exists == nil {
			exists = CgroupExists(cfg.Layout, res)
		}
		f := &follower{max: cfg.MaxCgroups, seen: map[string]bool{}, exists: exists}
		s.follower = f
		cgroups = f.paths
		observe = func(batch []rundir.Record) {
			f.observe(batch)
			if cfg.Observe != nil {
				cfg.Observe(batch)
			}
		}
	}
	cs := sample.NewCgroups(cfg.Layout, cgroups)
	if cfg.Priority != nil {
		cs = cs.Priority(cfg.Priority)
	}
	if ran != nil && s.status[trace.ProgramRunq] == rundir.TracerAttached {
		cs = cs.Active(func(path string) bool { return ran[path] }).Busy(func(path string) bool { return busy[path] })
	}
	sources[sourceCgroups] = cs
	sources[sourceNode] = sample.NewSystem(cfg.Host.Procfs, cfg.Host.Sysfs, cfg.Devices)
	s.collector = collect.New(sources, out, cfg.Interval, observe, cfg.Log.With("component", "collect")).First(sourceTrace)
	return s, nil
}

// A cgroup whose tasks waited for a CPU busyWait of the span since their waits last changed (a
// millisecond a second), or got one busyWakes times a second, is read at the next whatever CPU
// it used, as is one on a CPU at the collection (sample.Cgroups.Busy): a sandbox starved by its
// neighbours uses next to no CPU, as an idle one does, and is the one an analysis of the
// contention needs read; one that wakes often is at work, where a sleeping sandbox wakes now
// and then.
const (
	busyWait  = 1e-3
	busyWakes = 10
)

// lastWaits are each cgroup's run-queue waits (cumulative) when they last changed, and when.
type lastWaits map[string]waitsAt

type waitsAt struct {
	h  hist.Log2
	at time.Time
}

// busy notes cg's waits h, changed at now, and says whether they grew as a busy cgroup's do
// since they last changed: a sandbox that wakes every few seconds is judged over that span,
// not over the interval it woke in (a wake-up's 2 ms wait on a loaded node made about half of
// the cgroups read a second at 1,000 sleepers ones judged busy: BenchmarkAgent1000Cgroups).
func (l lastWaits) busy(cg string, h hist.Log2, now time.Time) bool {
	prev, ok := l[cg]
	l[cg] = waitsAt{hist.Log2{Count: h.Count, SumNs: h.SumNs}, now}
	return ok && busyWaits(prev.h, h, now.Sub(prev.at))
}

// busyWaits says whether a cgroup's run-queue waits went from was to is over span as a busy
// cgroup's do (busyWait, busyWakes).
func busyWaits(was, is hist.Log2, span time.Duration) bool {
	if is.Count < was.Count || is.SumNs < was.SumNs || span <= 0 {
		return false // another cgroup's counts, since forgotten
	}
	return float64(is.SumNs-was.SumNs) >= busyWait*float64(span) || float64(is.Count-was.Count) >= busyWakes*span.Seconds()
}

// traceSource is the tracer as a collect.FullSampler: an interval reads part of the run-queue
// pairs when they are many, a window's edge reads all of them.
type traceSource func(now time.Time, full bool) ([]rundir.Record, error)

func (f traceSource) Sample(now time.Time) ([]rundir.Record, error)     { return f(now, false) }
func (f traceSource) SampleFull(now time.Time) ([]rundir.Record, error) { return f(now, true) }

// TracerStatus maps each requested program to rundir.TracerAttached or why it does not run;
// empty without tracing.
func (s *Session) TracerStatus() map[string]string { return maps.Clone(s.status) }

// Cgroups is how many cgroups the session follows and how many more the last interval's
// records named that found no room (0, 0 when told which to sample).
func (s *Session) Cgroups() (tracked, overflow int) {
	if s.follower == nil {
		return 0, 0
	}
	return s.follower.counts()
}

// MapFill is the fill (0..1) of each traced program's fullest map keyed by cgroup at the last
// read; empty without tracing.
func (s *Session) MapFill() map[string]float64 {
	if s.tracer == nil {
		return map[string]float64{}
	}
	return s.tracer.Fill()
}

// CgroupExists says whether a cgroup path is a directory in any hierarchy the tracer's ids
// come from. An answer is kept for existsFor: the session's follower and the agent's reaper
// each look at every cgroup every 30 intervals, in the same collection, and with one such
// function between them a cgroup costs one stat a look, not one each (half of the agent's 68
// stats a second at 1,000 cgroups). With res (nil: none) following the kernel's mkdirs and
// rmdirs, as a tracer's does, a cgroup of its cpu hierarchy (v2: the one) is there without a
// stat (cgroup.Resolver.LivePaths); others, and the removed, are looked at.
func CgroupExists(l *cgroup.Layout, res *cgroup.Resolver) func(string) bool {
	var mu sync.Mutex
	var since time.Time
	var known map[string]bool // answers since since
	var live map[string]bool  // by res at since; nil: it could not tell
	return func(path string) bool {
		mu.Lock()
		defer mu.Unlock()
		if now := time.Now(); known == nil || now.Sub(since) > existsFor {
			known, since, live = map[string]bool{}, now, nil // the last look's answers go
			if res != nil {
				live, _ = res.LivePaths(cgroup.CPU)
			}
		}
		if ok, seen := known[path]; seen {
			return ok
		}
		ok := live[path]
		for _, c := range []string{cgroup.CPU, cgroup.Memory, cgroup.Blkio} {
			if ok {
				break
			}
			if d := l.Dir(c, path); d != "" {
				_, err := os.Stat(d)
				ok = err == nil
			}
		}
		known[path] = ok
		return ok
	}
}

// existsFor is how long CgroupExists keeps an answer: longer than one collection's looks, far
// shorter than the 30 intervals between two.
const existsFor = time.Second

// MountedTracefs is where the tracer mounted tracefs ("" when it found it mounted or does not
// trace), so that a caller can note it and a later cleanup unmount it if this process is killed.
func (s *Session) MountedTracefs() string {
	if s.tracer == nil {
		return ""
	}
	return s.tracer.MountedTracefs()
}

// Snapshot reads every source now, in full, and appends the result: the exact edge of a
// window (a phase's start or end).
func (s *Session) Snapshot(now time.Time) error { return s.collector.Snapshot(now) }

// Run reads every source each interval until ctx is done.
func (s *Session) Run(ctx context.Context) error { return s.collector.Run(ctx) }

// Background runs the session until Close; a failed append is logged and ends it.
func (s *Session) Background(log *slog.Logger) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := s.collector.Run(ctx); err != nil && log != nil {
			log.Error("recording stopped", "err", err)
		}
	}()
	s.stop = func() { cancel(); <-done }
}

// Close stops a background session, takes the last snapshot and unloads the tracer. It is safe
// to call more than once.
func (s *Session) Close() error {
	var errs []error
	if s.stop != nil {
		s.stop()
		s.stop = nil
		errs = append(errs, s.collector.Snapshot(time.Now()))
	}
	if s.tracer != nil {
		errs = append(errs, s.tracer.Close())
	}
	return errors.Join(errs...)
}

// follower collects the cgroups the session's records name, in order of first appearance, up
// to a bound; every pruneEvery batches it forgets those removed since, making room for new ones.
type follower struct {
	mu       sync.Mutex
	max      int
	seen     map[string]bool
	order    []string
	overflow int // distinct cgroups of the last batch that found no room
	batches  int
	exists   func(string) bool // whether a cgroup is still there
}

// pruneEvery is how many batches pass between two looks for removed cgroups: a stat each.
const pruneEvery = 30

func (f *follower) observe(batch []rundir.Record) {
	f.mu.Lock()
	var full map[string]bool
	for _, r := range batch {
		if r.Cgroup == "" || f.seen[r.Cgroup] || strings.HasPrefix(r.Cgroup, "<") {
			continue
		}
		// With its parent: a pod's cgroup holds no task of its own, so no record names it,
		// but its quota throttles its containers where the kernel counts it.
		for _, cg := range []string{path.Dir(r.Cgroup), r.Cgroup} {
			if cg == "/" || cg == "." || f.seen[cg] {
				continue
			}
			if len(f.order) >= f.max {
				if full == nil {
					full = map[string]bool{}
				}
				full[cg] = true
				continue
			}
			f.seen[cg] = true
			f.order = append(f.order, cg)
		}
	}
	f.overflow = len(full)
	f.batches++
	if f.exists != nil && f.batches%pruneEvery == 0 {
		f.order = slices.DeleteFunc(f.order, func(p string) bool {
			if f.exists(p) {
				return false
			}
			delete(f.seen, p)
			return true
		})
	}
	f.mu.Unlock()
}

func (f *follower) counts() (tracked, overflow int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.order), f.overflow
}

func (f *follower) paths() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.order)
}
