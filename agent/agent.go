// Package agent is the always-on node agent (`nodectl agent`): a recording session of the
// whole node feeding the flight recorder, the incident detector, the Prometheus exporter and
// the gRPC API's live watchers, every interval; incidents analyzed once their window closes.
package agent

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"sync"
	"time"

	"github.com/nodectl/nodectl/agent/flightrec"
	"github.com/nodectl/nodectl/agent/recorded"
	"github.com/nodectl/nodectl/analyzer"
	"github.com/nodectl/nodectl/host"
	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/host/daemons"
	"github.com/nodectl/nodectl/internal/atomicfile"
	"github.com/nodectl/nodectl/internal/exepages"
	"github.com/nodectl/nodectl/internal/maproom"
	"github.com/nodectl/nodectl/record/collect"
	"github.com/nodectl/nodectl/record/session"
	"github.com/nodectl/nodectl/rundir"
)

// DefaultDataDir is where the agent keeps its flight recorder and incidents.
const DefaultDataDir = "/var/lib/nodectl/agent"

// DefaultDaemons are the system daemons the agent follows (their run-queue waits trigger
// incidents and are examined in every window).
var DefaultDaemons = []string{"kubelet", "containerd", "crio", "dockerd", "systemd-journald"}

// Config configures the agent.
type Config struct {
	Host       host.FS
	DataDir    string
	Interval   time.Duration // 0: 1s
	MaxCgroups int           // 0: session.DefaultMaxCgroups
	Retention  flightrec.Options
	Triggers   Triggers
	Windows    recorded.Windows
	Daemons    []string
	Version    string
	Log        *slog.Logger
	// Kube, if set, names pods and follows the node's Lease and Ready condition.
	Kube *Kube
}

// Agent is a running agent. Start it with Start, stop it with Close.
type Agent struct {
	cfg     Config
	log     *slog.Logger
	started time.Time
	meta    rundir.Meta
	layout  *cgroup.Layout
	store   *flightrec.Store
	sess    *session.Session
	inc     *incidents
	det     *detector
	kube    *kubeSide // nil off Kubernetes
	// apiAnalyses bounds the analyses the API runs (the incidents' worker runs its own).
	apiAnalyses *gate

	// Consumers of every interval's batch besides the store: the exporter, the API's watchers.
	mu          sync.Mutex
	observers   []func(t time.Time, batch []rundir.Record)
	forget      []func(cgroups []string)
	incidentFns []func(recorded.Incident)
	daemons     map[string]string // cgroup → daemon name
	walker      *daemons.Walker   // finds them: at start, then on the housekeeping's path only
	drops       map[dropKey]float64
	lastTick    time.Time

	// known and batches are the reaper's, on the collector's path only.
	known   map[string]struct{}
	room    maproom.Room // known's
	batches int
	exists  func(string) bool

	stop chan struct{}
	wg   sync.WaitGroup
}

// recorded.MetaFile is the agent's rundir.Meta in the data directory: what a post-mortem without the
// agent needs to know of the node.

