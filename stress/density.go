package stress

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/nodectl/nodectl/internal/badvalue"
	"github.com/nodectl/nodectl/internal/quantity"

	"golang.org/x/sys/unix"

	"github.com/nodectl/nodectl/host/blockdev"
	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/host/swapfile"
	"github.com/nodectl/nodectl/record/collect"
	"github.com/nodectl/nodectl/record/sample"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/stress/launch"
	"github.com/nodectl/nodectl/stress/workload"
	"github.com/nodectl/nodectl/tuner"
	"github.com/nodectl/nodectl/tuner/swap"
	"github.com/nodectl/nodectl/tuner/sysctl"
)

// DensityConfig configures `nodectl stress density`.
type DensityConfig struct {
	Step         int           // sandboxes added per step
	Max          int           // the sweep stops after the step that reaches it
	Pace         time.Duration // between two sandbox launches within a step
	StepDuration time.Duration // how long each step holds its density after its sandboxes are ready
	ReadyTimeout time.Duration // how long a sandbox may take to become ready; 0 = DefaultReadyTimeout

	SandboxMemory int64         // anonymous heap of each sandbox
	HotShare      float64       // share of its heap a sandbox's bursts touch; 0 = workload default
	BinaryBytes   int64         // the shared binary's size; 0 = DefaultBinaryBytes
	Activity      time.Duration // between a sandbox's activity bursts; 0 = workload default
	RequestBytes  int64         // each sandbox's memory request (recorded; the scheduler's view)
	LimitBytes    int64         // each sandbox's memory limit; 0 = none

	NodeMemory int64  // memory limit of the run's cgroup, the emulated node; 0 = none
	SwapFile   string // swap file to create and enable for the run, or a swap device to turn on; "" = none
	SwapBytes  int64  // the swap file's size; 0 = SwapFile is a block device formatted with mkswap
	// Swappiness and WatermarkScaleFactor set vm.swappiness and vm.watermark_scale_factor for
	// the run (and the run cgroup's memory.swappiness on v1); -1 leaves them.
	Swappiness           int
	WatermarkScaleFactor int

	Criteria DensityCriteria

	RunOptions
}

// DensityCriteria say when a step has collapsed: the first one crossed ends the sweep. A zero
// bound is off.
type DensityCriteria struct {
	ReadinessP99 time.Duration // a step's sandboxes' readiness p99 above this (or one never ready)
	PSIFull      float64       // memory PSI full of the run's cgroup, share of the step's time
	OOMKill      bool          // any OOM kill in the run's cgroup
	TickGap      time.Duration // a sandbox's tick late by more than this
	// LeaseLate: the node's Lease renewed later than its renew interval by more than this (a
	// run of pods on a Kubernetes node only).
	LeaseLate time.Duration
}

// Defaults of `stress density`.
var DefaultDensityCriteria = DensityCriteria{ReadinessP99: 10 * time.Second, PSIFull: 0.10, OOMKill: true, TickGap: 5 * time.Second, LeaseLate: 3 * time.Second}

const (
	DefaultReadyTimeout = time.Minute
	DefaultBinaryBytes  = 64 << 20
	// hostReserve is what a sweep without --node-memory must leave of the machine's memory.
	hostReserve = 4 << 30
)

