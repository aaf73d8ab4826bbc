// Package trace runs the BPF tracers (run queue, fsync, block I/O, reclaim) side by side and
// turns their maps into run-record samples keyed by cgroup path, and OOM kills into events.
package trace

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nodectl/nodectl/host/cgroup"

	"github.com/nodectl/nodectl/record/trace/blkio"
	"github.com/nodectl/nodectl/record/trace/cgnames"
	"github.com/nodectl/nodectl/record/trace/fsync"
	"github.com/nodectl/nodectl/record/trace/reclaim"
	"github.com/nodectl/nodectl/record/trace/runq"
	"github.com/nodectl/nodectl/record/trace/tracefs"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

// Program names, as in Config.Programs, Status and the program label of bpf_drops_total.
const (
	ProgramRunq  = rundir.ProgramRunq
	ProgramFsync = rundir.ProgramFsync
	ProgramBlkio = rundir.ProgramBlkio
	// ProgramReclaim traces reclaim and compaction stalls, kswapd and OOM kills.
	ProgramReclaim = rundir.ProgramReclaim
)

// Programs lists every program in load order.
var Programs = []string{ProgramRunq, ProgramFsync, ProgramBlkio, ProgramReclaim}

// StatusAttached is Status's value for a program that runs.
const StatusAttached = rundir.TracerAttached

// earlyGrowth is how much fuller (of its capacity) a map past ForgetFill must grow to be
// looked at again before ForgetEvery reads.
const earlyGrowth = 0.05

// Defaults for Config's zero values.
const (
	DefaultForgetEvery = 30
	DefaultForgetFill  = 0.5
)

// Resolver names cgroups. Path returns the cgroup's path below its hierarchy's root
// (/nodectl/<run>/victim) given the v1 controller whose hierarchy the id is from ("cpu", "memory" or
// "blkio"; ignored on v2 hosts). It must report false only for cgroups that no longer exist
// (a cache looks again on a miss): the tracer forgets those ids. When it can also tell
// exactly whether a cgroup lives (liveResolver), the tracer asks that instead, so that it
// forgets a removed cgroup at its next look even while Path still names it.
type Resolver interface {
	Path(controller string, id uint64) (string, bool)
}

// follower is a Resolver that can learn cgroups as the kernel makes and removes them
// (cgroup.Resolver): the tracer then feeds it the cgnames program's changes.
type follower interface {
	Follow(cgroup.Feed) error
}

// Config selects what to load.
type Config struct {
	CgroupV1 bool     // the host has v1 hierarchies: ids are from the cpu and blkio ones
	Programs []string // subset of Programs; nil means all
	Sysfs    string   // sysfs mount, to map partitions to disks; "" means /sys
	// Tracefs is where tracefs is mounted, for the fsync program's syscall tracepoints, when
	// the host has mounted it nowhere; "" means /sys/kernel/tracing.
	Tracefs string
	// Procfs is the host's procfs, whose pid 1's mount table chooses the fsync program's
	// hooks (fsync.ChooseHooks) unless FsyncHooks names them; "" means /proc.
	Procfs     string
	FsyncHooks fsync.Hooks
	// Removed cgroups' entries are looked for every ForgetEvery collections, or at the first
	// collection that finds a map fuller than ForgetFill (0..1), and early again only once it
	// grew by earlyGrowth: each look walks every key of the maps and asks the resolver about
	// each id. 0 means DefaultForgetEvery and DefaultForgetFill.
	ForgetEvery int
	ForgetFill  float64
}

// source is one loaded concern: what it reads as series, how it forgets, how it closes.
type source struct {
	program    string
	controller string // v1 hierarchy its cgroup ids are from
	// read returns the series and the fill of the concern's fullest map keyed by cgroup.
	read func(n namer) ([]series, float64, error)
	// readPart, when set, is what an interval's Snapshot reads instead of read: part of
	// what the concern holds, the rest at later intervals (the run-queue pairs past a budget).
	readPart func(n namer) ([]series, float64, error)
	forget   func(live func(uint64) bool) (int, error)
	close    func() error
	reads    int     // successful reads since the last forget
	forgot   float64 // the fill at the last forget if past ForgetFill, else 0
}

