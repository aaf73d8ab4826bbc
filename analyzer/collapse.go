package analyzer

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/nodectl/nodectl/internal/human"
	"github.com/nodectl/nodectl/rundir"
)

// IDNodeCollapse: the node collapsed in an agent window (its Lease went late, it left Ready, or
// OOM kills came with memory pressure), and the density sweep's verdict says which resource
// bounded it, from the window's own numbers (docs/findings.md).
const IDNodeCollapse = "node-collapse"

// collapsePSIFullShare: the node's memory PSI full share over the window that, with OOM kills,
// makes a collapse: a density sweep's default criterion (stress density --collapse-psi-full).
const collapsePSIFullShare = 0.10

// nodeCollapse gives an agent window in which the node collapsed the density verdict: the
// window is read as a sweep's step (the node's memory from meminfo, its swap and swap device,
// its CPU, its Lease and Ready condition, its OOM kills), its collapse signals are a sweep's
// criteria, and its ceiling is decided as a sweep's is.
func (a *analysis) nodeCollapse(rep *Report) {
	w := a.stress
	if w.Name == "" {
		return
	}
	cfg := rundir.DensityConfig{Node: a.run.Meta.Node, CriterionLeaseLate: leaseLateMargin.Seconds(),
		CriterionPSIFullShare: collapsePSIFullShare, CriterionOOMKill: true}
	if cfg.Node == "" {
		cfg.Node = rundir.WorkloadNode // kubeStep reads the node's memory for any named node
	}
	if b := a.run.Meta.Booking; b != nil {
		// What the kubelet lets pods have, not the machine's capacity.
		cfg.NodeMemoryBytes, cfg.CPUs = b.AllocatableMemory, int(b.AllocatableCPUMilli/1000)
	}
	s := a.densityStep(0, w, cfg, nil, a.run.Records)
	s.CPUCores = ratio(a.nodeCPUSeconds(w), w.Seconds())
	var killed []string
	for _, r := range a.run.Records {
		if r.Type == rundir.TypeEvent && r.Name == rundir.EventOOMKill && !r.Time.Before(w.Start) && !r.Time.After(w.End) {
			s.OOMKills++
			killed = append(killed, a.name(a.owner(r.Cgroup)))
		}
	}
	s.Signals = crossed(s, cfg)
	var said []string
	has := func(sig string) bool { return slices.Contains(s.Signals, sig) }
	if has(rundir.SignalLeaseLate) {
		said = append(said, fmt.Sprintf("its Lease was renewed %s past its interval", human.Seconds(s.LeaseLateMax)))
	}
	if has(rundir.SignalNotReady) {
		said = append(said, "the Node left Ready")
	}
	if has(rundir.SignalOOMKill) && has(rundir.SignalPSIFull) {
		said = append(said, fmt.Sprintf("%.0f OOM kill(s) came while all its tasks stalled on memory %s of the time",
			s.OOMKills, human.Percent(s.PSIMemoryFull)))
	}
	if len(said) == 0 {
		return
	}
	c := ceiling(s, cfg)
	ev := func(metric string, v float64, unit string) Evidence {
		return Evidence{Metric: metric, Workload: rundir.WorkloadNode, Phase: w.Name, Value: v, Unit: unit}
	}
	f := Finding{ID: IDNodeCollapse, Severity: SeverityCritical, Victim: rundir.WorkloadNode, Culprits: []string{},
		Evidence: []Evidence{
			ev("lease_late_max", s.LeaseLateMax, UnitSeconds),
			ev("oom_kills", s.OOMKills, UnitCount),
			ev("psi_memory_full_share", s.PSIMemoryFull, UnitRatio),
			ev("working_set", c.WorkingSet, UnitBytes), //rundir:other: evidence names
			ev("node_memory", c.NodeMemory, UnitBytes),
			ev("swap_used", c.SwapUsed, UnitBytes),
			ev("swap_size", c.SwapSize, UnitBytes),
			ev("swap_device_busy_share", c.SwapBusy, UnitRatio),
			ev("swap_limits_total", s.SwapLimits, UnitBytes),
			ev("at_swap_limit", float64(s.AtSwapLimit), UnitCount),
			ev("swap_in_bytes_per_second", s.SwapIn, UnitBytes),
			ev("refaults_file_per_second", s.RefaultsFile, UnitCount),
			ev("major_faults_per_second", s.MajorFaults, UnitCount),
			ev("cpu_cores", c.CPUCores, UnitRatio),
		}}
	if c.Disk != "" {
		e := ev("disk_busy_share", c.DiskBusy, UnitRatio)
		e.Device = c.Disk
		f.Evidence = append(f.Evidence, e)
	}
	for _, sh := range a.ceilingCulprits(c, s, w) {
		n := a.name(sh.cgroup)
		f.Culprits = append(f.Culprits, n)
		f.Evidence = append(f.Evidence, Evidence{Metric: sh.metric, Workload: n, Culprit: n, Phase: w.Name, Value: sh.value, Unit: sh.unit, Device: c.Disk})
	}
	slices.Sort(killed)
	f.Summary = fmt.Sprintf("The node collapsed in the window: %s. Ceiling: %s — %s.",
		strings.Join(said, "; "), c.Resource, c.Explanation)
	if len(f.Culprits) > 0 {
		f.Summary += fmt.Sprintf(" Most of it came from %s.", joinNames(f.Culprits))
	}
	if killed = slices.Compact(killed); len(killed) > 0 {
		f.Summary += fmt.Sprintf(" The OOM killer killed in %s.", joinNames(killed))
	}
	rep.Findings = append(rep.Findings, f)
}

// ceilingShare is a culprit of a disk ceiling and its evidence.
type ceilingShare struct {
	share
	metric, unit string
}

// ceilingCulprits names who loaded the saturated disk of a disk ceiling: the cgroups whose
// evicted file pages were read back most (their binaries), or journald.
func (a *analysis) ceilingCulprits(c *DensityCeiling, s DensityStep, w rundir.Window) []ceilingShare {
	var out []ceilingShare
	switch c.Resource {
	case CeilingDiskRefaults:
		byCg := a.run.Series(rundir.MetricMemoryRefaults).Label(rundir.LabelKind, rundir.RefaultFile).ByCgroup()
		cgroups := slices.Collect(maps.Keys(byCg))
		var shares []share
		for cg, ss := range byCg {
			// A parent's counters hold its children's: the deepest cgroups only.
			if cg == "" || slices.ContainsFunc(cgroups, func(o string) bool { return o != cg && within(o, cg) }) {
				continue
			}
			if v := ss.Delta(w); v > 0 {
				shares = append(shares, share{cgroup: cg, value: v})
			}
		}
		for _, sh := range culprits(shares) {
			out = append(out, ceilingShare{sh, "file_refaults", UnitCount})
		}
	case CeilingJournald:
		for _, wl := range a.run.Meta.Workloads {
			if wl.Kind == rundir.KindDaemon && strings.HasPrefix(wl.Name, "systemd-journal") {
				out = append(out, ceilingShare{share{cgroup: wl.Cgroup, value: s.JournaldWriteShare}, "journald_write_share", UnitRatio})
			}
		}
	}
	return out
}