// Density adds sandboxes in steps until a step collapses (DensityCriteria) or Max is reached,
// recording each step as a phase step-<density>. It returns the run directory; the caller
// analyzes it. Everything the run made or changed on the host (cgroups, sandboxes, the swap file,
// sysctls, scratch files) is removed or restored before it returns, also when ctx is cancelled
// or a step fails.
func Density(ctx context.Context, cfg DensityConfig) (dir string, err error) {
	if err := cfg.RunOptions.defaults(); err != nil {
		return "", err
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = DefaultReadyTimeout
	}
	if cfg.BinaryBytes == 0 {
		cfg.BinaryBytes = DefaultBinaryBytes
	}
	if cfg.Step < 1 || cfg.Max < cfg.Step || cfg.SandboxMemory < 1<<20 || cfg.StepDuration <= 0 {
		return "", errors.New("a density run needs a step of at least 1, a max of at least the step, sandboxes of at least 1Mi and a step duration")
	}
	if err := checkFits(cfg); err != nil {
		return "", err
	}
	host, err := newRunHost(cfg.RunOptions, rundir.ScenarioDensity)
	if err != nil {
		return "", err
	}
	r := &densityRun{runHost: host, cfg: cfg}
	return runScenario(ctx, &r.runHost, r)
}

// checkFits refuses a sweep that could exhaust the machine: without --node-memory, every
// sandbox's heap must fit in what the host has available, less a reserve.
func checkFits(cfg DensityConfig) error {
	if cfg.NodeMemory > 0 {
		return nil
	}
	avail, err := sample.MemAvailable(cfg.Paths.Procfs)
	if err != nil {
		return err
	}
	need := int64(cfg.Max) * cfg.SandboxMemory
	if need > avail-hostReserve {
		return badvalue.Errorf(FieldNodeMemory, "", "%d sandboxes of %s need %s, more than this host has available less %s: give the node a memory size to emulate a smaller node inside a memory-limited cgroup",
			cfg.Max, quantity.FormatSize(cfg.SandboxMemory), quantity.FormatSize(need), quantity.FormatSize(hostReserve))
	}
	return nil
}

type densityRun struct {
	runHost
	cfg      DensityConfig
	binary   string
	swapSize int64 // of the run's swap file or device, 0 without

	mu        sync.Mutex // guards what measurements and the collector read
	workloads []rundir.Workload
	ready     map[string]time.Time // sandbox -> when its ready line arrived
	launched  map[string]time.Time
	worstTick float64   // worst tick lateness since the step began
	tickAt    time.Time // when it was recorded
}

func (r *densityRun) setup(ctx context.Context) error {
	cfg := r.cfg
	r.ready, r.launched = map[string]time.Time{}, map[string]time.Time{}
	if err := r.changeHost(ctx); err != nil {
		return err
	}
	// Without --swap an emulated node is kept from swapping. On v1 a memcg has its own
	// swappiness, copied from its parent when it is made: set the run's so the sandboxes'
	// cgroups inherit it.
	lim := cgroup.Limits{MemoryBytes: cfg.NodeMemory, NoSwap: cfg.SwapFile == "" && cfg.NodeMemory > 0}
	if cfg.Swappiness >= 0 {
		lim.Swappiness = &cfg.Swappiness
	}
	if err := r.createRunCgroup(lim); err != nil {
		return err
	}
	r.binary = filepath.Join(r.scratch, "binary")
	if err := writeBinary(r.binary, cfg.BinaryBytes); err != nil {
		return err
	}
	if err := r.newLauncher(); err != nil {
		return err
	}
	var devices []string
	// A swap file's disk is its directory's; a swap device is its own.
	swapAt := filepath.Dir(cfg.SwapFile)
	if cfg.SwapBytes == 0 {
		swapAt = cfg.SwapFile
	}
	paths := []string{cfg.Paths.Scratch}
	if cfg.SwapFile != "" {
		paths = append(paths, swapAt)
	}
	for _, p := range paths {
		dev, err := blockdev.ForPath(cfg.Paths.Sysfs, p)
		if err != nil {
			cfg.Log.Warn("no block device behind a path the run uses", "path", p, "err", err)
			continue
		}
		if !slices.Contains(devices, dev) {
			devices = append(devices, dev)
		}
	}
	swapDev := ""
	if cfg.SwapFile != "" {
		swapDev, _ = blockdev.ForPath(cfg.Paths.Sysfs, swapAt)
	}
	r.workloads = []rundir.Workload{{Name: rundir.WorkloadNode, Kind: rundir.KindNode, Cgroup: RunCgroup(r.id), Memory: quantity.FormatSize(cfg.NodeMemory),
		Target: cfg.SwapFile, Device: swapDev}}
	if err := r.writer.Append(r.configEvent()); err != nil {
		return err
	}
	return r.startRecording(cfg.RunOptions, r.workloads, recordingSpec{cgroups: r.cgroupPaths,
		// The node's memory and pressure are rated per step: read in full at every sample.
		priority: func(p string) bool { return p == RunCgroup(r.id) },
		devices:  func() []string { return devices },
		sources:  map[string]collect.Source{"emulated-node": collect.SourceFunc(r.sampleNode)}})
}