// namer turns a cgroup id of the source's hierarchy into a path.
type namer func(id uint64) string

// series is one sample before it becomes a record.
type series struct {
	metric string
	cgroup string // "" for node-wide series
	labels map[string]string
	value  float64
	hist   *hist.Log2
	// event, when set, is a discrete happening to record as it is (an OOM kill): it is
	// emitted once, at its own time, and none of the other fields apply.
	event *rundir.Record
	// running: no sample, but cgroup had a task on a CPU at the read (Snapshot.Running).
	running bool
}

// Tracer runs the loaded concerns. It is safe for concurrent use.
type Tracer struct {
	mu          sync.Mutex
	res         Resolver
	log         *slog.Logger
	forgetEvery int
	forgetFill  float64
	sources     []source
	status      map[string]string
	tracefs     *tracefs.Mount  // released at Close: unmounted if New mounted it
	names       *cgnames.Tracer // nil unless the resolver follows it
	fill        map[string]float64
	closed      bool
	read        [][]series // each source's series in a snapshot, kept for the next
}

// New loads each requested program on its own, so that one the kernel refuses does not stop
// the others; Status tells which run. It fails only when none could load.
func New(cfg Config, res Resolver, log *slog.Logger) (*Tracer, error) {
	want := cfg.Programs
	if want == nil {
		want = Programs
	}
	for _, p := range want {
		if !slices.Contains(Programs, p) {
			return nil, fmt.Errorf("unknown program %q (known: %s)", p, strings.Join(Programs, ", "))
		}
	}
	if cfg.Tracefs == "" {
		cfg.Tracefs = tracefs.DefaultDir
	}
	if cfg.ForgetEvery < 0 || cfg.ForgetFill < 0 || cfg.ForgetFill > 1 {
		return nil, fmt.Errorf("forgetting every %d collections or past fill %g: want a count >= 0 and a fill in 0..1", cfg.ForgetEvery, cfg.ForgetFill)
	}
	if cfg.ForgetEvery == 0 {
		cfg.ForgetEvery = DefaultForgetEvery
	}
	if cfg.ForgetFill == 0 {
		cfg.ForgetFill = DefaultForgetFill
	}
	t := &Tracer{res: res, log: log, forgetEvery: cfg.ForgetEvery, forgetFill: cfg.ForgetFill,
		status: map[string]string{}}
	var errs []error
	fsyncHooks := cfg.FsyncHooks
	if fsyncHooks == "" && slices.Contains(want, ProgramFsync) {
		h, why, err := fsync.ChooseHooks(cfg.Procfs)
		if err != nil {
			log.Warn("tracer program not loaded", "program", ProgramFsync, "err", err)
			t.status[ProgramFsync] = err.Error()
			errs = append(errs, err)
		} else {
			log.Info("fsync hooks", "hooks", h, "why", why)
			fsyncHooks = h
		}
	}
	if fsyncHooks == fsync.HooksSyscalls {
		// Before anything loads: the library reads the mount table once, at the first load.
		m, err := tracefs.Ensure(cfg.Tracefs)
		if err != nil {
			err = fmt.Errorf("tracefs, which the syscall tracepoints need, is not mounted: %w", err)
			log.Warn("tracer program not loaded", "program", ProgramFsync, "err", err)
			t.status[ProgramFsync] = err.Error()
			errs = append(errs, err)
		} else if m.Mounted() {
			log.Info("mounted tracefs, unmounted again at close", "dir", cfg.Tracefs)
		}
		t.tracefs = m
	}
	for _, p := range Programs {
		if _, done := t.status[p]; done {
			continue // fsync, without hooks or tracefs
		}
		if !slices.Contains(want, p) {
			t.status[p] = "not requested"
			continue
		}
		src, err := load(p, cfg, fsyncHooks, log)
		if err != nil {
			log.Warn("tracer program not loaded", "program", p, "err", err)
			t.status[p] = err.Error()
			errs = append(errs, err)
			continue
		}
		t.status[p] = StatusAttached
		t.sources = append(t.sources, src)
	}
	if t.status[ProgramFsync] != StatusAttached {
		// Nothing needs it: leave the machine as found now.
		if err := t.tracefs.Release(); err != nil {
			log.Warn("leaving tracefs mounted", "err", err)
		}
	}
	if len(t.sources) == 0 {
		return nil, fmt.Errorf("no tracer program loaded: %w", errors.Join(errs...))
	}
	if f, ok := res.(follower); ok {
		t.follow(f)
	}
	return t, nil
}

