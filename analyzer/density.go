package analyzer

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nodectl/nodectl/internal/human"
	"github.com/nodectl/nodectl/rundir"
)

// IDMemoryCollapse: a density sweep reached a density its node could not hold.
const IDMemoryCollapse = "memory-collapse"

// A density run (`nodectl stress density`) adds sandboxes in steps; each step is a phase named
// step-<density>. Its first event (density-config) holds the sweep's configuration; a collapse
// event names the step and the criterion the driver saw crossed first.
const (
	pageBytes = 4096
	// unlimitedBytes: a memory limit this large is none (v1 reads "no limit" as about 2^63).
	unlimitedBytes = 1 << 60
)

// Ceiling resources: what bounded the density.
const (
	CeilingMemory = "memory-working-set"
	CeilingSwap   = "swap-exhausted"
	CeilingSwapIO = "swap-device-io"
	CeilingCPU    = "cpu" //rundir:other: a findings value
	// Of a run of pods on a Kubernetes node: the kubelet's bookings, or its heartbeat.
	CeilingAdmission = "kubelet-admission"
	CeilingHeartbeat = "node-heartbeat"
	// A disk saturated by what memory pressure or logging made it do: evicted file pages
	// (binaries) read back from it, or journald's writes.
	CeilingDiskRefaults = "boot-disk-refaults"
	CeilingJournald     = "journald-flood"
	ceilingSwapUse      = 0.90 // swap used over its size: exhausted
	ceilingIOBusy       = 0.80 // a device's busy share: saturated
	// ceilingRefaultShare: the file refaults' pages are at least this share of the bytes read
	// from the disk, for the disk's load to be theirs.
	ceilingRefaultShare = 0.25
	// ceilingRefaultsMin: file refaults a second below which the page cache held what ran.
	ceilingRefaultsMin = 100.0
	// ceilingJournaldShare: journald wrote at least this share of the disk's writes.
	ceilingJournaldShare = 0.5
	ceilingCPUBusy       = 0.90 // CPU used over the CPUs: saturated
	// ceilingMemoryFull: a working set this share of the node's memory is full; CPU use then
	// comes from reclaim and refaults and is not the ceiling.
	ceilingMemoryFull = 0.90
)

// DensityStep is one step of a density sweep: the density it held and what the node showed.
// Shares are of the step's wall time; rates are per second of it; bytes are the step's maximum.
type DensityStep struct {
	Density         int     `json:"density"`
	Phase           string  `json:"phase"`
	Seconds         float64 `json:"seconds"`
	Started         int     `json:"started"` // sandboxes launched in the step
	Ready           int     `json:"ready"`   // readiness lines that arrived in the step
	ReadinessP50    float64 `json:"readiness_p50_seconds"`
	ReadinessP99    float64 `json:"readiness_p99_seconds"`
	TickLatenessP99 float64 `json:"tick_lateness_p99_seconds"`
	TickLatenessMax float64 `json:"tick_lateness_max_seconds"`
	ActivityP99     float64 `json:"activity_p99_seconds"` // a burst's duration
	// Memory PSI of the run's cgroup (the node) and of the whole machine, as shares of the
	// step's settled hold: from its hold event to its end.
	PSIMemorySome   float64 `json:"psi_memory_some_share"`
	PSIMemoryFull   float64 `json:"psi_memory_full_share"`
	HostPSIMemFull  float64 `json:"host_psi_memory_full_share"`
	WorkingSet      float64 `json:"working_set_bytes"`
	MemoryUsage     float64 `json:"memory_usage_bytes"`
	MemoryLimit     float64 `json:"memory_limit_bytes"` // the node cgroup's limit as read
	Anon            float64 `json:"anon_bytes"`
	File            float64 `json:"file_bytes"`
	SwapUsed        float64 `json:"swap_used_bytes"`           // by the node's cgroup
	SwapFileUsed    float64 `json:"swap_file_used_bytes"`      // of the run's swap file, by anyone: a swap area is the host's
	SwapSize        float64 `json:"swap_size_bytes,omitempty"` // the run's swap file's; of a sweep of pods, the node's swap
	SwapIn          float64 `json:"swap_in_bytes_per_second"`  // host-wide pswpin
	SwapOut         float64 `json:"swap_out_bytes_per_second"` // host-wide pswpout
	RefaultsFile    float64 `json:"refaults_file_per_second"`  // the node's cgroup, else host-wide
	RefaultsAnon    float64 `json:"refaults_anon_per_second"`
	MajorFaults     float64 `json:"major_faults_per_second"`
	ReclaimStall    float64 `json:"reclaim_stall_seconds"`     // time the sandboxes' tasks spent in reclaim (--trace)
	ReclaimStallP99 float64 `json:"reclaim_stall_p99_seconds"` // one reclaim's p99
	// CompactionStall is the time the sandboxes' tasks spent in direct compaction (--trace):
	// fragmentation, not a lack of memory, holding up allocations.
	CompactionStall float64 `json:"compaction_stall_seconds"`
	// SwapIOP99 is the p99 of the swap device's request latency (queue and service, all
	// cgroups, from the block tracer with --trace): how slow swapping in and out was.
	SwapIOP99      float64 `json:"swap_io_p99_seconds"`
	OOMKills       float64 `json:"oom_kills"`
	CPUCores       float64 `json:"cpu_cores"`              // used by the run's cgroup
	SwapDeviceBusy float64 `json:"swap_device_busy_share"` // the device under the swap file
	// The disk that served the most reads in the step (where evicted binaries are read back
	// from), its busy share and bytes read a second; the disk journald wrote the most to, its
	// busy share and journald's share of its writes (diskstats; the block tracer's bytes by
	// cgroup). Empty or zero when not recorded.
	ReadDisk           string  `json:"read_disk,omitempty"`
	ReadDiskBusy       float64 `json:"read_disk_busy_share,omitempty"`
	ReadDiskBytes      float64 `json:"read_disk_bytes_per_second,omitempty"`
	JournaldDisk       string  `json:"journald_disk,omitempty"`
	JournaldDiskBusy   float64 `json:"journald_disk_busy_share,omitempty"`
	JournaldWriteShare float64 `json:"journald_write_share,omitempty"`
	// The swap limits of the cgroups below the node that have one (a sweep of pods under
	// LimitedSwap: each container's share of the node's swap): their sum, the largest, how
	// many there are and how many were at their limit. Zero when none has a limit.
	SwapLimits   float64 `json:"swap_limits_total_bytes,omitempty"`
	SwapLimitMax float64 `json:"swap_limit_max_bytes,omitempty"`
	SwapLimited  int     `json:"swap_limited_cgroups,omitempty"`
	AtSwapLimit  int     `json:"at_swap_limit_cgroups,omitempty"`
	// Of a run of pods on a Kubernetes node (stress density --node): pods the kubelet refused
	// at admission (with the first one's reason and message) or evicted in the step, the worst
	// renewal of the node's Lease past its renew interval, and whether the Node left Ready.
	Refused       int      `json:"refused,omitempty"`
	RefusedReason string   `json:"refused_reason,omitempty"`
	Evicted       int      `json:"evicted,omitempty"`
	LeaseLateMax  float64  `json:"lease_late_max_seconds,omitempty"`
	NodeNotReady  bool     `json:"node_not_ready,omitempty"`
	Signals       []string `json:"signals,omitempty"` // collapse criteria this step crossed
}