// Start opens the data directory, loads the tracer and starts
// recording. Nothing is left behind when it fails.
func Start(cfg Config) (a *Agent, err error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Triggers == (Triggers{}) {
		cfg.Triggers = DefaultTriggers
	}
	if cfg.Windows == (recorded.Windows{}) {
		cfg.Windows = recorded.DefaultWindows
	}
	if err := errors.Join(cfg.Triggers.Validate(), cfg.Windows.Validate()); err != nil {
		return nil, err
	}
	layout, err := cgroup.DetectProcfs(cfg.Host.Cgroupfs, cfg.Host.Procfs)
	if err != nil {
		return nil, err
	}
	// The tracer's resolver follows the kernel's mkdirs and rmdirs: the reaper's looks ask it first.
	res := cgroup.NewResolver(layout)
	a = &Agent{cfg: cfg, log: cfg.Log, started: time.Now(), layout: layout, daemons: map[string]string{}, apiAnalyses: newGate(maxAPIAnalyses, maxAPIQueued),
		drops: map[dropKey]float64{}, stop: make(chan struct{}), known: map[string]struct{}{}, exists: session.CgroupExists(layout, res),
		walker: daemons.NewWalker(cfg.Host.Procfs, cfg.Daemons)}
	opts := cfg.Retention
	opts.Dir, opts.Log = cfg.DataDir, cfg.Log.With("component", "flightrec")
	if a.store, err = flightrec.Open(opts); err != nil {
		return nil, err
	}
	started := a // a failed return below sets a to nil
	defer func() {
		if err != nil {
			started.Close()
		}
	}()
	a.meta = rundir.NewMeta(rundir.ScenarioAgent, rundir.ScenarioAgent, cfg.Host.Procfs, layout.V1, cfg.Interval, os.Args)
	if cfg.Kube != nil {
		// In a pod the host name is the pod's: the node is the one Kubernetes knows.
		a.meta.Node = cfg.Kube.Node
	}
	a.inc = &incidents{dir: filepath.Join(cfg.DataDir, recorded.IncidentsDir), windows: cfg.Windows, log: cfg.Log.With("component", "incidents"),
		pin: a.store.Pin, unpin: a.store.Unpin, analyze: a.analyzeWindow, publish: a.publishIncident,
		oldest: func() time.Time { return a.store.Status().Oldest }}
	if err := a.inc.load(); err != nil {
		return nil, err
	}
	a.det = newDetector(cfg.Triggers, a.daemon)
	a.det.name = a.workloadName
	a.findDaemons()
	var sources map[string]collect.Source
	if cfg.Kube != nil {
		idle := cmp.Or(cfg.Retention.SeriesIdle, flightrec.DefaultSeriesIdle)
		a.kube = startKube(*cfg.Kube, cfg.Log.With("component", "kube"), a.kubeletCgroup, idle/2)
		sources = map[string]collect.Source{"kube": a.kube}
	}
	a.sess, err = session.New(session.Config{
		Host: cfg.Host, Layout: layout, Interval: cfg.Interval, Trace: true, MaxCgroups: cfg.MaxCgroups,
		Resolver: res,
		Exists:   a.exists, // the reaper's: one look a cgroup serves both
		Priority: func(cg string) bool { _, ok := a.daemon(cg); return ok },
		Sources:  sources,
		Log:      cfg.Log.With("component", "session"),
	}, appender{a})
	if err != nil {
		return nil, err
	}
	a.meta.Tracer = a.sess.TracerStatus()
	if err := a.saveMeta(); err != nil {
		return nil, err
	}
	a.wg.Add(2)
	go func() { defer a.wg.Done(); a.inc.analyzeLoop(a.stop) }()
	go func() { defer a.wg.Done(); a.housekeeping() }()
	a.sess.Background(cfg.Log)
	return a, nil
}

// OnBatch adds a consumer of every interval's records (the exporter, the API's watchers). It
// runs on the collector's path: it must not block.
func (a *Agent) OnBatch(fn func(t time.Time, batch []rundir.Record)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.observers = append(a.observers, fn)
}

// OnForget adds a consumer of the cgroups found removed (the exporter deletes their series).
func (a *Agent) OnForget(fn func(cgroups []string)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.forget = append(a.forget, fn)
}

// OnIncident adds a consumer of every incident opened, analyzing or closed.
func (a *Agent) OnIncident(fn func(recorded.Incident)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.incidentFns = append(a.incidentFns, fn)
}

func (a *Agent) publishIncident(in recorded.Incident) {
	a.mu.Lock()
	fns := a.incidentFns
	a.mu.Unlock()
	for _, fn := range fns {
		fn(in)
	}
}

// dropKey is a BPF program's drop reason.
type dropKey struct{ program, reason string }

// appender receives every interval's batch from the session.
type appender struct{ a *Agent }

// Append stores the batch and hands it on. It never fails: a full or read-only disk is the
// store's to report, and the agent keeps tracing and serving.
func (ap appender) Append(batch ...rundir.Record) error {
	a := ap.a
	t := tickTime(batch)
	if err := a.store.Append(t, batch); err != nil {
		a.log.Debug("flight recorder append failed", "err", err)
	}
	a.mu.Lock()
	a.lastTick = t
	for _, r := range batch {
		if r.Metric == rundir.MetricBPFDrops && r.Value != nil {
			a.drops[dropKey{r.Labels[rundir.LabelProgram], r.Labels[rundir.LabelReason]}] = *r.Value
		}
	}
	observers := a.observers
	a.mu.Unlock()
	for _, fn := range observers {
		fn(t, batch)
	}
	a.reap(batch)
	a.inc.fire(a.det.observe(t, batch))
	a.inc.tick(t)
	return nil
}

// tickTime is the interval's time: its samples all carry it (events keep their own).
func tickTime(batch []rundir.Record) time.Time {
	var t time.Time
	for _, r := range batch {
		if r.Type == rundir.TypeSample && r.Time.After(t) {
			t = r.Time
		}
	}
	if t.IsZero() {
		t = time.Now()
	}
	return t
}

// reapEvery is how many intervals pass between two looks for removed cgroups: a stat each.
const reapEvery = 30