// follow feeds f the cgroups the kernel makes and removes. Without it f still names cgroups,
// by file handle where allowed and otherwise by walking the hierarchies at a miss.
func (t *Tracer) follow(f follower) {
	names, err := cgnames.New(t.log)
	if err == nil {
		if err = f.Follow(names.Feed); err != nil {
			names.Close()
		}
	}
	if err != nil {
		t.log.Warn("not following the kernel's cgroup mkdirs: a new cgroup is named by file handle (CAP_DAC_READ_SEARCH) or a walk", "err", err)
		return
	}
	t.names = names
}

// loaded is what the composite needs of a concern's tracer.
type loaded[S any] interface {
	Read() (S, error)
	Forget(live func(uint64) bool) (int, error)
	Close() error
}

// newSource wraps a concern's tracer, whose cgroup ids are from controller's hierarchy on v1
// hosts, with the functions that turn its snapshots into series and tell its maps' fill.
func newSource[S any](program, controller string, tr loaded[S], toSeries func(S, namer) []series, fill func(S) float64) source {
	src := source{program: program, controller: controller, forget: tr.Forget, close: tr.Close,
		read: func(n namer) ([]series, float64, error) {
			st, err := tr.Read()
			return toSeries(st, n), fill(st), err
		}}
	if p, ok := tr.(interface{ ReadPart() (S, error) }); ok {
		src.readPart = func(n namer) ([]series, float64, error) {
			st, err := p.ReadPart()
			return toSeries(st, n), fill(st), err
		}
	}
	return src
}

func load(program string, cfg Config, fsyncHooks fsync.Hooks, log *slog.Logger) (source, error) {
	switch program {
	case ProgramRunq:
		tr, err := runq.New(runq.Config{CgroupV1: cfg.CgroupV1, ChangedOnly: true}, log)
		if err != nil {
			return source{}, err
		}
		return newSource(program, cgroup.CPU, tr, runqSeries, func(st runq.Stats) float64 { return st.Fill }), nil
	case ProgramFsync:
		tr, err := fsync.New(fsync.Config{CgroupV1: cfg.CgroupV1, Sysfs: cfg.Sysfs, Hooks: fsyncHooks}, log)
		if err != nil {
			return source{}, err
		}
		return newSource(program, cgroup.Blkio, tr, fsyncSeries, func(st fsync.Stats) float64 { return st.Fill }), nil
	case ProgramBlkio:
		tr, err := blkio.New(blkio.Config{CgroupV1: cfg.CgroupV1, Sysfs: cfg.Sysfs}, log)
		if err != nil {
			return source{}, err
		}
		return newSource(program, cgroup.Blkio, tr, blkioSeries, func(st blkio.Stats) float64 { return st.Fill }), nil
	case ProgramReclaim:
		tr, err := reclaim.New(reclaim.Config{CgroupV1: cfg.CgroupV1}, log)
		if err != nil {
			return source{}, err
		}
		return newSource(program, cgroup.Memory, tr, reclaimSeries, func(st reclaim.Stats) float64 { return st.Fill }), nil
	}
	return source{}, fmt.Errorf("unknown program %q", program)
}

// Status maps each program to StatusAttached or the reason it does not run.
func (t *Tracer) Status() map[string]string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.status)
}

// Fill maps each loaded program to the fill (0..1) of its fullest map keyed by cgroup at the
// last Snapshot.
func (t *Tracer) Fill() map[string]float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.fill)
}