// DensityCollapse is the step that collapsed and the criterion crossed first there.
type DensityCollapse struct {
	Density int     `json:"density"`
	Signal  string  `json:"signal"`
	Value   float64 `json:"value"`
	Bound   float64 `json:"bound"`
}

// DensityCeiling says which resource bounded the density, with its numbers at the collapse.
type DensityCeiling struct {
	Resource    string  `json:"resource"` // memory-working-set, swap-exhausted, swap-device-io, cpu
	WorkingSet  float64 `json:"working_set_bytes"`
	NodeMemory  float64 `json:"node_memory_bytes"`
	SwapUsed    float64 `json:"swap_used_bytes"` // of the swap file (or by the node, if more)
	SwapSize    float64 `json:"swap_size_bytes"`
	SwapBusy    float64 `json:"swap_device_busy_share"`
	Disk        string  `json:"disk,omitempty"`            // boot-disk-refaults, journald-flood: the saturated disk
	DiskBusy    float64 `json:"disk_busy_share,omitempty"` // its busy share
	CPUCores    float64 `json:"cpu_cores"`
	CPUs        float64 `json:"cpus"`
	PerSandbox  float64 `json:"working_set_per_sandbox_bytes"`
	ByRequest   int     `json:"admitted_by_request"` // sandboxes a scheduler admits by their memory request
	Explanation string  `json:"explanation"`
}

// DensityReport tabulates a density sweep: its steps, the highest stable density, the
// collapse and the ceiling.
type DensityReport struct {
	Steps     []DensityStep    `json:"steps"`
	MaxStable int              `json:"max_stable"`
	Collapse  *DensityCollapse `json:"collapse"`
	Ceiling   *DensityCeiling  `json:"ceiling,omitempty"`
}

// densityEvents reads the sweep's configuration, its collapse (nil when none) and each step's
// hold start.
func (a *analysis) densityEvents() (rundir.DensityConfig, *rundir.Record, map[string]time.Time) {
	var cfg rundir.DensityConfig
	holds := map[string]time.Time{}
	var collapse *rundir.Record
	for i, rec := range a.run.Records {
		if rec.Type != rundir.TypeEvent {
			continue
		}
		switch rec.Name {
		case rundir.EventDensityConfig:
			cfg = rundir.ParseDensityConfig(rec.Labels)
		case rundir.EventCollapse:
			if collapse == nil {
				collapse = &a.run.Records[i]
			}
		case rundir.EventHold:
			holds[rundir.HoldPhase(rec)] = rec.Time
		}
	}
	return cfg, collapse, holds
}

