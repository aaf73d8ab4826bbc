package stress

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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

// Storm runs the fsync-storm scenario: Writers writers, each in its own cgroup, each write Bytes
// and fsync it, all released at once, Rounds times with a pause between. Each storm is a phase
// round-<n>, from just before the go to the snapshot after the last writer's fsync returned. It
// returns the run directory; the caller analyzes it. Everything the run created on the host is
// removed before Storm returns, also when ctx is cancelled (SIGINT, SIGTERM) or a step fails.
func Storm(ctx context.Context, cfg StormConfig) (dir string, err error) {
	if err := cfg.RunOptions.defaults(); err != nil {
		return "", err
	}
	if cfg.Pause <= 0 {
		cfg.Pause = DefaultStormPause
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultStormTimeout
	}
	if cfg.Writers < 1 || cfg.Rounds < 1 || cfg.Bytes < MinStormBytes {
		return "", errors.New("an fsync storm needs at least one writer, one round and 1 MiB per writer")
	}
	host, err := newRunHost(cfg.RunOptions, rundir.ScenarioFsyncStorm)
	if err != nil {
		return "", err
	}
	r := &stormRun{runHost: host, cfg: cfg,
		events: make(chan stormEvent, 16*cfg.Writers), counts: map[string][]int{}, last: make([]time.Duration, cfg.Writers)}
	return runScenario(ctx, &r.runHost, r)
}

type stormRun struct {
	runHost
	cfg    StormConfig
	target string // where the writers' directories are: below scratch, or nodectl-<id> in --target
	device string

	workloads []rundir.Workload
	gos       []*os.File // each writer's standard input: a go line starts its storm
	events    chan stormEvent
	counts    map[string][]int // metric -> events of each writer so far; read by the driver only
	last      []time.Duration  // each writer's latest time to durable

	durable []time.Duration // slowest writer of each storm so far, for the progress line
}

// stormEvent is a writer's measurement as the driver waits on it.
type stormEvent struct {
	writer int
	metric string
	value  float64
}

func (r *stormRun) setup(context.Context) error {
	cfg := r.cfg
	var err error
	r.target = r.scratch
	if cfg.Target != "" {
		if r.target, err = TargetDir(cfg.Paths, r.id, cfg.Target); err != nil {
			return err
		}
	}
	// The parent of the run's directory exists: the device and the free space are its.
	if r.device, err = blockdev.ForPath(cfg.Paths.Sysfs, filepath.Dir(r.target)); err != nil {
		return badvalue.New(FieldTarget, filepath.Dir(r.target), err)
	}
	if err := checkSpace(filepath.Dir(r.target), int64(cfg.Writers)*cfg.Bytes); err != nil {
		return err
	}
	r.plan()
	if err := r.createRunCgroup(cgroup.Limits{}); err != nil {
		return err
	}
	for i, w := range r.workloads {
		if err := r.layout.Create(w.Cgroup, r.place(&r.workloads[i], r.limits())); err != nil {
			return fmt.Errorf("creating cgroup of %s: %w", w.Name, err)
		}
	}
	if err := r.newLauncher(); err != nil {
		return err // it names the runtime
	}
	paths := make([]string, len(r.workloads))
	for i, w := range r.workloads {
		paths[i] = w.Cgroup
	}
	// fsync latency and block I/O per cgroup explain a storm; the run queue does not.
	return r.startRecording(cfg.RunOptions, r.workloads, recordingSpec{cgroups: func() []string { return paths },
		devices: func() []string { return []string{r.device} }, programs: []string{trace.ProgramFsync, trace.ProgramBlkio}})
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

// plan names the writers fsync-writer-<i>, each with its own directory on the target.
func (r *stormRun) plan() {
	mem := quantity.FormatSize(r.limits().MemoryBytes)
	for i := range r.cfg.Writers {
		name := rundir.StormWriterName(i)
		r.workloads = append(r.workloads, rundir.Workload{Name: name, Kind: rundir.KindStormWriter, Cgroup: RunCgroup(r.id) + "/" + name,
			Memory: mem, Target: filepath.Join(r.target, name), Device: r.device})
	}
}

// limits bound each writer's memory, so its page cache is capped as every stress load is, with
// room for two files' worth: the limit never makes a writer reclaim or wait for its own writeback.
func (r *stormRun) limits() cgroup.Limits {
	return cgroup.Limits{MemoryBytes: 2*r.cfg.Bytes + 64<<20}
}

// run starts the writers, then runs the rounds: wait until every writer is ready, release
// them all at once, wait for every fsync, pause.
func (r *stormRun) run(ctx context.Context) error {
	for i, w := range r.workloads {
		if err := r.start(i, w); err != nil {
			return err
		}
	}
	r.noteHostProcesses(r.workloads, func(rundir.Workload) *launch.Launcher { return r.launcher })
	for n := 1; n <= r.cfg.Rounds; n++ {
		if err := r.await(ctx, n, workload.MetricStormReady); err != nil {
			return err
		}
		if err := r.round(ctx, n); err != nil {
			return err
		}
		if n < r.cfg.Rounds {
			if err := r.pause(ctx, n); err != nil {
				return err
			}
		}
	}
	return nil
}

// start launches writer i with a pipe on its standard input, through which its go comes.
func (r *stormRun) start(i int, w rundir.Workload) error {
	logf, err := r.openLog(w.Name)
	if err != nil {
		return err
	}
	in, goW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("starting %s: %w", w.Name, err)
	}
	r.gos = append(r.gos, goW)
	onMeasure := func(name string, m workload.Measurement) {
		if m.Metric != workload.MetricStormReady {
			v := m.Value
			if err := r.writer.Append(rundir.Record{Type: rundir.TypeSample, Time: m.T, Metric: m.Metric, Cgroup: w.Cgroup, Workload: name, Value: &v}); err != nil {
				r.cfg.Log.Warn("recording a measurement", "workload", name, "err", err)
			}
		}
		// Never blocks: a full channel would stall the writer's output and its exit. It holds
		// several storms' events, so nothing is dropped while the driver waits on them.
		select {
		case r.events <- stormEvent{writer: i, metric: m.Metric, value: m.Value}:
		default:
		}
	}
	args := workload.Command{Run: r.id, Config: &workload.FsyncWriterConfig{Dir: w.Target, Bytes: r.cfg.Bytes}}.Args()
	p, err := r.launcher.Start(launch.Spec{Name: w.Name, Cgroup: w.Cgroup, Limits: r.limits(), Args: args,
		Mounts: []string{w.Target}, Stdin: in, Log: logf}, onMeasure)
	in.Close() // the writer has its own copy
	if err != nil {
		return err
	}
	r.procs = append(r.procs, p)
	return nil
}