// configEvent records the sweep's configuration for the analyzer: sizes in bytes, bounds in
// seconds or shares, as event labels (meta.json has no place for them).
func (r *densityRun) configEvent() rundir.Record {
	cfg := r.cfg
	return rundir.DensityConfig{Step: cfg.Step, Max: cfg.Max, CPUs: runtime.NumCPU(),
		SandboxMemoryBytes: cfg.SandboxMemory, BinaryBytes: cfg.BinaryBytes, RequestBytes: cfg.RequestBytes,
		LimitBytes: cfg.LimitBytes, NodeMemoryBytes: cfg.NodeMemory, SwapBytes: r.swapSize,
		Swappiness: cfg.Swappiness, WatermarkScaleFactor: cfg.WatermarkScaleFactor,
		CriterionReadinessP99: cfg.Criteria.ReadinessP99.Seconds(), CriterionPSIFullShare: cfg.Criteria.PSIFull,
		CriterionOOMKill: cfg.Criteria.OOMKill, CriterionTickGap: cfg.Criteria.TickGap.Seconds(),
	}.Record(time.Now())
}

// changeHost turns the run's swap on and sets its sysctls through the tuner's engine, which
// records each setting's earlier value in the run's state before it changes it.
func (r *densityRun) changeHost(ctx context.Context) error {
	cfg := r.cfg
	h := cfg.Paths.FS
	var settings []tuner.Setting
	if cfg.SwapFile != "" {
		// At the kernel's default priority, below any swap the host has.
		a := swap.Area{File: cfg.SwapFile, Size: cfg.SwapBytes, Priority: -1, Enabled: true}
		if cfg.SwapBytes == 0 {
			// The user's device: refused unless formatted, and put back off, so it must be off now.
			if _, err := swapfile.OpenDevice(cfg.SwapFile); err != nil {
				return badvalue.New(FieldSwapFile, cfg.SwapFile, err)
			}
			if _, on, err := swap.Find(h, cfg.SwapFile); err != nil {
				return err
			} else if on {
				return badvalue.Errorf(FieldSwapFile, cfg.SwapFile, "the device is already in use as swap; name one that is off, which the run turns on and off")
			}
			a = swap.Area{Device: cfg.SwapFile, Priority: -1, Enabled: true}
		} else if _, err := os.Lstat(cfg.SwapFile); err == nil {
			return badvalue.Errorf(FieldSwapFile, cfg.SwapFile, "the file exists; name a new file, which the run creates and removes")
		}
		settings = append(settings, swap.New(h, a))
	}
	for _, s := range []struct {
		key string
		v   int
	}{{"vm.swappiness", cfg.Swappiness}, {"vm.watermark_scale_factor", cfg.WatermarkScaleFactor}} {
		if s.v >= 0 {
			settings = append(settings, sysctl.New(h, s.key, strconv.Itoa(s.v)))
		}
	}
	if len(settings) == 0 {
		return nil
	}
	if _, err := hostEngine(cfg.Paths, r.id, settings, cfg.Log.With("component", "host")).Apply(ctx); err != nil {
		return err
	}
	if cfg.SwapFile != "" {
		// The size the swap header gives: a file's is rounded down to pages.
		f, err := swapfile.Open(cfg.SwapFile, true)
		if err != nil {
			return err
		}
		r.swapSize = f.Size
	}
	return nil
}