func (a *analysis) densityTable() *DensityReport {
	cfg, ev, holds := a.densityEvents()
	if cfg.Node != "" && cfg.SwapBytes == 0 {
		// A node's swap is its own, as /proc/meminfo gives it.
		if vs := a.run.Series(rundir.MetricMeminfo).Label(rundir.LabelName, "SwapTotal").Values(a.run.Span()); len(vs) > 0 {
			cfg.SwapBytes = int64(slices.Max(vs))
		}
	}
	// A run of pods on a node reads its steps' events (pods ended, Lease renewals, Ready): the
	// run's events, gathered once rather than every record read again for each step.
	var events []rundir.Record
	if cfg.Node != "" {
		for _, rec := range a.run.Records {
			if rec.Type == rundir.TypeEvent {
				events = append(events, rec)
			}
		}
	}
	dr := &DensityReport{Steps: []DensityStep{}}
	for _, w := range a.windows {
		n, ok := rundir.StepDensity(w.Name)
		if !ok {
			continue
		}
		dr.Steps = append(dr.Steps, a.densityStep(n, w, cfg, holds, events))
	}
	if ev != nil {
		c := rundir.ParseCollapse(*ev)
		dr.Collapse = &DensityCollapse{Density: c.Density, Signal: c.Signal, Value: c.Value, Bound: c.Bound}
	}
	for _, s := range dr.Steps {
		if dr.Collapse != nil && s.Density >= dr.Collapse.Density {
			break
		}
		dr.MaxStable = s.Density
	}
	if dr.Collapse != nil {
		for _, s := range dr.Steps {
			if s.Density == dr.Collapse.Density {
				dr.Ceiling = ceiling(s, cfg)
			}
		}
	}
	return dr
}

