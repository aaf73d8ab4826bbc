package stress

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nodectl/nodectl/internal/badvalue"
	"github.com/nodectl/nodectl/internal/quantity"

	"golang.org/x/sys/unix"

	"github.com/nodectl/nodectl/host/blockdev"
	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/record/sample"
	"github.com/nodectl/nodectl/record/trace"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/stress/launch"
	"github.com/nodectl/nodectl/stress/workload"
)

// StormConfig configures `nodectl stress fsync-storm`.
type StormConfig struct {
	Writers int
	Bytes   int64  // written and fsynced by each writer per storm
	Target  string // directory the writers write below; "" = the run's scratch directory
	Rounds  int
	Pause   time.Duration // between storms; 0 = DefaultStormPause
	Timeout time.Duration // how long one storm may take; 0 = DefaultStormTimeout

	RunOptions
}

// Defaults and bounds of `stress fsync-storm`.
const (
	DefaultStormWriters = 8
	DefaultStormBytes   = 128 << 20
	DefaultStormRounds  = 3
	DefaultStormPause   = 2 * time.Second
	DefaultStormTimeout = 5 * time.Minute
	MaxStormWriters     = 256
	MinStormBytes       = 1 << 20
	// MaxStormTotalBytes bounds writers × size: the storm's page cache and disk space.
	MaxStormTotalBytes = 16 << 30
)

// stormDirtyInterval is how often the driver reads the node's dirty and writeback memory during
// a storm: a storm lasts seconds, the collector's interval is about one.
const stormDirtyInterval = 50 * time.Millisecond

// Storm runs the fsync-storm scenario on this host (StormOn on a local placement): each writer
// in its own cgroup below the run's, by the runtime asked for, its go through a pipe on its
// standard input, recorded by the run's own session. It returns the run directory; the caller
// analyzes it. Everything the run created on the host is removed before Storm returns, also
// when ctx is cancelled (SIGINT, SIGTERM, SIGHUP) or a step fails.
func Storm(ctx context.Context, cfg StormConfig) (dir string, err error) {
	return runOnHost(ctx, &cfg.RunOptions, rundir.ScenarioFsyncStorm, cfg.check, func(host runHost) onHost {
		p := &localStormer{runHost: host, userTarget: cfg.Target, need: int64(cfg.Writers) * cfg.Bytes}
		return onHost{&p.runHost, func(ctx context.Context) error { return StormOn(ctx, cfg, p, p.progress) }, p.undo}
	})
}

// check refuses a run with no storm in it.
func (cfg StormConfig) check() error {
	if cfg.Writers < 1 || cfg.Rounds < 1 || cfg.Bytes < MinStormBytes {
		return errors.New("an fsync storm needs at least one writer, one round and 1 MiB per writer")
	}
	return nil
}

// Stormer is a placement that can run fsync storms: the steps of StormOn that writers waiting
// for a go make.
type Stormer interface {
	Placement
	// Arm starts the writers, each waiting on its standard input for a storm's go, and
	// returns once each runs. Each writer's measurements (ready for a storm, time to durable)
	// are sent on events as they come, without ever blocking it, and recorded in the run.
	Arm(ctx context.Context, ws []Planned, events chan<- StormEvent) error
	// Release sends every writer its go, all at once.
	Release(ctx context.Context) error
	// Check fails when a writer ended.
	Check(ctx context.Context) error
	// Settle returns once the recording holds the node's counters as they are now: at once
	// where Mark reads them, past the next read where they are read at an interval.
	Settle(ctx context.Context) error
}

// StormEvent is a measurement of the i-th writer, as StormOn waits on it.
type StormEvent struct {
	Writer int
	workload.Measurement
}

// StormOn runs the fsync-storm scenario on p, written once for every placement: Writers
// writers, each writing Bytes and fsyncing it, all released at once, Rounds times with a pause
// between. Each storm is a phase round-<n>, from just before the go to once the last writer's
// fsync returned. line shows progress. The caller owns p: it cleans up and analyzes what p wrote.
func StormOn(ctx context.Context, cfg StormConfig, p Stormer, line *LiveLine) error {
	if err := cfg.check(); err != nil {
		return err
	}
	if cfg.Pause <= 0 {
		cfg.Pause = DefaultStormPause
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultStormTimeout
	}
	ws, err := p.Place(ctx, planStorm(cfg))
	if err != nil {
		return err
	}
	for i := range ws {
		ws[i].Config = &workload.FsyncWriterConfig{Dir: ws[i].Target, Bytes: cfg.Bytes}
	}
	// It holds several storms' events: a writer never waits on the driver.
	events := make(chan StormEvent, 16*len(ws))
	if err := p.Arm(ctx, ws, events); err != nil {
		return err
	}
	s := &storm{cfg: cfg, p: p, line: line, events: events, tally: newStormTally(len(ws))}
	defer line.Done()
	for n := 1; n <= cfg.Rounds; n++ {
		if n > 1 {
			if err := s.pause(ctx, n-1); err != nil {
				return err
			}
		}
		if err := s.round(ctx, n); err != nil {
			return err
		}
	}
	line.Done()
	return p.Finish(ctx)
}

