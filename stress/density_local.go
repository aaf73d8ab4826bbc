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

	"golang.org/x/sys/unix"

	"github.com/nodectl/nodectl/host/blockdev"
	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/host/swapfile"
	"github.com/nodectl/nodectl/internal/badvalue"
	"github.com/nodectl/nodectl/internal/quantity"
	"github.com/nodectl/nodectl/record/collect"
	"github.com/nodectl/nodectl/record/sample"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/stress/launch"
	"github.com/nodectl/nodectl/stress/workload"
	"github.com/nodectl/nodectl/tuner"
	"github.com/nodectl/nodectl/tuner/swap"
	"github.com/nodectl/nodectl/tuner/sysctl"
)

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

// localSweeper fills an emulated node on this host: the run's cgroup, limited to the node's
// memory, with its swap and sysctls set for the run, each sandbox a process, runc or runsc
// sandbox in a cgroup below it mapping one shared binary in the scratch directory.
type localSweeper struct {
	runHost
	cfg      DensityConfig
	binary   string
	swapSize int64 // of the run's swap file or device, 0 without

	mu        sync.Mutex // guards what measurements and the collector read
	workloads []rundir.Workload
	ready     map[string]time.Duration // sandbox -> launch to its ready line
	worstTick float64                  // worst tick lateness since the step began
	tickAt    time.Time                // when it was recorded

	oom0      int64   // OOM kills in the node when the step began
	full0     float64 // the node's memory PSI full total when the step settled, seconds
	settledAt time.Time
	psiOK     bool
}

func (r *localSweeper) ID() string { return r.id }

func (r *localSweeper) CPUs() int { return runtime.NumCPU() }