func (a *analysis) densityStep(n int, w rundir.Window, cfg rundir.DensityConfig, holds map[string]time.Time, events []rundir.Record) DensityStep {
	run := a.run
	cg := a.nodeCgroup()
	s := DensityStep{Density: n, Phase: w.Name, Seconds: w.Seconds()}
	sec := max(w.Seconds(), 1e-9)
	// Sandboxes launched: the count at the step's end less the count at its start.
	counts := run.Series(rundir.MetricDensitySandboxes)
	for _, ss := range counts {
		s.Started = int(ss.Delta(w))
	}
	ready := run.Series(rundir.MetricSandboxReadiness).Values(w)
	s.Ready = len(ready)
	s.ReadinessP50, s.ReadinessP99 = quantile(ready, 0.5), quantile(ready, 0.99)
	late := run.Series(rundir.MetricSandboxTickLateness).Values(w)
	s.TickLatenessP99 = quantile(late, 0.99)
	if len(late) > 0 {
		s.TickLatenessMax = slices.Max(late)
	}
	s.ActivityP99 = quantile(run.Series(rundir.MetricSandboxActivity).Values(w), 0.99)
	// Pressure over the settled hold: from the step's hold event (its sandboxes were up and had
	// settled; the driver snapshots then) to its end; start-up reclaim is not a collapse.
	hold := w
	if t, ok := holds[w.Name]; ok {
		hold.Start = t
	}
	hsec := max(hold.Seconds(), 1e-9)
	psi := run.Series(rundir.MetricCgroupPressure).Cgroup(cg).Label(rundir.LabelResource, rundir.ResourceMemory)
	hostPSI := run.Series(rundir.MetricSystemPressure).Label(rundir.LabelResource, rundir.ResourceMemory)
	if cfg.Node != "" && len(psi) == 0 {
		// A real node's pressure is the host's (cgroup v1 has none per cgroup).
		psi = hostPSI
	}
	s.PSIMemorySome = psi.Label(rundir.LabelKind, rundir.PressureSome).Delta(hold) / hsec
	s.PSIMemoryFull = psi.Label(rundir.LabelKind, rundir.PressureFull).Delta(hold) / hsec
	s.HostPSIMemFull = hostPSI.Label(rundir.LabelKind, rundir.PressureFull).Delta(hold) / hsec
	mem := run.Series(rundir.MetricDensityMemory).Cgroup(cg)
	maxOf := func(ss rundir.SeriesSet) float64 {
		if vs := ss.Values(w); len(vs) > 0 {
			return slices.Max(vs)
		}
		return 0
	}
	s.WorkingSet = maxOf(mem.Label(rundir.LabelName, rundir.NodeMemoryWorkingSet))
	s.MemoryUsage = maxOf(mem.Label(rundir.LabelName, rundir.NodeMemoryUsage))
	s.MemoryLimit = maxOf(mem.Label(rundir.LabelName, rundir.NodeMemoryLimit))
	if s.MemoryLimit <= 0 || s.MemoryLimit >= unlimitedBytes {
		// No node limit: the node is the host.
		s.MemoryLimit = maxOf(run.Series(rundir.MetricMeminfo).Label(rundir.LabelName, "MemTotal"))
	}
	s.Anon = maxOf(mem.Label(rundir.LabelName, rundir.NodeMemoryAnon))
	s.File = maxOf(mem.Label(rundir.LabelName, rundir.NodeMemoryFile))
	s.SwapUsed = maxOf(mem.Label(rundir.LabelName, rundir.NodeMemorySwap))
	s.SwapFileUsed = maxOf(run.Series(rundir.MetricDensitySwap).Label(rundir.LabelName, rundir.SwapFileUsed))
	s.SwapSize = float64(cfg.SwapBytes) // a sweep of pods: the node's (kubeStep)
	vm := run.Series(rundir.MetricVmstat)
	rate := func(name string) float64 { return vm.Label(rundir.LabelName, name).Delta(w) / sec }
	// Swap traffic of the node's cgroup where the kernel counts it (v2, 6.12+), else the host's.
	if sp := run.Series(rundir.MetricMemorySwapPages).Cgroup(cg); len(sp) > 0 {
		s.SwapIn = sp.Label(rundir.LabelOp, rundir.SwapIn).Delta(w) / sec * pageBytes
		s.SwapOut = sp.Label(rundir.LabelOp, rundir.SwapOut).Delta(w) / sec * pageBytes
	} else {
		s.SwapIn, s.SwapOut = rate("pswpin")*pageBytes, rate("pswpout")*pageBytes
	}
	// Refaults and major faults of the node's cgroup where the sampler read them (its
	// memory.stat counts its sandboxes too), else the host's.
	if ref := run.Series(rundir.MetricMemoryRefaults).Cgroup(cg); len(ref) > 0 {
		s.RefaultsFile = ref.Label(rundir.LabelKind, rundir.RefaultFile).Delta(w) / sec
		s.RefaultsAnon = ref.Label(rundir.LabelKind, rundir.RefaultAnon).Delta(w) / sec
	} else {
		s.RefaultsFile, s.RefaultsAnon = rate("workingset_refault_file"), rate("workingset_refault_anon")
	}
	if mf := run.Series(rundir.MetricMemoryMajorFaults).Cgroup(cg); len(mf) > 0 {
		s.MajorFaults = mf.Delta(w) / sec
	} else {
		s.MajorFaults = rate("pgmajfault")
	}
	// Reclaim stalls of the sandboxes' tasks (the reclaim tracer, with --trace).
	var stalls rundir.SeriesSet
	for _, ss := range run.Series(rundir.MetricReclaimStall) {
		if cg != "" && within(ss.Cgroup, cg) {
			stalls = append(stalls, ss)
		}
	}
	st := stalls.HistDelta(w)
	s.ReclaimStall, s.ReclaimStallP99 = secs(st.SumNs), st.Quantile(0.99)
	var compaction rundir.SeriesSet
	for _, ss := range run.Series(rundir.MetricCompactionStall) {
		if cg != "" && within(ss.Cgroup, cg) {
			compaction = append(compaction, ss)
		}
	}
	s.CompactionStall = secs(compaction.HistDelta(w).SumNs)
	s.OOMKills = run.Series(rundir.MetricDensityOOMKills).Cgroup(cg).Delta(w)
	if cfg.Node != "" {
		a.kubeStep(&s, w, events)
	}
	s.CPUCores = run.Series(rundir.MetricCPUUsage).Cgroup(cg).Delta(w) / sec
	if dev := a.swapDevice(); dev != "" && s.SwapSize > 0 {
		s.SwapDeviceBusy = run.Series(rundir.MetricDiskIOTime).Label(rundir.LabelDevice, dev).Delta(w) / sec
		// A request's latency is its queue time plus its service time; the two p99s added
		// stand for the requests' p99 (the tracer keeps the two apart).
		q := run.Series(rundir.MetricBlkQueue).Label(rundir.LabelDevice, dev).HistDelta(w)
		sv := run.Series(rundir.MetricBlkService).Label(rundir.LabelDevice, dev).HistDelta(w)
		s.SwapIOP99 = q.Quantile(0.99) + sv.Quantile(0.99)
	}
	a.disks(&s, w)
	a.swapLimitsUnder(&s, cg, w)
	s.Signals = crossed(s, cfg)
	return s
}