// planStorm names the writers fsync-writer-<i>, each with its memory bounded, so its page cache
// is capped as every stress load is, with room for two files' worth: the limit never makes a
// writer reclaim or wait for its own writeback.
func planStorm(cfg StormConfig) []Planned {
	lim := cgroup.Limits{MemoryBytes: 2*cfg.Bytes + 64<<20}
	var out []Planned
	for i := range cfg.Writers {
		out = append(out, Planned{Workload: rundir.Workload{Name: rundir.StormWriterName(i), Kind: rundir.KindStormWriter,
			Memory: quantity.FormatSize(lim.MemoryBytes)}, Limits: lim})
	}
	return out
}

// storm is a run of storms under way.
type storm struct {
	cfg    StormConfig
	p      Stormer
	line   *LiveLine
	events <-chan StormEvent
	tally  *stormTally
}

// round runs storm n: once every writer is ready, the phase opens, every writer gets its go at
// once, and the phase closes once the last fsync returned and the recording holds it, so the
// tracer's counters over the phase are the storm's.
func (s *storm) round(ctx context.Context, n int) error {
	if err := s.await(ctx, n, workload.MetricStormReady); err != nil {
		return err
	}
	phase := rundir.RoundPhase(n)
	if err := s.p.Mark(phase, rundir.EventStart); err != nil {
		return err
	}
	if err := s.p.Release(ctx); err != nil {
		return err
	}
	if err := s.await(ctx, n, rundir.MetricStormDurable); err != nil {
		return err
	}
	s.tally.stormDone()
	if err := s.p.Settle(ctx); err != nil {
		return err
	}
	return s.p.Mark(phase, rundir.EventEnd)
}

// await waits until every writer has emitted metric n times in all, and shows progress
// meanwhile. Events are counted as they come, whichever wait is under way: a fast writer's
// ready for the next storm arrives while the slow ones still fsync.
func (s *storm) await(ctx context.Context, n int, metric string) error {
	phase := rundir.RoundPhase(n)
	timeout := time.NewTimer(s.cfg.Timeout)
	defer timeout.Stop()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	check := time.NewTicker(2 * time.Second)
	defer check.Stop()
	started := time.Now()
	writers := len(s.tally.last)
	for s.tally.done(metric, n) < writers {
		select {
		case ev := <-s.events:
			s.tally.add(ev)
			continue
		case <-check.C:
			if err := s.p.Check(ctx); err != nil {
				return fmt.Errorf("during %s: %w", phase, err)
			}
		case <-ctx.Done():
			return fmt.Errorf("%w during %s: %v", ErrInterrupted, phase, context.Cause(ctx))
		case <-timeout.C:
			return badvalue.Errorf(FieldTimeout, s.cfg.Timeout.String(), "%s: %d of %d writers did not finish in time: %w", phase,
				writers-s.tally.done(metric, n), writers, ErrTimeout)
		case <-tick.C:
		}
		s.showProgress(n, metric, time.Since(started))
	}
	s.showProgress(n, metric, time.Since(started))
	return nil
}

// pause lets the device settle between storms, so that one storm's writeback is not the next
// one's queue.
func (s *storm) pause(ctx context.Context, n int) error {
	t := time.NewTimer(s.cfg.Pause)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("%w after %s: %v", ErrInterrupted, rundir.RoundPhase(n), context.Cause(ctx))
	case <-t.C:
		return nil
	}
}

func (s *storm) showProgress(n int, metric string, elapsed time.Duration) {
	what := "ready"
	if metric == rundir.MetricStormDurable {
		what = "durable"
	}
	line := fmt.Sprintf("storm %d/%d: %d/%d writers %s %6s", n, s.cfg.Rounds, s.tally.done(metric, n), len(s.tally.last), what, elapsed.Round(10*time.Millisecond))
	if len(s.tally.slowest) > 0 {
		var ds []string
		for _, d := range s.tally.slowest {
			ds = append(ds, d.Round(time.Millisecond).String())
		}
		line += " | slowest writer per storm " + strings.Join(ds, ", ")
	}
	s.line.Update(line)
}