// Snapshot is what the tracer's maps hold at one time.
type Snapshot struct {
	// Samples has every series in full, cumulative since the tracer started: a sample record
	// each (metric, cgroup, labels, and a value or a histogram) at the snapshot's time. Which
	// of them changed is for the consumer to decide (collect.Changes for a recording). The
	// run-queue series are the exception: they are thousands on a node of a thousand cgroups
	// (one per pair of cgroups that preempted each other), so only those that changed since
	// the previous Snapshot are in it, every one at the first.
	Samples []rundir.Record
	// Events are the discrete happenings (OOM kills) read since the previous snapshot, each at
	// its own time: they are drained from the kernel, so every snapshot has new ones only.
	Events []rundir.Record
	// Running are the cgroups with a task on a CPU at the snapshot (when the run-queue program
	// runs): with those whose run-queue series changed, what may have used CPU until the next.
	Running []string
}

// Snapshot reads the maps at time now, as an interval does: the run-queue pairs past a budget
// only every few calls (runq.Tracer.ReadPart). Every ForgetEvery snapshots, or when a map is
// fuller than ForgetFill, it then forgets the cgroups the resolver no longer knows, whose last
// values are in this snapshot. On a partial failure it returns what it could read and an error
// naming what failed.
func (t *Tracer) Snapshot(now time.Time) (Snapshot, error) { return t.snapshot(now, false) }

// SnapshotFull is Snapshot reading every map whole: a window's exact edge.
func (t *Tracer) SnapshotFull(now time.Time) (Snapshot, error) { return t.snapshot(now, true) }

func (t *Tracer) snapshot(now time.Time, full bool) (Snapshot, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var snap Snapshot
	if t.closed {
		return snap, errors.New("reading the tracer: closed")
	}
	var errs []error
	// The samples are made once every source is read, at their exact number: sized by the last
	// snapshots, one wave of wakeups made every snapshot after it as large.
	all := t.read[:0]
	samples := 0
	defer func() { clear(all); t.read = all[:0] }()
	for i := range t.sources {
		src := &t.sources[i]
		read := src.read
		if src.readPart != nil && !full {
			read = src.readPart
		}
		ss, fill, err := read(func(id uint64) string { return t.path(src.controller, id) })
		if err != nil {
			// Nothing new is known: keep the entries for the next try.
			errs = append(errs, fmt.Errorf("reading %s: %w", src.program, err))
			continue
		}
		if t.fill == nil {
			t.fill = map[string]float64{}
		}
		t.fill[src.program] = fill
		for _, s := range ss {
			switch {
			case s.running:
				snap.Running = append(snap.Running, s.cgroup)
			case s.event != nil:
				snap.Events = append(snap.Events, *s.event)
			default:
				samples++
			}
		}
		all = append(all, ss)

		// Past ForgetFill, early again only once the map grew: a map full of live cgroups'
		// entries would otherwise be walked at every read for nothing.
		early := fill > t.forgetFill && fill > src.forgot+earlyGrowth
		if src.reads++; src.reads < t.forgetEvery && !early {
			continue
		}
		src.reads, src.forgot = 0, 0
		if fill > t.forgetFill {
			src.forgot = fill
		}
		live, done := t.live(src.controller)
		n, err := src.forget(live)
		done()
		if err != nil {
			errs = append(errs, fmt.Errorf("forgetting removed cgroups in %s: %w", src.program, err))
		}
		if n > 0 {
			t.log.Debug("forgot removed cgroups", "program", src.program, "entries", n, "fill", fill)
		}
	}
	snap.Samples = make([]rundir.Record, 0, samples)
	for _, ss := range all {
		for _, s := range ss {
			if !s.running && s.event == nil {
				snap.Samples = append(snap.Samples, s.record(now))
			}
		}
	}
	return snap, errors.Join(errs...)
}

// liveResolver is a Resolver that can also tell, exactly, whether a cgroup still exists (its
// Path may keep answering for a removed one, to attribute late samples), for many ids in a
// row until done.
type liveResolver interface {
	Sweep(controller string) (live func(id uint64) bool, done func())
}