// crossed lists the collapse criteria a step's numbers cross, by the bounds the run used.
func crossed(s DensityStep, cfg rundir.DensityConfig) []string {
	var out []string
	// A pod the kubelet refused or evicted is no readiness to wait for: it has its own signal.
	if b := cfg.CriterionReadinessP99; b > 0 && (s.ReadinessP99 > b || s.Ready < s.Started-s.Refused-s.Evicted) {
		out = append(out, rundir.SignalReadiness)
	}
	if b := cfg.CriterionPSIFullShare; b > 0 && s.PSIMemoryFull > b {
		out = append(out, rundir.SignalPSIFull)
	}
	if cfg.CriterionOOMKill && s.OOMKills > 0 {
		out = append(out, rundir.SignalOOMKill)
	}
	if b := cfg.CriterionTickGap; b > 0 && s.TickLatenessMax > b {
		out = append(out, rundir.SignalTickGap)
	}
	if s.Refused > 0 {
		out = append(out, rundir.SignalAdmission)
	}
	if s.Evicted > 0 {
		out = append(out, rundir.SignalEvicted)
	}
	if b := cfg.CriterionLeaseLate; b > 0 && s.LeaseLateMax > b {
		out = append(out, rundir.SignalLeaseLate)
	}
	if s.NodeNotReady {
		out = append(out, rundir.SignalNotReady)
	}
	return out
}

// kubeStep reads what a Kubernetes node showed in a step of a run of pods: the node's memory
// from /proc/meminfo (the node is the host; its working set is what is not available), the
// pods that ended (refused, evicted, OOM-killed), the node Lease's renewals and its Ready
// transitions, as the agent recorded them.
func (a *analysis) kubeStep(s *DensityStep, w rundir.Window, events []rundir.Record) {
	run := a.run
	mi := run.Series(rundir.MetricMeminfo)
	extreme := func(name string, pick func([]float64) float64) (float64, bool) {
		vs := mi.Label(rundir.LabelName, name).Values(w)
		if len(vs) == 0 {
			// A gauge is written when it changes: its value in w is the last one before.
			vs = mi.Label(rundir.LabelName, name).Values(rundir.Window{Start: run.Span().Start, End: w.End})
			if len(vs) == 0 {
				return 0, false
			}
			return vs[len(vs)-1], true
		}
		return pick(vs), true
	}
	total, ok1 := extreme("MemTotal", slices.Max[[]float64])
	avail, ok2 := extreme("MemAvailable", slices.Min[[]float64])
	if ok1 && ok2 && s.WorkingSet == 0 {
		s.MemoryLimit, s.WorkingSet, s.MemoryUsage = total, total-avail, total-avail
	}
	swapTotal, ok1 := extreme("SwapTotal", slices.Max[[]float64])
	swapFree, ok2 := extreme("SwapFree", slices.Min[[]float64])
	if ok1 && ok2 && s.SwapUsed == 0 {
		s.SwapUsed = swapTotal - swapFree
	}
	if ok1 && s.SwapSize == 0 {
		s.SwapSize = swapTotal // the node's swap is the tuner's, not the run's
	}
	for _, rec := range events {
		if rec.Time.Before(w.Start) || rec.Time.After(w.End) {
			continue
		}
		if p, ok := rundir.ParsePodEnded(rec); ok {
			switch p.End {
			case rundir.PodEndRefused:
				if s.Refused++; s.RefusedReason == "" {
					s.RefusedReason = p.Reason + ": " + rec.Message
				}
			case rundir.PodEndEvicted:
				s.Evicted++
			case rundir.PodEndOOM:
				s.OOMKills++
			}
		}
		if l, ok := rundir.ParseLeaseRenewal(rec); ok && !l.Resync && l.Gap > 0 && l.LeaseDuration > 0 {
			s.LeaseLateMax = max(s.LeaseLateMax, (l.Gap - l.LeaseDuration/4).Seconds())
		}
		if n, ok := rundir.ParseNodeReady(rec); ok && n.Status != "True" {
			s.NodeNotReady = true
		}
	}
}

// disks fills in s the disk that served the most reads in w and the one journald wrote the most
// to, with how busy each was (diskstats), and journald's share of that disk's writes (the
// block tracer's bytes by cgroup).
func (a *analysis) disks(s *DensityStep, w rundir.Window) {
	sec := max(w.Seconds(), 1e-9)
	busy := func(dev string) float64 {
		return a.run.Series(rundir.MetricDiskIOTime).Label(rundir.LabelDevice, dev).Delta(w) / sec
	}
	reads := a.run.Series(rundir.MetricDiskBytes).Label(rundir.LabelOp, rundir.OpRead)
	if dev := reads.Busiest(rundir.LabelDevice, func(ss rundir.SeriesSet) float64 { return ss.Delta(w) }); dev != "" {
		s.ReadDisk, s.ReadDiskBusy, s.ReadDiskBytes = dev, busy(dev), reads.Label(rundir.LabelDevice, dev).Delta(w)/sec
	}
	journald := ""
	for _, wl := range a.run.Meta.Workloads {
		if wl.Kind == rundir.KindDaemon && strings.HasPrefix(wl.Name, "systemd-journal") {
			journald = wl.Cgroup
		}
	}
	if journald == "" {
		return
	}
	// The tracer charges each request to the cgroup that issued it, once (io.stat's counts
	// are hierarchical: summed over cgroups they would count a parent's twice).
	writes := a.run.Series(rundir.MetricBlkBytes).Label(rundir.LabelOp, rundir.OpWrite)
	mine := func(ss rundir.SeriesSet) (own, all float64) {
		for cg, set := range ss.ByCgroup() {
			v := set.Delta(w)
			all += v
			if within(cg, journald) {
				own += v
			}
		}
		return own, all
	}
	dev := writes.Busiest(rundir.LabelDevice, func(ss rundir.SeriesSet) float64 { own, _ := mine(ss); return own })
	if dev == "" {
		return
	}
	own, all := mine(writes.Label(rundir.LabelDevice, dev))
	s.JournaldDisk, s.JournaldDiskBusy, s.JournaldWriteShare = dev, busy(dev), ratio(own, all)
}