// stormTally counts the writers' measurements. A measurement that came twice (a pod's first
// ready, read from its log and seen on its attached output) counts once: a writer's
// measurements of one metric come in time order.
type stormTally struct {
	counts  map[string][]int       // metric -> events of each writer so far
	seen    map[string][]time.Time // metric -> each writer's latest, by its time
	last    []time.Duration        // each writer's latest time to durable
	slowest []time.Duration        // slowest writer of each storm so far, for the progress line
}

func newStormTally(writers int) *stormTally {
	return &stormTally{counts: map[string][]int{}, seen: map[string][]time.Time{}, last: make([]time.Duration, writers)}
}

func (t *stormTally) add(ev StormEvent) {
	if ev.Writer < 0 || ev.Writer >= len(t.last) {
		return
	}
	if t.counts[ev.Metric] == nil {
		t.counts[ev.Metric], t.seen[ev.Metric] = make([]int, len(t.last)), make([]time.Time, len(t.last))
	}
	if !ev.T.After(t.seen[ev.Metric][ev.Writer]) {
		return
	}
	t.seen[ev.Metric][ev.Writer] = ev.T
	t.counts[ev.Metric][ev.Writer]++
	if ev.Metric == rundir.MetricStormDurable {
		t.last[ev.Writer] = time.Duration(ev.Value * float64(time.Second))
	}
}

// done is how many writers emitted metric n times or more.
func (t *stormTally) done(metric string, n int) int {
	k := 0
	for _, c := range t.counts[metric] {
		if c >= n {
			k++
		}
	}
	return k
}

// stormDone notes the storm that just ended: its slowest writer.
func (t *stormTally) stormDone() { t.slowest = append(t.slowest, slices.Max(t.last)) }

// localStormer runs the writers on this host: each in its own cgroup below the run's, its
// directory below the scratch directory or the user's target, its go through a pipe on its
// standard input; the node's dirty memory sampled through every storm.
type localStormer struct {
	runHost
	userTarget string // --target; "" = the run's scratch directory
	need       int64  // bytes the writers write per storm
	target     string // where the writers' directories are: below scratch, or nodectl-<id> in --target

	workloads []rundir.Workload
	gos       []*os.File // each writer's standard input: a go line starts its storm
	stopDirty func()     // ends the dirty-memory sampling of the storm under way
}

func (p *localStormer) ID() string { return p.id }

func (p *localStormer) CPUs() int { return runtime.NumCPU() }

// Place gives each writer its cgroup below the run's and its own directory on the target, once
// the target's filesystem has room for the storm, makes the cgroups and starts the recording.
func (p *localStormer) Place(_ context.Context, planned []Planned) ([]Planned, error) {
	var err error
	p.target = p.scratch
	if p.userTarget != "" {
		if p.target, err = TargetDir(p.opts.Paths, p.id, p.userTarget); err != nil {
			return nil, err
		}
	}
	// The parent of the run's directory exists: the device and the free space are its.
	device, err := blockdev.ForPath(p.opts.Paths.Sysfs, filepath.Dir(p.target))
	if err != nil {
		return nil, badvalue.New(FieldTarget, filepath.Dir(p.target), err)
	}
	if err := checkSpace(filepath.Dir(p.target), p.need); err != nil {
		return nil, err
	}
	for i := range planned {
		w := &planned[i]
		w.Cgroup, w.Target, w.Device = RunCgroup(p.id)+"/"+w.Name, filepath.Join(p.target, w.Name), device
		w.Limits = p.place(&w.Workload, w.Limits)
		p.workloads = append(p.workloads, w.Workload)
	}
	if err := p.createRunCgroup(cgroup.Limits{}); err != nil {
		return nil, err
	}
	var paths []string
	for _, w := range planned {
		if err := p.layout.Create(w.Cgroup, w.Limits); err != nil {
			return nil, fmt.Errorf("creating cgroup of %s: %w", w.Name, err)
		}
		paths = append(paths, w.Cgroup)
	}
	if err := p.newLauncher(); err != nil {
		return nil, err // it names the runtime
	}
	// fsync latency and block I/O per cgroup explain a storm; the run queue does not.
	err = p.startRecording(p.opts, p.workloads, recordingSpec{cgroups: func() []string { return paths },
		devices: func() []string { return []string{device} }, programs: []string{trace.ProgramFsync, trace.ProgramBlkio}})
	return planned, err
}

// checkSpace refuses a storm whose files would not fit on the target's filesystem with a
// margin: filling the node's disk is not the experiment.
func checkSpace(dir string, need int64) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("reading free space of %s: %w", dir, err)
	}
	free := int64(st.Bavail) * st.Bsize
	if need > free/2 {
		return badvalue.Errorf(FieldTarget, dir, "the writers would write %s, more than half the %s free there: write less or choose another target",
			quantity.FormatSize(need), quantity.FormatSize(free))
	}
	return nil
}