// live says which ids of controller's hierarchy to keep, until done: the exact answer when the
// resolver has one, so that a churning node's removed cgroups leave the maps at the next look
// rather than when the resolver's cache lets them go.
func (t *Tracer) live(controller string) (func(uint64) bool, func()) {
	if l, ok := t.res.(liveResolver); ok {
		sweep, done := l.Sweep(controller)
		// A cgroup's id is in many keys (its pairs with each preemptor): ask once a sweep.
		known := map[uint64]bool{}
		return func(id uint64) bool {
			live, ok := known[id]
			if !ok {
				live = sweep(id)
				known[id] = live
			}
			return live
		}, done
	}
	return func(id uint64) bool {
		_, ok := t.res.Path(controller, id)
		return ok
	}, func() {}
}

func (t *Tracer) path(controller string, id uint64) string {
	if p, ok := t.res.Path(controller, id); ok {
		return p
	}
	return fmt.Sprintf("<unknown:%d>", id)
}

// record is s as a sample at now. Its labels and histogram are s's own: the series functions
// build them anew at every read and nobody changes them after, so a snapshot of thousands of
// series copies none.
func (s series) record(now time.Time) rundir.Record {
	r := rundir.Record{Type: rundir.TypeSample, Time: now, Metric: s.metric, Cgroup: s.cgroup, Hist: s.hist}
	if len(s.labels) > 0 {
		r.Labels = s.labels
	}
	if s.hist == nil {
		v := s.value
		r.Value = &v
	}
	return r
}

// MountedTracefs is where New mounted tracefs for this tracer ("" when it found it mounted),
// so that a caller can record it and a later cleanup can unmount it if this process is killed.
func (t *Tracer) MountedTracefs() string {
	if !t.tracefs.Mounted() {
		return ""
	}
	return t.tracefs.Dir()
}