// writeBinary writes the sandboxes' shared binary and drops it from the page cache, so that the
// first sandbox to map it reads it in and the run's cgroup is charged for its pages.
func writeBinary(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("writing the sandboxes' binary: %w", err)
	}
	defer f.Close()
	// Incompressible, like machine code, in case the filesystem or zswap compresses.
	rng := rand.NewChaCha8([32]byte{1})
	buf := make([]byte, 1<<20)
	for left := size; left > 0; left -= int64(len(buf)) {
		_, _ = rng.Read(buf)
		if _, err := f.Write(buf[:min(left, int64(len(buf)))]); err != nil {
			return fmt.Errorf("writing the sandboxes' binary: %w", err)
		}
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("writing the sandboxes' binary: %w", err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("dropping the sandboxes' binary from the page cache: %w", err)
	}
	return f.Close()
}

func (r *densityRun) cgroupPaths() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, len(r.workloads))
	for i, w := range r.workloads {
		out[i] = w.Cgroup
	}
	return out
}

// sampleNode reads the emulated node's memory (the run cgroup's usage, limit, anonymous and file
// memory, swap), its OOM kills, and the run's swap file.
func (r *densityRun) sampleNode(now time.Time) ([]rundir.Record, error) {
	cg := RunCgroup(r.id)
	var out []rundir.Record
	mem, err := sample.CgroupMemory(r.layout, cg)
	if err == nil {
		named := map[string]int64{rundir.NodeMemoryUsage: mem.Usage, rundir.NodeMemoryLimit: mem.Limit, rundir.NodeMemoryAnon: mem.Anon,
			rundir.NodeMemoryFile: mem.File, rundir.NodeMemoryInactiveFile: mem.InactiveFile, rundir.NodeMemoryWorkingSet: mem.WorkingSet()}
		if mem.Swap >= 0 {
			named[rundir.NodeMemorySwap] = mem.Swap
		}
		for _, name := range slices.Sorted(maps.Keys(named)) {
			v := float64(named[name])
			out = append(out, rundir.Record{Type: rundir.TypeSample, Time: now, Metric: rundir.MetricDensityMemory, Cgroup: cg, Workload: rundir.WorkloadNode,
				Labels: map[string]string{rundir.LabelName: name}, Value: &v})
		}
	}
	if oom := r.oomKills(); oom >= 0 {
		v := float64(oom)
		out = append(out, rundir.Record{Type: rundir.TypeSample, Time: now, Metric: rundir.MetricDensityOOMKills, Cgroup: cg, Workload: rundir.WorkloadNode, Value: &v})
	}
	if r.cfg.SwapFile != "" {
		a, on, serr := swap.Find(r.cfg.Paths.FS, r.cfg.SwapFile)
		if serr != nil {
			err = errors.Join(err, serr)
		} else if on {
			for name, b := range map[string]int64{rundir.SwapFileUsed: a.Used, rundir.SwapFileSize: r.swapSize} {
				v := float64(b)
				out = append(out, rundir.Record{Type: rundir.TypeSample, Time: now, Metric: rundir.MetricDensitySwap,
					Labels: map[string]string{rundir.LabelName: name}, Value: &v})
			}
		}
	}
	return out, err
}

// memoryFullTotal is the run cgroup's memory PSI full total, in seconds; ok is false where the
// host has no per-cgroup pressure.
func (r *densityRun) memoryFullTotal() (float64, bool) {
	p, err := sample.CgroupPressure(r.layout, RunCgroup(r.id), rundir.ResourceMemory)
	return p.Full.Seconds(), err == nil
}