// Arm launches each writer with a pipe on its standard input, through which its go comes, and
// notes their host processes.
func (p *localStormer) Arm(_ context.Context, ws []Planned, events chan<- StormEvent) error {
	for i, w := range ws {
		if err := p.arm(i, w, events); err != nil {
			return err
		}
	}
	p.noteHostProcesses(p.workloads, func(rundir.Workload) *launch.Launcher { return p.launcher })
	return nil
}

func (p *localStormer) arm(i int, w Planned, events chan<- StormEvent) error {
	logf, err := p.openLog(w.Name)
	if err != nil {
		return err
	}
	in, goW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("starting %s: %w", w.Name, err)
	}
	p.gos = append(p.gos, goW)
	onMeasure := func(name string, m workload.Measurement) {
		if workload.Recorded(m) {
			v := m.Value
			if err := p.writer.Append(rundir.Record{Type: rundir.TypeSample, Time: m.T, Metric: m.Metric, Cgroup: w.Cgroup, Workload: name, Value: &v}); err != nil {
				p.opts.Log.Warn("recording a measurement", "workload", name, "err", err)
			}
		}
		select { // a full channel would stall the writer's output and its exit
		case events <- StormEvent{Writer: i, Measurement: m}:
		default:
		}
	}
	proc, err := p.launcher.Start(launch.Spec{Name: w.Name, Cgroup: w.Cgroup, Limits: w.Limits, Args: workload.Command{Run: p.id, Config: w.Config}.Args(),
		Mounts: []string{w.Target}, Stdin: in, Log: logf}, onMeasure)
	in.Close() // the writer has its own copy
	if err != nil {
		return err
	}
	p.procs = append(p.procs, proc)
	return nil
}

// Release writes the go to every writer's pipe in one pass (microseconds apart).
func (p *localStormer) Release(context.Context) error {
	for i, f := range p.gos {
		if _, err := f.WriteString(workload.StormGo); err != nil {
			return fmt.Errorf("releasing %s: %w", p.workloads[i].Name, err)
		}
	}
	return nil
}

// Check fails when a writer exited, naming its log.
func (p *localStormer) Check(context.Context) error { return p.exited() }

// Settle has nothing to wait for: Mark reads every counter at the phase's end.
func (p *localStormer) Settle(context.Context) error { return nil }

// Mark snapshots every source and records the phase's edge at the same time; the node's dirty
// memory is sampled from a storm's start to its end.
func (p *localStormer) Mark(phase, event string) error {
	if p.stopDirty != nil {
		p.stopDirty()
		p.stopDirty = nil
	}
	err := p.mark(phase, event)
	if err == nil && event == rundir.EventStart {
		p.stopDirty = p.sampleDirty()
	}
	return err
}

// Finish has nothing left to do: the writers noted their host processes once armed.
func (p *localStormer) Finish(context.Context) error { return nil }

// sampleDirty records the node's dirty and writeback memory every stormDirtyInterval until the
// returned stop is called (more than once is fine).
func (p *localStormer) sampleDirty() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(stormDirtyInterval)
		defer tick.Stop()
		for {
			d, err := sample.ReadDirty(p.opts.Paths.Procfs)
			if err != nil {
				p.opts.Log.Warn("reading dirty memory; the storm's writeback goes unrecorded", "err", err)
				return
			}
			if err := p.writer.Append(dirtyRecords(time.Now(), d)...); err != nil {
				p.opts.Log.Warn("recording dirty memory", "err", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	return func() { cancel(); wg.Wait() }
}

// dirtyRecords are d's node-wide samples.
func dirtyRecords(now time.Time, d sample.Dirty) []rundir.Record {
	var out []rundir.Record
	for _, m := range []struct {
		metric string
		v      int64
	}{
		{rundir.MetricDirty, d.Dirty}, {rundir.MetricWriteback, d.Writeback},
		{rundir.MetricDirtyThreshold, d.Threshold}, {rundir.MetricDirtyBackThreshold, d.BackgroundThreshold},
	} {
		v := float64(m.v)
		out = append(out, rundir.Record{Type: rundir.TypeSample, Time: now, Metric: m.metric, Value: &v})
	}
	return out
}

// undo stops the dirty-memory sampling, closes the writers' standard input and removes their
// files in the user's target.
func (p *localStormer) undo() []error {
	if p.stopDirty != nil {
		p.stopDirty()
	}
	for _, f := range p.gos {
		f.Close()
	}
	if p.target != "" && p.target != p.scratch {
		if err := os.RemoveAll(p.target); err != nil {
			return []error{fmt.Errorf("removing the writers' files in %s: %w", p.target, err)}
		}
	}
	return nil
}