// Close detaches and unloads every program, then unmounts tracefs if New mounted it. It is
// safe to call more than once.
func (t *Tracer) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	t.closed = true
	var errs []error
	for _, src := range t.sources {
		if err := src.close(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := t.tracefs.Release(); err != nil {
		errs = append(errs, err)
	}
	if t.names != nil {
		if err := t.names.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func runqSeries(st runq.Stats, name namer) []series {
	out := make([]series, 0, len(st.Latency)+2*len(st.Pairs)+len(st.OnCPU)+len(st.Drops))
	for id, h := range st.Latency {
		out = append(out, series{metric: rundir.MetricRunqLatency, cgroup: name(id), hist: &h})
	}
	for _, p := range st.Pairs {
		var by string
		switch p.Preemptor {
		case runq.PreemptorIdle:
			by = rundir.CgroupIdle
		case runq.PreemptorThrottled:
			by = rundir.CgroupThrottled
		case runq.PreemptorKernel:
			by = rundir.CgroupKernel
		default:
			by = name(p.Preemptor)
		}
		labels := map[string]string{rundir.LabelPreemptor: by}
		victim := name(p.Victim)
		count, wait := rundir.MetricRunqPreemptions, rundir.MetricRunqPreemptWait
		if p.Woken {
			count, wait = rundir.MetricRunqWakeupWaits, rundir.MetricRunqWakeupWait
		}
		out = append(out,
			series{metric: count, cgroup: victim, labels: labels, value: float64(p.Count)},
			series{metric: wait, cgroup: victim, labels: labels, value: seconds(p.WaitNs)})
	}
	for _, id := range st.OnCPU {
		out = append(out, series{cgroup: name(id), running: true})
	}
	return append(out, dropSeries(ProgramRunq, st.Drops)...)
}

func fsyncSeries(st fsync.Stats, name namer) []series {
	var out []series
	for k, h := range st.Latency {
		labels := map[string]string{rundir.LabelSyscall: k.Syscall}
		if k.Dev != "" {
			labels[rundir.LabelDevice] = k.Dev
		}
		out = append(out, series{metric: rundir.MetricFsyncLatency, cgroup: name(k.Cgroup), labels: labels, hist: &h})
	}
	return append(out, dropSeries(ProgramFsync, st.Drops)...)
}

func blkioSeries(st blkio.Stats, name namer) []series {
	var out []series
	labels := func(k blkio.Key) map[string]string {
		l := map[string]string{rundir.LabelOp: k.Op}
		if k.Dev != "" {
			l[rundir.LabelDevice] = k.Dev
		}
		return l
	}
	for k, h := range st.Queue {
		out = append(out, series{metric: rundir.MetricBlkQueue, cgroup: name(k.Cgroup), labels: labels(k), hist: &h})
	}
	for k, h := range st.Service {
		out = append(out, series{metric: rundir.MetricBlkService, cgroup: name(k.Cgroup), labels: labels(k), hist: &h})
	}
	for k, c := range st.IO {
		cg := name(k.Cgroup)
		out = append(out,
			series{metric: rundir.MetricBlkBytes, cgroup: cg, labels: labels(k), value: float64(c.Bytes)},
			series{metric: rundir.MetricBlkRequests, cgroup: cg, labels: labels(k), value: float64(c.Requests)})
	}
	return append(out, dropSeries(ProgramBlkio, st.Drops)...)
}

func reclaimSeries(st reclaim.Stats, name namer) []series {
	var out []series
	for k, s := range st.Stalls {
		cg := name(k.Cgroup)
		if k.Kind == reclaim.KindCompaction {
			out = append(out, series{metric: rundir.MetricCompactionStall, cgroup: cg, hist: &s.Time})
			continue
		}
		labels := map[string]string{rundir.LabelKind: k.Kind}
		out = append(out,
			series{metric: rundir.MetricReclaimStall, cgroup: cg, labels: labels, hist: &s.Time},
			series{metric: rundir.MetricReclaimPages, cgroup: cg, labels: labels, value: float64(s.Pages)})
	}
	for id, n := range st.OOMKills {
		out = append(out, series{metric: rundir.MetricOOMKills, cgroup: name(id), value: float64(n)})
	}
	out = append(out,
		series{metric: rundir.MetricKswapdWakeups, value: float64(st.KswapdWakes)},
		series{metric: rundir.MetricKswapdSleeps, value: float64(st.KswapdSleeps)})
	for _, k := range st.Kills {
		out = append(out, series{event: oomKillEvent(k, name)})
	}
	return append(out, dropSeries(ProgramReclaim, st.Drops)...)
}

// oomKillEvent is the event record of an OOM kill.
func oomKillEvent(k reclaim.Kill, name namer) *rundir.Record {
	victim := name(k.Cgroup)
	labels := map[string]string{
		rundir.LabelOOMPID:         strconv.FormatUint(uint64(k.PID), 10),
		rundir.LabelOOMComm:        k.Comm,
		rundir.LabelOOMTriggerPID:  strconv.FormatUint(uint64(k.TriggerPID), 10),
		rundir.LabelOOMTriggerComm: k.TriggerComm,
	}
	limit := "no cgroup's memory limit (a node-wide OOM)"
	if k.Limit != 0 {
		lc := name(k.Limit)
		labels[rundir.LabelOOMLimitCgroup] = lc
		labels[rundir.LabelOOMUsage] = strconv.FormatUint(k.UsageBytes, 10)
		labels[rundir.LabelOOMLimit] = strconv.FormatUint(k.LimitBytes, 10)
		limit = fmt.Sprintf("the memory limit of %s (%d of %d bytes)", lc, k.UsageBytes, k.LimitBytes)
	}
	return &rundir.Record{Type: rundir.TypeEvent, Time: k.Time, Name: rundir.EventOOMKill, Cgroup: victim, Labels: labels,
		Message: fmt.Sprintf("OOM kill of process %d (%s) in %s, after %s was hit", k.PID, k.Comm, victim, limit)}
}

func dropSeries(program string, drops map[string]uint64) []series {
	var out []series
	for reason, n := range drops {
		out = append(out, series{metric: rundir.MetricBPFDrops,
			labels: map[string]string{rundir.LabelProgram: program, rundir.LabelReason: reason}, value: float64(n)})
	}
	return out
}

func seconds(ns uint64) float64 { return float64(ns) / 1e9 }