// Place changes the host for the run (swap, sysctls), makes the run's cgroup as the emulated
// node (planned is the node: its cgroup, its swap file and the device under it), writes the
// sandboxes' shared binary, and starts the recording of the node and its sandboxes.
func (r *localSweeper) Place(ctx context.Context, planned []Planned) ([]Planned, error) {
	cfg := r.cfg
	r.ready = map[string]time.Duration{}
	if err := r.changeHost(ctx); err != nil {
		return nil, err
	}
	// Without --swap an emulated node is kept from swapping. On v1 a memcg has its own
	// swappiness, copied from its parent when it is made: set the run's so the sandboxes'
	// cgroups inherit it.
	lim := cgroup.Limits{MemoryBytes: cfg.NodeMemory, NoSwap: cfg.SwapFile == "" && cfg.NodeMemory > 0}
	if cfg.Swappiness >= 0 {
		lim.Swappiness = &cfg.Swappiness
	}
	if err := r.createRunCgroup(lim); err != nil {
		return nil, err
	}
	r.binary = filepath.Join(r.scratch, "binary")
	if err := writeBinary(r.binary, cfg.BinaryBytes); err != nil {
		return nil, err
	}
	if err := r.newLauncher(); err != nil {
		return nil, err
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
	for i := range planned {
		w := &planned[i]
		if w.Kind != rundir.KindNode {
			return nil, fmt.Errorf("%s: a sweep places its node, and adds its sandboxes", w.Name)
		}
		w.Cgroup, w.Memory, w.Target, w.Device = RunCgroup(r.id), quantity.FormatSize(cfg.NodeMemory), cfg.SwapFile, swapDev
		r.workloads = append(r.workloads, w.Workload)
	}
	err := r.startRecording(cfg.RunOptions, r.workloads, recordingSpec{cgroups: r.cgroupPaths,
		// The node's memory and pressure are rated per step: read in full at every sample.
		priority: func(p string) bool { return p == RunCgroup(r.id) },
		devices:  func() []string { return devices },
		sources:  map[string]collect.Source{"emulated-node": collect.SourceFunc(r.sampleNode)}})
	return planned, err
}

// Describe gives the emulated node's memory, the run's swap and sysctls, and the binary's size.
func (r *localSweeper) Describe(c *rundir.DensityConfig) {
	c.BinaryBytes, c.NodeMemoryBytes, c.SwapBytes = r.cfg.BinaryBytes, r.cfg.NodeMemory, r.swapSize
	c.Swappiness, c.WatermarkScaleFactor = r.cfg.Swappiness, r.cfg.WatermarkScaleFactor
}

// Note appends the sweep's records to the run.
func (r *localSweeper) Note(recs ...rundir.Record) error { return r.writer.Append(recs...) }

// Mark snapshots every source and records the step's edge; a step's OOM kills and worst tick
// count from its start.
func (r *localSweeper) Mark(phase, event string) error {
	if event == rundir.EventStart {
		r.mu.Lock()
		r.worstTick, r.tickAt = 0, time.Time{}
		r.mu.Unlock()
		r.oom0 = r.oomKills()
	}
	return r.mark(phase, event)
}

// Settled snapshots every source at the hold, so the step's pressure window has exact counters
// at its start, and reads the node's memory pressure then.
func (r *localSweeper) Settled(step string) error {
	now := time.Now()
	if err := r.session.Snapshot(now); err != nil {
		return err
	}
	r.settledAt = now
	r.full0, r.psiOK = r.memoryFullTotal()
	return r.writer.Append(rundir.HoldRecord(now, step))
}

// MemoryFullShare is the run cgroup's memory PSI full since the step settled.
func (r *localSweeper) MemoryFullShare(_ context.Context, to time.Time) (float64, bool, error) {
	full1, ok := r.memoryFullTotal()
	if !ok || !r.psiOK {
		return 0, false, nil
	}
	return (full1 - r.full0) / max(to.Sub(r.settledAt).Seconds(), 1e-9), true, nil
}

// Finish has nothing left to do: each sandbox was written into meta.json as it was added.
func (r *localSweeper) Finish(context.Context) error { return nil }

// Watch reads the sandboxes' ready lines and ticks, which their measurements brought, the
// OOM kills in the node since the step began, and the sandboxes killed by SIGKILL (the OOM
// killer's signal); a sandbox that exited otherwise is an error naming its log.
func (r *localSweeper) Watch(_ context.Context, _ bool) (SweepState, error) {
	now := time.Now()
	st := SweepState{Ended: map[string]string{}}
	for _, p := range r.procs {
		select {
		case <-p.Done():
			if !killedBySIGKILL(p.Err()) {
				return st, fmt.Errorf("sandbox %s exited: %v (see %s)", p.Name, p.Err(), r.logPath(p.Name))
			}
			st.Ended[p.Name] = "killed by SIGKILL, the OOM killer's signal"
		default:
		}
	}
	// The kernel's count first: it says how many; a SIGKILL says one at least.
	if k := r.oomKills(); r.oom0 >= 0 && k > r.oom0 {
		st.Crossings = append(st.Crossings, Crossing{rundir.SignalOOMKill, float64(k - r.oom0), 0, now})
	}
	if len(st.Ended) > 0 {
		st.Crossings = append(st.Crossings, Crossing{rundir.SignalOOMKill, 1, 0, now})
	}
	r.mu.Lock()
	st.Ready, st.WorstTick, st.TickAt = maps.Clone(r.ready), r.worstTick, r.tickAt
	r.mu.Unlock()
	return st, nil
}

// Add starts the sandbox in its cgroup below the run's, mapping the run's shared binary.
func (r *localSweeper) Add(_ context.Context, w Planned) (time.Time, error) {
	w.Cgroup, w.Target = RunCgroup(r.id)+"/"+w.Name, r.binary
	lim := r.place(&w.Workload, w.Limits)
	if err := r.layout.Create(w.Cgroup, lim); err != nil {
		return time.Time{}, fmt.Errorf("creating cgroup of %s: %w", w.Name, err)
	}
	logf, err := r.openLog(w.Name)
	if err != nil {
		return time.Time{}, err
	}
	body, ok := w.Config.(*workload.SandboxConfig)
	if !ok {
		return time.Time{}, fmt.Errorf("%s: not a sandbox", w.Name)
	}
	sandbox := *body
	sandbox.Binary = r.binary
	var launched time.Time
	onMeasure := func(name string, m workload.Measurement) {
		at := time.Now()
		v := m.Value
		recs := []rundir.Record{{Type: rundir.TypeSample, Time: m.T, Metric: m.Metric, Cgroup: w.Cgroup, Workload: name, Value: &v}}
		r.mu.Lock()
		switch m.Metric {
		case rundir.MetricSandboxReady:
			r.ready[name] = at.Sub(launched)
			ready := at.Sub(launched).Seconds()
			recs = append(recs, rundir.Record{Type: rundir.TypeSample, Time: at, Metric: rundir.MetricSandboxReadiness, Cgroup: w.Cgroup, Workload: name, Value: &ready})
		case rundir.MetricSandboxTickLateness:
			if m.Value > r.worstTick {
				r.worstTick, r.tickAt = m.Value, m.T
			}
		}
		r.mu.Unlock()
		if err := r.writer.Append(recs...); err != nil {
			r.opts.Log.Warn("recording a measurement", "workload", name, "err", err)
		}
	}
	r.mu.Lock()
	r.workloads = append(r.workloads, w.Workload)
	launched = time.Now()
	r.mu.Unlock()
	p, err := r.launcher.Start(launch.Spec{Name: w.Name, Cgroup: w.Cgroup, Limits: lim, Args: workload.Command{Run: r.id, Config: &sandbox}.Args(),
		Mounts: []string{r.scratch}, Log: logf}, onMeasure)
	if err != nil {
		return time.Time{}, err
	}
	r.procs = append(r.procs, p)
	return launched, r.writer.UpdateMeta(func(m *rundir.Meta) { m.Workloads = slices.Clone(r.workloads) })
}

// changeHost turns the run's swap on and sets its sysctls through the tuner's engine, which
// records each setting's earlier value in the run's state before it changes it.
func (r *localSweeper) changeHost(ctx context.Context) error {
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

func (r *localSweeper) cgroupPaths() []string {
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
func (r *localSweeper) sampleNode(now time.Time) ([]rundir.Record, error) {
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
func (r *localSweeper) memoryFullTotal() (float64, bool) {
	p, err := sample.CgroupPressure(r.layout, RunCgroup(r.id), rundir.ResourceMemory)
	return p.Full.Seconds(), err == nil
}

// oomKills counts the OOM kills in the node's cgroup and below, -1 when the kernel does not say.
// v2 memory.events counts a cgroup's descendants; v1 memory.oom_control counts only the
// cgroup's own tasks, so there every sandbox's is added.
func (r *localSweeper) oomKills() int64 {
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

func killedBySIGKILL(err error) bool {
	var ee interface{ Sys() any }
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok {
			return ws.Signaled() && ws.Signal() == syscall.SIGKILL
		}
	}
	return false
}

// undo restores the host settings the run changed, after the cgroups are gone: swapoff must
// bring back only what is still alive, which is nothing.
func (r *localSweeper) undo() []error {
	if _, err := rollbackHost(r.cfg.Paths, r.id, r.cfg.Log); err != nil {
		r.unclaim = nil // the run's state keeps what is left to restore, for stress clean
		return []error{err}
	}
	return nil
}