// oomKills counts the OOM kills in the node's cgroup and below, -1 when the kernel does not say.
// v2 memory.events counts a cgroup's descendants; v1 memory.oom_control counts only the
// cgroup's own tasks, so there every sandbox's is added.
func (r *densityRun) oomKills() int64 {
	paths := []string{RunCgroup(r.id)}
	if r.layout.V1 {
		paths = r.cgroupPaths()
	}
	n := int64(-1)
	for _, p := range paths {
		if k, err := sample.OOMKills(r.layout, p); err == nil {
			n = max(n, 0) + k
		}
	}
	return n
}

// crossing is a collapse criterion crossed, and when it was seen.
type crossing struct {
	signal       string
	value, bound float64
	at           time.Time
}

// run sweeps: it runs the steps until one collapses or Max is reached.
func (r *densityRun) run(ctx context.Context) error {
	n := 0
	for n < r.cfg.Max {
		d := min(n+r.cfg.Step, r.cfg.Max)
		c, err := r.step(ctx, n, d)
		if err != nil {
			return err
		}
		n = d
		if c != nil {
			return r.writer.Append(rundir.Collapse{Density: d, Signal: c.signal, Value: c.value, Bound: c.bound}.Record(c.at,
				fmt.Sprintf("density %d collapsed: %s %.3g over its bound %.3g", d, c.signal, c.value, c.bound)))
		}
	}
	return nil
}

// step brings the density from n to d sandboxes (paced), waits for them to be ready, holds the
// density for StepDuration, and says which collapse criterion it crossed first, if any. A step
// ends early once one is crossed.
func (r *densityRun) step(ctx context.Context, n, d int) (*crossing, error) {
	name := rundir.StepPhase(d)
	start := time.Now()
	if err := r.session.Snapshot(start); err != nil {
		return nil, err
	}
	if err := r.writer.Append(rundir.Record{Type: rundir.TypePhase, Time: start, Name: name, Event: rundir.EventStart}); err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.worstTick, r.tickAt = 0, time.Time{}
	r.mu.Unlock()
	oom0 := r.oomKills()
	crit := r.cfg.Criteria

	var found []crossing
	check := func(now time.Time) {
		if crit.OOMKill && oom0 >= 0 {
			if k := r.oomKills(); k > oom0 && !hasSignal(found, rundir.SignalOOMKill) {
				found = append(found, crossing{rundir.SignalOOMKill, float64(k - oom0), 0, now})
			}
		}
		if crit.OOMKill && !hasSignal(found, rundir.SignalOOMKill) && r.killedSandbox() {
			found = append(found, crossing{rundir.SignalOOMKill, 1, 0, now})
		}
		r.mu.Lock()
		worst, at := r.worstTick, r.tickAt
		r.mu.Unlock()
		if crit.TickGap > 0 && worst > crit.TickGap.Seconds() && !hasSignal(found, rundir.SignalTickGap) {
			found = append(found, crossing{rundir.SignalTickGap, worst, crit.TickGap.Seconds(), at})
		}
	}
	// Launch this step's sandboxes, paced.
	var names []string
	for i := n; i < d; i++ {
		if i > n && r.cfg.Pace > 0 {
			if err := r.hold(ctx, name, start, r.cfg.Pace, check, func() bool { return len(found) > 0 }); err != nil {
				return nil, err
			}
		}
		w, err := r.launch(i)
		if err != nil {
			return nil, err
		}
		names = append(names, w)
	}
	// Wait until they are ready (or time out), then hold the density.
	readyBy := time.Now().Add(r.cfg.ReadyTimeout)
	for !r.allReady(names) && time.Now().Before(readyBy) && len(found) == 0 {
		if err := r.hold(ctx, name, start, 250*time.Millisecond, check, func() bool { return r.allReady(names) || len(found) > 0 }); err != nil {
			return nil, err
		}
	}
	// Memory pressure counts over the second half of the hold only: a new sandbox's start-up
	// reclaim, and the others faulting back what it pushed out, are the price of density and
	// settle; pressure that stays is the collapse ("past the point of recovery").
	stopEarly := func() bool { return len(found) > 0 }
	settle := r.cfg.StepDuration / 2
	if !stopEarly() {
		if err := r.hold(ctx, name, start, settle, check, stopEarly); err != nil {
			return nil, err
		}
	}
	settled := time.Now()
	if err := r.session.Snapshot(settled); err != nil {
		return nil, err
	}
	if err := r.writer.Append(rundir.HoldRecord(settled, name)); err != nil {
		return nil, err
	}
	full0, psiOK := r.memoryFullTotal()
	if !stopEarly() {
		if err := r.hold(ctx, name, start, r.cfg.StepDuration-settle, check, stopEarly); err != nil {
			return nil, err
		}
	}
	end := time.Now()
	check(end)
	if crit.ReadinessP99 > 0 {
		var ready []float64
		r.mu.Lock()
		for _, w := range names {
			if at, ok := r.ready[w]; ok {
				ready = append(ready, at.Sub(r.launched[w]).Seconds())
			} else {
				ready = append(ready, end.Sub(r.launched[w]).Seconds()) // never ready: at least this long
			}
		}
		r.mu.Unlock()
		if p99 := P99(ready); p99 > crit.ReadinessP99.Seconds() {
			found = append(found, crossing{rundir.SignalReadiness, p99, crit.ReadinessP99.Seconds(), end})
		}
	}
	if full1, ok := r.memoryFullTotal(); crit.PSIFull > 0 && psiOK && ok {
		if share := (full1 - full0) / max(end.Sub(settled).Seconds(), 1e-9); share > crit.PSIFull {
			found = append(found, crossing{rundir.SignalPSIFull, share, crit.PSIFull, end})
		}
	}
	if err := r.session.Snapshot(end); err != nil {
		return nil, err
	}
	if err := r.writer.Append(rundir.Record{Type: rundir.TypePhase, Time: end, Name: name, Event: rundir.EventEnd}); err != nil {
		return nil, err
	}
	if len(found) == 0 {
		return nil, nil
	}
	slices.SortStableFunc(found, func(a, b crossing) int { return a.at.Compare(b.at) })
	return &found[0], nil
}