// swapLimitsUnder fills in s the swap limits of the cgroups at or below root ("" for all) in w:
// the deepest cgroup with a limit speaks for its subtree (a v1 child's hierarchical limit is its
// parent's too), and one is at its limit when its swap reached swapLimitFullShare of it.
func (a *analysis) swapLimitsUnder(s *DensityStep, root string, w rundir.Window) {
	limits := a.run.Series(rundir.MetricMemorySwapLimit).ByCgroup()
	if len(limits) == 0 {
		return
	}
	cgroups := slices.Collect(maps.Keys(limits))
	swaps := a.run.Series(rundir.MetricMemorySwap).ByCgroup()
	for cg, ss := range limits {
		if root != "" && !within(cg, root) || slices.ContainsFunc(cgroups, func(o string) bool { return o != cg && within(o, cg) }) {
			continue
		}
		var limit, used float64
		for _, v := range ss.Values(w) {
			limit = max(limit, v)
		}
		for _, v := range swaps[cg].Values(w) {
			used = max(used, v)
		}
		if limit <= 0 {
			continue
		}
		s.SwapLimits += limit
		s.SwapLimitMax = max(s.SwapLimitMax, limit)
		s.SwapLimited++
		if used >= swapLimitFullShare*limit {
			s.AtSwapLimit++
		}
	}
}

// nodeCgroup is the run's cgroup: the emulated node all sandboxes live in.
func (a *analysis) nodeCgroup() string {
	for _, w := range a.run.Meta.Workloads {
		if w.Name == rundir.WorkloadNode {
			return w.Cgroup
		}
	}
	return ""
}

// swapDevice is the disk serving the run's swap: the node workload's (a local sweep's swap
// file), else that of the swap area the host used most (swap_area_bytes: a sweep of pods, an
// agent window).
func (a *analysis) swapDevice() string {
	for _, w := range a.run.Meta.Workloads {
		if w.Name == rundir.WorkloadNode && w.Device != "" {
			return w.Device
		}
	}
	return a.run.Series(rundir.MetricSwapArea).Label(rundir.LabelName, rundir.SwapFileUsed).Busiest(rundir.LabelDevice,
		func(ss rundir.SeriesSet) float64 {
			if vs := ss.Values(a.run.Span()); len(vs) > 0 {
				return slices.Max(vs)
			}
			return 0
		})
}