// reap notes the cgroups batch names and, every reapEvery intervals, forgets those removed
// since: the detector's references and the exporter's series go with them. It knows every
// cgroup a consumer may hold (all come from the batches), also those beyond the samplers'
// bound; their number is bounded by the tracer's maps and the samplers' bound.
func (a *Agent) reap(batch []rundir.Record) {
	for i := range batch {
		if cg := batch[i].Cgroup; cg != "" && cg[0] != '<' {
			if _, seen := a.known[cg]; !seen && a.kube != nil {
				a.kube.ids.Identify(cg) // named when first seen, for windows and incidents
			}
			a.known[cg] = struct{}{}
		}
		// A preemptor is a cgroup too, whose series in others' the exporter drops with it.
		if p := batch[i].Labels[rundir.LabelPreemptor]; p != "" && p[0] == '/' {
			a.known[p] = struct{}{}
		}
	}
	if a.batches++; a.batches%reapEvery != 0 {
		return
	}
	defer releaseFreeHeap()
	var gone []string
	a.room.Saw(len(a.known))
	for cg := range a.known {
		if !a.exists(cg) {
			gone = append(gone, cg)
			delete(a.known, cg)
		}
	}
	if len(gone) == 0 {
		return
	}
	a.known = maproom.Fit(&a.room, a.known)
	a.mu.Lock()
	fns := a.forget
	a.mu.Unlock()
	for _, fn := range fns {
		fn(gone)
	}
	a.det.forget(gone)
	if a.kube != nil {
		a.kube.forget(gone)
	}
	if len(gone) >= releaseAfter {
		// A churn's state is garbage now; the runtime would keep its pages for minutes.
		debug.FreeOSMemory()
	}
}

// releaseAfter is how many cgroups forgotten in one look make the agent hand its freed memory
// back to the kernel at once: a node that churned through thousands of sandboxes, not the
// odd pod that went.
const releaseAfter = 100

// releaseFreeHeap hands the heap's free pages back to the kernel when they are more than
// freeHeapFloor and than the live heap: what a churn's state leaves behind after the recorder
// compacted its tables and the maps were made again, minutes after the cgroups went, which the
// runtime's scavenger would otherwise return over minutes more. In a steady agent the free
// heap stays below the live one (the collector's pacing) and this costs a metrics read.
func releaseFreeHeap() {
	m := []metrics.Sample{{Name: "/memory/classes/heap/free:bytes"}, {Name: "/gc/heap/live:bytes"}}
	metrics.Read(m)
	if m[0].Value.Kind() != metrics.KindUint64 || m[1].Value.Kind() != metrics.KindUint64 {
		return
	}
	if free := m[0].Value.Uint64(); free > freeHeapFloor && free > m[1].Value.Uint64() {
		debug.FreeOSMemory()
	}
}

// freeHeapFloor: less free heap than this is left to the runtime.
const freeHeapFloor = 8 << 20

func (a *Agent) daemon(cg string) (string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	n, ok := a.daemons[cg]
	return n, ok
}

// workloadName is how incidents name a cgroup: its daemon's name, its pod's
// (namespace/pod[/container]), or "" for a cgroup nothing names.
func (a *Agent) workloadName(cg string) string {
	if n, ok := a.daemon(cg); ok {
		return n
	}
	if a.kube != nil {
		if id, ok := a.kube.ids.Identify(cg); ok {
			return id.Name
		}
	}
	return ""
}

// kubeletCgroup is the cgroup of the daemon named kubelet, "" when none was found.
func (a *Agent) kubeletCgroup() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	for cg, n := range a.daemons {
		if n == "kubelet" || strings.HasPrefix(n, "kubelet+") || strings.Contains(n, "+kubelet") {
			return cg
		}
	}
	return ""
}

// daemonsEvery is how often the agent looks for the system daemons again (a restarted kubelet
// may be in another cgroup).
const daemonsEvery = time.Minute

// findDaemons looks for the system daemons and records them in the agent's meta.
func (a *Agent) findDaemons() {
	found, _, err := a.walker.Find(a.layout)
	if err != nil {
		a.log.Warn("looking for system daemons", "err", err)
		return
	}
	byCgroup := map[string]string{}
	var wl []rundir.Workload
	for _, d := range found {
		byCgroup[d.Cgroup] = d.Name
		wl = append(wl, rundir.Workload{Name: d.Name, Kind: rundir.KindDaemon, Cgroup: d.Cgroup})
	}
	a.mu.Lock()
	a.daemons = byCgroup
	a.meta.Workloads = wl
	a.mu.Unlock()
}

// startPagesAfter is when the agent gives back the pages of its binary that its start mapped
// (internal/exepages): its setup (the tracer's loading, the API's clients) is over, and a
// forget sweep (every 30 intervals of a second) has run. What runs less often maps its pages
// again when it runs.
const startPagesAfter = 30 * time.Second