func hasSignal(cs []crossing, s string) bool {
	return slices.ContainsFunc(cs, func(c crossing) bool { return c.signal == s })
}

// P99 is the nearest-rank 99th percentile.
func P99(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	i := (99*len(s)+99)/100 - 1
	return s[min(max(i, 0), len(s)-1)]
}

func (r *densityRun) allReady(names []string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range names {
		if _, ok := r.ready[w]; !ok {
			return false
		}
	}
	return true
}

// killedSandbox reports whether a sandbox died of SIGKILL (the OOM killer's signal) on its own;
// a sandbox that exited otherwise is an error the hold reports.
func (r *densityRun) killedSandbox() bool {
	for _, p := range r.procs {
		select {
		case <-p.Done():
			if killedBySIGKILL(p.Err()) {
				return true
			}
		default:
		}
	}
	return false
}

func killedBySIGKILL(err error) bool {
	var ee interface{ Sys() any }
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok {
			return ws.Signaled() && ws.Signal() == syscall.SIGKILL
		}
	}
	return false
}

// hold waits d, checking the criteria and showing progress, returning early when done says so;
// it fails when ctx is cancelled or a sandbox exited other than by an OOM kill.
func (r *densityRun) hold(ctx context.Context, step string, start time.Time, d time.Duration, check func(time.Time), done func() bool) error {
	return r.wait(ctx, step, d, func(now time.Time) (bool, error) {
		for _, p := range r.procs {
			select {
			case <-p.Done():
				if !killedBySIGKILL(p.Err()) {
					return false, fmt.Errorf("sandbox %s exited: %v (see %s)", p.Name, p.Err(), r.logPath(p.Name))
				}
			default:
			}
		}
		check(now)
		r.showProgress(step, start)
		return done(), nil
	})
}