// round runs storm n: the phase opens with a snapshot, every writer gets its go in one pass
// over the pipes (microseconds apart), and the phase closes with a snapshot once the last
// fsync returned, so the tracer's counters over the phase are the storm's.
func (r *stormRun) round(ctx context.Context, n int) error {
	phase := rundir.RoundPhase(n)
	if err := r.mark(phase, rundir.EventStart); err != nil {
		return err
	}
	stopDirty := r.sampleDirty()
	defer stopDirty()
	for i, f := range r.gos {
		if _, err := f.WriteString(workload.StormGo); err != nil {
			return fmt.Errorf("releasing %s: %w", r.workloads[i].Name, err)
		}
	}
	if err := r.await(ctx, n, rundir.MetricStormDurable); err != nil {
		return err
	}
	stopDirty()
	r.durable = append(r.durable, slices.Max(r.last))
	return r.mark(phase, rundir.EventEnd)
}

// await waits until every writer has emitted metric n times in all, and shows progress
// meanwhile. Events are counted as they come, whichever wait is under way: a fast writer's
// ready for the next storm arrives while the slow ones still fsync.
func (r *stormRun) await(ctx context.Context, n int, metric string) error {
	timeout := time.NewTimer(r.cfg.Timeout)
	defer timeout.Stop()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	started := time.Now()
	done := func() int {
		k := 0
		for _, c := range r.counts[metric] {
			if c >= n {
				k++
			}
		}
		return k
	}
	for done() < len(r.workloads) {
		select {
		case ev := <-r.events:
			if r.counts[ev.metric] == nil {
				r.counts[ev.metric] = make([]int, len(r.workloads))
			}
			r.counts[ev.metric][ev.writer]++
			if ev.metric == rundir.MetricStormDurable {
				r.last[ev.writer] = time.Duration(ev.value * float64(time.Second))
			}
		case <-ctx.Done():
			r.progress.Done()
			return fmt.Errorf("%w during %s: %v", ErrInterrupted, rundir.RoundPhase(n), context.Cause(ctx))
		case <-timeout.C:
			r.progress.Done()
			return badvalue.Errorf(FieldTimeout, r.cfg.Timeout.String(), "%s: %d of %d writers did not finish in time (see %s): %w", rundir.RoundPhase(n),
				len(r.workloads)-done(), len(r.workloads), filepath.Join(r.dir, "workloads"), ErrTimeout)
		case <-tick.C:
			if err := r.exited(); err != nil {
				return err
			}
		}
		r.showProgress(n, metric, done(), time.Since(started))
	}
	return nil
}

// pause lets the device settle between storms, so that one storm's writeback is not the next
// one's queue.
func (r *stormRun) pause(ctx context.Context, n int) error {
	t := time.NewTimer(r.cfg.Pause)
	defer t.Stop()
	select {
	case <-ctx.Done():
		r.progress.Done()
		return fmt.Errorf("%w after %s: %v", ErrInterrupted, rundir.RoundPhase(n), context.Cause(ctx))
	case <-t.C:
		return nil
	}
}

func (r *stormRun) showProgress(n int, metric string, done int, elapsed time.Duration) {
	what := "ready"
	if metric == rundir.MetricStormDurable {
		what = "durable"
	}
	line := fmt.Sprintf("storm %d/%d: %d/%d writers %s %6s", n, r.cfg.Rounds, done, len(r.workloads), what, elapsed.Round(10*time.Millisecond))
	if len(r.durable) > 0 {
		var s []string
		for _, d := range r.durable {
			s = append(s, d.Round(time.Millisecond).String())
		}
		line += " | slowest writer per storm " + strings.Join(s, ", ")
	}
	r.progress.Update(line)
}

// sampleDirty records the node's dirty and writeback memory every stormDirtyInterval until the
// returned stop is called (more than once is fine).
func (r *stormRun) sampleDirty() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(stormDirtyInterval)
		defer tick.Stop()
		for {
			d, err := sample.ReadDirty(r.cfg.Paths.Procfs)
			if err != nil {
				r.cfg.Log.Warn("reading dirty memory; the storm's writeback goes unrecorded", "err", err)
				return
			}
			if err := r.writer.Append(dirtyRecords(time.Now(), d)...); err != nil {
				r.cfg.Log.Warn("recording dirty memory", "err", err)
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

// undo closes the writers' standard input and removes their files in the user's target.
func (r *stormRun) undo() []error {
	for _, f := range r.gos {
		f.Close()
	}
	if r.target != "" && r.target != r.scratch {
		if err := os.RemoveAll(r.target); err != nil {
			return []error{fmt.Errorf("removing the writers' files in %s: %w", r.target, err)}
		}
	}
	return nil
}