// housekeeping looks for the daemons again now and then, keeps meta.json current, and once
// gives back the binary's pages the start mapped.
func (a *Agent) housekeeping() {
	t := time.NewTicker(daemonsEvery)
	defer t.Stop()
	startPages := time.NewTimer(startPagesAfter)
	defer startPages.Stop()
	for {
		select {
		case <-a.stop:
			return
		case <-startPages.C:
			a.releaseStartPages()
		case <-t.C:
			a.findDaemons()
			if err := a.saveMeta(); err != nil {
				a.log.Debug("saving the agent's meta", "err", err)
			}
		}
	}
}

// releaseStartPages gives back the pages of the agent's binary that only its start touched:
// every package's init and the setup spread over the whole binary, whose pages the kernel
// keeps mapped (10-11 of 26 MiB at 1,000 cgroups).
func (a *Agent) releaseStartPages() {
	before, err := exepages.Resident()
	if err == nil {
		err = exepages.Release()
	}
	if err != nil {
		a.log.Warn("giving back the binary's start-up pages", "err", err)
		return
	}
	after, _ := exepages.Resident()
	a.log.Debug("gave back the binary's start-up pages", "resident_before_bytes", before, "resident_after_bytes", after)
}

// Meta is the agent's description of the node, for a window's run directory.
func (a *Agent) Meta() rundir.Meta {
	a.mu.Lock()
	m := a.meta
	m.Workloads = append([]rundir.Workload(nil), a.meta.Workloads...)
	a.mu.Unlock()
	if a.kube != nil {
		m.Pods, m.Booking = a.kube.windowPods(nil), a.kube.booking()
	}
	return m
}

func (a *Agent) saveMeta() error {
	return writeJSON(filepath.Join(a.cfg.DataDir, recorded.MetaFile), a.Meta())
}

// writeJSON replaces path with v's JSON whole (internal/atomicfile).
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(path, b, 0o600)
}

// analyzeWindow runs the analyzer on a window of the flight recorder.
//
// The analysis holds the window's records in the agent's memory: it reads each phase at as many
// ticks as keep them within analysisRecords (every series changing at every tick read), at
// least 2 (the phase's edges, where counters are exact), so that a node of thousands of series
// costs the agent a bounded transient, at the price of coarser gauges. Close stops it.
func (a *Agent) analyzeWindow(w recorded.Window) (*analyzer.Report, error) {
	if w.Stop == nil {
		w.Stop = a.stop
	}
	w, err := w.Bounded(a.store, a.Meta(), a.store.Status().Series)
	if err != nil {
		return nil, err
	}
	defer debug.FreeOSMemory() // the transient back to the kernel, not held as the agent's RSS
	return recorded.AnalyzeWindow(a.store, a.Meta(), w)
}

// Analyze runs the analyzer on a window of the live recorder for the API: one at a time, a few
// more queued (errBusy past them), and a request given up (ctx done) stops its read.
func (a *Agent) Analyze(ctx context.Context, w recorded.Window) (*analyzer.Report, error) {
	leave, err := a.apiAnalyses.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer leave()
	stop, release := stopOn(ctx, a.stop)
	defer release()
	w.Stop = stop
	rep, err := a.analyzeWindow(w)
	if errors.Is(err, recorded.ErrStopped) && ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	return rep, err
}

// Read reads the live recorder.
func (a *Agent) Read(from, to time.Time, step time.Duration, fn func(rundir.Record) error) error {
	return a.store.Read(from, to, step, fn)
}

// Incidents lists the incidents opened since, newest first, at most limit (0: all).
func (a *Agent) Incidents(since time.Time, limit int) []recorded.Incident {
	return a.inc.list(since, limit)
}

// Incident returns one incident.
func (a *Agent) Incident(id string) (recorded.Incident, bool) { return a.inc.get(id) }

// Close stops recording, waits for the analysis under way, and closes the store.
func (a *Agent) Close() error {
	var errs []error
	select {
	case <-a.stop:
	default:
		close(a.stop)
	}
	if a.sess != nil {
		errs = append(errs, a.sess.Close())
	}
	if a.kube != nil {
		a.kube.close()
	}
	a.wg.Wait()
	if a.store != nil {
		errs = append(errs, a.store.Close())
	}
	return errors.Join(errs...)
}

// Run runs an agent until ctx is done.
func Run(ctx context.Context, cfg Config) error {
	a, err := Start(cfg)
	if err != nil {
		return err
	}
	<-ctx.Done()
	return a.Close()
}