// ceiling says which resource bounded the density at the collapse step s (docs/findings.md, in
// this order): the kubelet's admission, a disk saturated by refaults of evicted binaries or by
// journald, the node's heartbeat, the swap file full, the swap device saturated, the CPUs
// saturated, else the memory working set.
func ceiling(s DensityStep, cfg rundir.DensityConfig) *DensityCeiling {
	c := &DensityCeiling{WorkingSet: s.WorkingSet, NodeMemory: float64(cfg.NodeMemoryBytes), SwapUsed: max(s.SwapUsed, s.SwapFileUsed),
		SwapSize: s.SwapSize, SwapBusy: s.SwapDeviceBusy, CPUCores: s.CPUCores, CPUs: float64(cfg.CPUs)}
	if c.NodeMemory <= 0 {
		c.NodeMemory = s.MemoryLimit // no --node-memory: the host's memory, as the kernel reports the cgroup's
	}
	if s.Density > 0 {
		c.PerSandbox = s.WorkingSet / float64(s.Density)
	}
	if req := float64(cfg.RequestBytes); req > 0 && c.NodeMemory > 0 {
		c.ByRequest = int(c.NodeMemory / req)
	}
	switch {
	case s.Refused > 0:
		c.Resource = CeilingAdmission
		c.Explanation = fmt.Sprintf("the kubelet refused %d pod(s) at admission (%s): the node's bookings, not its kernel, bounded the density; the working set was %s of %s memory",
			s.Refused, s.RefusedReason, human.Bytes(c.WorkingSet), human.Bytes(c.NodeMemory))
	case s.RefaultsFile >= ceilingRefaultsMin && s.ReadDiskBusy >= ceilingIOBusy && s.RefaultsFile*pageBytes >= ceilingRefaultShare*s.ReadDiskBytes:
		c.Resource, c.Disk, c.DiskBusy = CeilingDiskRefaults, s.ReadDisk, s.ReadDiskBusy
		c.Explanation = fmt.Sprintf("evicted file pages (the binaries and libraries the workloads run) were read back from disk %s "+
			"at %.0f refaults a second (%s of its %s/s of reads) while it was busy %s of the time: the page cache could not hold what "+
			"they execute, and every refault waited in the disk's queue at its cap; a faster disk for the images (a local SSD for "+
			"/var/lib/containerd) or more memory would raise the density",
			s.ReadDisk, s.RefaultsFile, human.Percent(ratio(s.RefaultsFile*pageBytes, s.ReadDiskBytes)), human.Bytes(s.ReadDiskBytes), human.Percent(s.ReadDiskBusy))
	case s.JournaldWriteShare >= ceilingJournaldShare && s.JournaldDiskBusy >= ceilingIOBusy:
		c.Resource, c.Disk, c.DiskBusy = CeilingJournald, s.JournaldDisk, s.JournaldDiskBusy
		c.Explanation = fmt.Sprintf("systemd-journald wrote %s of the writes on disk %s while it was busy %s of the time: the node's logs "+
			"(every container start, probe and cgroup event) flooded the disk the kubelet and the runtime need; rate-limit journald "+
			"and cap its storage (nodectl tune's journald setting) or move the journal to a local SSD",
			human.Percent(s.JournaldWriteShare), s.JournaldDisk, human.Percent(s.JournaldDiskBusy))
	case (slices.Contains(s.Signals, rundir.SignalLeaseLate) || slices.Contains(s.Signals, rundir.SignalNotReady)) &&
		c.WorkingSet < ceilingMemoryFull*c.NodeMemory && (c.CPUs == 0 || c.CPUCores < ceilingCPUBusy*c.CPUs):
		c.Resource = CeilingHeartbeat
		notReady := ""
		if s.NodeNotReady {
			notReady = " and the Node left Ready"
		}
		c.Explanation = fmt.Sprintf("the node's heartbeat gave out first: its Lease renewed %s past its interval%s, with the working set at %s of %s memory; the lease-late finding of the run's window says why (nodectl postmortem)",
			human.Seconds(s.LeaseLateMax), notReady, human.Bytes(c.WorkingSet), human.Bytes(c.NodeMemory))
	case c.SwapSize > 0 && c.SwapUsed >= ceilingSwapUse*c.SwapSize:
		c.Resource = CeilingSwap
		c.Explanation = fmt.Sprintf("swap was exhausted: %s of the %s swap in use, with the working set at %s of %s memory; more swap (or smaller sandboxes) would raise the density",
			human.Bytes(c.SwapUsed), human.Bytes(c.SwapSize), human.Bytes(c.WorkingSet), human.Bytes(c.NodeMemory))
	case c.SwapSize > 0 && c.SwapBusy >= ceilingIOBusy:
		c.Resource = CeilingSwapIO
		c.Explanation = fmt.Sprintf("the swap device was busy %s of the time (swap-in %s/s, swap-out %s/s): the sandboxes' pages could not come back as fast as they were touched; faster swap (local SSD) or a smaller hot set would raise the density",
			human.Percent(c.SwapBusy), human.Bytes(s.SwapIn), human.Bytes(s.SwapOut))
	case c.CPUs > 0 && c.CPUCores >= ceilingCPUBusy*c.CPUs && c.WorkingSet < ceilingMemoryFull*c.NodeMemory:
		// Busy CPUs bound the density only while memory has room: a node whose memory is full
		// spends its CPU reclaiming and re-reading pages, a symptom of the memory ceiling.
		c.Resource = CeilingCPU
		c.Explanation = fmt.Sprintf("the sandboxes used %.2f of %.0f CPUs: CPU, not memory, bounded the density", c.CPUCores, c.CPUs)
	default:
		c.Resource = CeilingMemory
		each := ""
		if c.PerSandbox > 0 {
			each = fmt.Sprintf(" (%s a sandbox)", human.Bytes(c.PerSandbox))
		}
		c.Explanation = fmt.Sprintf("the working set, %s%s, filled %s of the node's %s memory",
			human.Bytes(c.WorkingSet), each, human.Percent(ratio(c.WorkingSet, c.NodeMemory)), human.Bytes(c.NodeMemory))
		if c.SwapSize > 0 {
			c.Explanation += fmt.Sprintf(" with %s of %s swap in use: what the workloads touch no longer fit", human.Bytes(c.SwapUsed), human.Bytes(c.SwapSize))
		} else {
			c.Explanation += ", without swap to hold the cold part of their heaps"
		}
	}
	if s.SwapLimited > 0 && c.SwapSize > 0 {
		// Under LimitedSwap each container may fill only its share: the node's swap is not all
		// theirs to use, and one at its limit is bounded by that (swap-limit), not by the node.
		c.Explanation += fmt.Sprintf("; %d cgroups have a swap limit of their own (%s in all, %s of the node's swap; the largest %s), %d of them at it",
			s.SwapLimited, human.Bytes(s.SwapLimits), human.Percent(ratio(s.SwapLimits, c.SwapSize)), human.Bytes(s.SwapLimitMax), s.AtSwapLimit)
	}
	if c.ByRequest > 0 {
		c.Explanation += fmt.Sprintf("; by their memory request a scheduler would admit %d", c.ByRequest)
	}
	return c
}