func (r *densityRun) showProgress(step string, start time.Time) {
	r.mu.Lock()
	line := fmt.Sprintf("%-10s %5s | %d sandboxes, %d ready | worst tick lateness %s", step,
		time.Since(start).Round(time.Second), len(r.launched), len(r.ready), fmtSecs(r.worstTick))
	r.mu.Unlock()
	r.progress.Update(line)
}

// launch starts sandbox-<i> in its cgroup below the run's.
func (r *densityRun) launch(i int) (string, error) {
	cfg := r.cfg
	name := rundir.SandboxName(i)
	w := rundir.Workload{Name: name, Kind: rundir.KindSandbox, Cgroup: RunCgroup(r.id) + "/" + name, Memory: quantity.FormatSize(cfg.LimitBytes),
		Target: r.binary}
	lim := r.place(&w, cgroup.Limits{MemoryBytes: cfg.LimitBytes})
	if err := r.layout.Create(w.Cgroup, lim); err != nil {
		return "", fmt.Errorf("creating cgroup of %s: %w", name, err)
	}
	logf, err := r.openLog(name)
	if err != nil {
		return "", err
	}
	var launched time.Time
	onMeasure := func(name string, m workload.Measurement) {
		at := time.Now()
		v := m.Value
		recs := []rundir.Record{{Type: rundir.TypeSample, Time: m.T, Metric: m.Metric, Cgroup: w.Cgroup, Workload: name, Value: &v}}
		r.mu.Lock()
		switch m.Metric {
		case rundir.MetricSandboxReady:
			r.ready[name] = at
			ready := at.Sub(launched).Seconds()
			recs = append(recs, rundir.Record{Type: rundir.TypeSample, Time: at, Metric: rundir.MetricSandboxReadiness, Cgroup: w.Cgroup, Workload: name, Value: &ready})
		case rundir.MetricSandboxTickLateness:
			if m.Value > r.worstTick {
				r.worstTick, r.tickAt = m.Value, m.T
			}
		}
		r.mu.Unlock()
		if err := r.writer.Append(recs...); err != nil {
			cfg.Log.Warn("recording a measurement", "workload", name, "err", err)
		}
	}
	sandbox := workload.DefaultSandboxConfig()
	sandbox.HeapBytes, sandbox.Binary = cfg.SandboxMemory, r.binary
	if cfg.HotShare > 0 {
		sandbox.HotShare = cfg.HotShare
	}
	if cfg.Activity > 0 {
		sandbox.Activity = cfg.Activity
	}
	r.mu.Lock()
	r.workloads = append(r.workloads, w)
	launched = time.Now()
	r.launched[name] = launched
	r.mu.Unlock()
	p, err := r.launcher.Start(launch.Spec{Name: name, Cgroup: w.Cgroup, Limits: lim, Args: workload.Command{Run: r.id, Config: &sandbox}.Args(), Mounts: []string{r.scratch}, Log: logf}, onMeasure)
	if err != nil {
		return "", err
	}
	r.procs = append(r.procs, p)
	if err := r.writer.UpdateMeta(func(m *rundir.Meta) { m.Workloads = slices.Clone(r.workloads) }); err != nil {
		return "", err
	}
	v := float64(len(r.procs))
	return name, r.writer.Append(rundir.Record{Type: rundir.TypeSample, Time: launched, Metric: rundir.MetricDensitySandboxes, Value: &v})
}

// undo restores the host settings the run changed, after the cgroups are gone: swapoff must
// bring back only what is still alive, which is nothing.
func (r *densityRun) undo() []error {
	if _, err := rollbackHost(r.cfg.Paths, r.id, r.cfg.Log); err != nil {
		r.unclaim = nil // the run's state keeps what is left to restore, for stress clean
		return []error{err}
	}
	return nil
}