// memoryCollapse: the sweep collapsed at a density (docs/findings.md).
func (a *analysis) memoryCollapse(dr *DensityReport) *Finding {
	if dr.Collapse == nil || dr.Ceiling == nil {
		return nil
	}
	var at, before DensityStep
	for _, s := range dr.Steps {
		if s.Density == dr.Collapse.Density {
			at = s
		}
		if s.Density == dr.MaxStable {
			before = s
		}
	}
	c, col := dr.Ceiling, dr.Collapse
	ev := func(metric string, b, v float64, unit string) Evidence {
		return Evidence{Metric: metric, Workload: rundir.WorkloadNode, Phase: at.Phase, Baseline: b, Value: v, Unit: unit}
	}
	f := &Finding{ID: IDMemoryCollapse, Severity: SeverityCritical, Victim: rundir.WorkloadNode, Culprits: []string{},
		Evidence: []Evidence{
			ev("density", float64(dr.MaxStable), float64(col.Density), UnitCount), //rundir:other: evidence names
			ev("readiness_p99", before.ReadinessP99, at.ReadinessP99, UnitSeconds),
			ev("tick_lateness_max", before.TickLatenessMax, at.TickLatenessMax, UnitSeconds),
			ev("psi_memory_full_share", before.PSIMemoryFull, at.PSIMemoryFull, UnitRatio),
			ev("oom_kills", before.OOMKills, at.OOMKills, UnitCount),
			ev("working_set", before.WorkingSet, at.WorkingSet, UnitBytes), //rundir:other
			ev("node_memory", c.NodeMemory, c.NodeMemory, UnitBytes),
			ev("swap_used", before.SwapUsed, at.SwapUsed, UnitBytes),
			ev("swap_size", c.SwapSize, c.SwapSize, UnitBytes),
			ev("swap_limits_total", before.SwapLimits, at.SwapLimits, UnitBytes),
			ev("at_swap_limit", float64(before.AtSwapLimit), float64(at.AtSwapLimit), UnitCount),
			ev("refaults_file_per_second", before.RefaultsFile, at.RefaultsFile, UnitCount),
			ev("reclaim_stall", before.ReclaimStall, at.ReclaimStall, UnitSeconds),
			ev("swap_in_bytes_per_second", before.SwapIn, at.SwapIn, UnitBytes),
			ev("swap_device_busy_share", before.SwapDeviceBusy, at.SwapDeviceBusy, UnitRatio),
			ev("swap_io_p99", before.SwapIOP99, at.SwapIOP99, UnitSeconds),
			ev("cpu_cores", before.CPUCores, at.CPUCores, UnitRatio),
		}}
	if c.Disk != "" {
		e := ev("disk_busy_share", 0, c.DiskBusy, UnitRatio)
		e.Device = c.Disk
		f.Evidence = append(f.Evidence, e)
	}
	// Who the OOM killer took, from the sandboxes' own counters (the cgroup sampler's).
	var killed []string
	for _, ss := range a.run.Series(rundir.MetricMemoryOOMKills) {
		if ss.Cgroup != a.nodeCgroup() && within(ss.Cgroup, a.nodeCgroup()) && ss.Delta(a.run.Span()) > 0 {
			killed = append(killed, a.name(ss.Cgroup))
		}
	}
	slices.Sort(killed)
	killed = slices.Compact(killed)
	swap := "no swap"
	if c.SwapSize > 0 {
		swap = fmt.Sprintf("swap %s of %s", human.Bytes(c.SwapUsed), human.Bytes(c.SwapSize))
	}
	f.Summary = fmt.Sprintf("the node collapsed at %d sandboxes (%d held): %s crossed first (%s); "+
		"the working set was %s of %s memory (%s), %s. Ceiling: %s — %s.",
		col.Density, dr.MaxStable, col.Signal, col.Crossing(),
		human.Bytes(c.WorkingSet), human.Bytes(c.NodeMemory), human.Percent(ratio(c.WorkingSet, c.NodeMemory)), swap, c.Resource, c.Explanation)
	if len(killed) > 0 {
		f.Summary += fmt.Sprintf(" The OOM killer killed %s.", joinNames(killed))
	}
	return f
}

// Crossing says how far a collapse signal crossed its bound.
func (c *DensityCollapse) Crossing() string {
	switch c.Signal {
	case rundir.SignalPSIFull:
		return fmt.Sprintf("%s of the time, over its bound %s", human.Percent(c.Value), human.Percent(c.Bound))
	case rundir.SignalOOMKill:
		return fmt.Sprintf("%.0f kill(s)", c.Value)
	}
	return fmt.Sprintf("%s, over its bound %s", human.Seconds(c.Value), human.Seconds(c.Bound))
}
