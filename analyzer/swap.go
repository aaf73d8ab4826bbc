package analyzer

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/nodectl/nodectl/internal/human"
	"github.com/nodectl/nodectl/rundir"
)

// IDSwapThrashing: a cgroup keeps faulting back what was swapped out of it, or the node swaps in
// and out at once.
const IDSwapThrashing = "swap-thrashing"

// Thresholds of swap-thrashing (docs/findings.md).
const (
	// swapFaultsMinPerSecond: a cgroup faulting back (major faults, anon refaults or swap-ins,
	// whichever is highest) at least this many pages a second, in each half of a window,
	// thrashes. One fault-back is a disk read of up to milliseconds; a hundred a second is a
	// tenth of a thread's time at a millisecond each.
	swapFaultsMinPerSecond = 100.0
	// swapFaultsCriticalPerSecond: at this rate the workload mostly waits for the swap device.
	swapFaultsCriticalPerSecond = 1000.0
	// swapNodeMinPagesPerSecond: the node swaps in and out at once when both pswpin and pswpout
	// reach this rate (1 MiB/s of 4 KiB pages each way) in a window.
	swapNodeMinPagesPerSecond = 256.0
)

// swapUse is what a cgroup swapped and faulted back in a window.
type swapUse struct {
	w                                    rundir.Window
	swapMax                              float64 // bytes, the highest memory_swap_bytes reading
	majors, refaults, swapIns, limitHits float64 // counts over the window
	firstHalf, secondHalf                float64 // fault-backs a second in each half
}

// faultBack is the pages the cgroup brought back: the highest of its three counts (they overlap:
// a swap-in from disk is a major fault, and a refault when the kernel still remembered the page).
func (u swapUse) faultBack() float64 { return max(u.majors, u.refaults, u.swapIns) }

// swapThrashing applies swap-thrashing to every sampled cgroup and to the node
// (docs/findings.md).
func (a *analysis) swapThrashing() []Finding {
	var hit []swapUse
	var cgroups []string
	for cg, swap := range a.run.Series(rundir.MetricMemorySwap).ByCgroup() {
		var worst *swapUse
		for _, w := range a.windows {
			u := a.swapUse(cg, swap, w)
			if u.swapMax <= 0 || u.firstHalf < swapFaultsMinPerSecond || u.secondHalf < swapFaultsMinPerSecond {
				continue
			}
			if worst == nil || ratio(u.faultBack(), u.w.Seconds()) > ratio(worst.faultBack(), worst.w.Seconds()) {
				worst = &u
			}
		}
		if worst != nil {
			hit = append(hit, *worst)
			cgroups = append(cgroups, cg)
		}
	}
	var out []Finding
	for i, cg := range cgroups {
		// A v1 parent's total_* and a v2 parent's counters include its children's: report the
		// deepest cgroup that thrashes, not every ancestor of it.
		if slices.ContainsFunc(cgroups, func(c string) bool { return c != cg && within(c, cg) }) {
			continue
		}
		out = append(out, a.swapFinding(cg, hit[i]))
	}
	slices.SortFunc(out, func(x, y Finding) int { return cmp.Compare(x.Victim, y.Victim) })
	if f := a.nodeSwapThrashing(); f != nil {
		out = append(out, *f)
	}
	return out
}

func (a *analysis) swapUse(cg string, swap rundir.SeriesSet, w rundir.Window) swapUse {
	series := func(metric string, kv ...string) rundir.SeriesSet {
		ss := a.run.Series(metric).Cgroup(cg)
		if len(kv) == 2 {
			ss = ss.Label(kv[0], kv[1])
		}
		return ss
	}
	majors, refaults := series(rundir.MetricMemoryMajorFaults), series(rundir.MetricMemoryRefaults, rundir.LabelKind, rundir.RefaultAnon)
	swapIns := series(rundir.MetricMemorySwapPages, rundir.LabelOp, rundir.SwapIn)
	w = observed(w, majors, refaults, swapIns)
	u := swapUse{w: w, majors: majors.Delta(w), refaults: refaults.Delta(w), swapIns: swapIns.Delta(w),
		limitHits: series(rundir.MetricMemoryLimitEvents, rundir.LabelKind, rundir.LimitMax).Delta(w)}
	for _, v := range swap.Values(w) {
		u.swapMax = max(u.swapMax, v)
	}
	mid := splitAt(w, majors, refaults, swapIns)
	for i, half := range []rundir.Window{{Name: w.Name, Start: w.Start, End: mid}, {Name: w.Name, Start: mid, End: w.End}} {
		rate := ratio(max(majors.Delta(half), refaults.Delta(half), swapIns.Delta(half)), half.Seconds())
		if i == 0 {
			u.firstHalf = rate
		} else {
			u.secondHalf = rate
		}
	}
	return u
}

// observed is w from the first sample of sets on, when that comes later: a counter counts from
// its cgroup's birth (the node's from boot) and reads zero before its first sample, so a window
// opening before that sample would count everything since then.
func observed(w rundir.Window, sets ...rundir.SeriesSet) rundir.Window {
	var first time.Time
	for _, ss := range sets {
		for _, s := range ss {
			if len(s.Samples) > 0 && (first.IsZero() || s.Samples[0].Time.Before(first)) {
				first = s.Samples[0].Time
			}
		}
	}
	if first.After(w.Start) && first.Before(w.End) {
		w.Start = first
	}
	return w
}

// splitAt is where to cut w in two halves: at the sample of sets nearest w's middle, so that
// each half holds whole sampling intervals (a cut between two samples would give one half
// nothing); at the middle itself when no sample lies inside w.
func splitAt(w rundir.Window, sets ...rundir.SeriesSet) time.Time {
	mid := w.Start.Add(w.End.Sub(w.Start) / 2)
	best, bestDist := mid, time.Duration(-1)
	for _, ss := range sets {
		for _, s := range ss {
			for _, r := range s.Samples {
				if !r.Time.After(w.Start) || !r.Time.Before(w.End) {
					continue
				}
				if d := max(r.Time.Sub(mid), mid.Sub(r.Time)); bestDist < 0 || d < bestDist {
					best, bestDist = r.Time, d
				}
			}
		}
	}
	return best
}

func (a *analysis) swapFinding(cg string, u swapUse) Finding {
	name := a.name(cg)
	// The stress phase is shown against the baseline when both exist, as for cpu-throttling;
	// a window that thrashed is quoted either way.
	ref := swapUse{}
	if a.compare && u.w.Name == a.stress.Name {
		ref = a.swapUse(cg, a.run.Series(rundir.MetricMemorySwap).Cgroup(cg), a.baseline)
	}
	ev := func(metric string, b, v float64, unit string) Evidence {
		return Evidence{Metric: metric, Workload: name, Phase: u.w.Name, Baseline: b, Value: v, Unit: unit}
	}
	rate := ratio(u.faultBack(), u.w.Seconds())
	sev := SeverityWarning
	if rate >= swapFaultsCriticalPerSecond {
		sev = SeverityCritical
	}
	f := Finding{
		ID: IDSwapThrashing, Severity: sev, Victim: name, Culprits: []string{},
		Evidence: []Evidence{
			ev("memory_swap_bytes_max", ref.swapMax, u.swapMax, UnitBytes),
			ev("major_faults", ref.majors, u.majors, UnitCount),
			ev("anon_refaults", ref.refaults, u.refaults, UnitCount),
		},
	}
	if len(a.run.Series(rundir.MetricMemorySwapPages).Cgroup(cg)) > 0 {
		f.Evidence = append(f.Evidence, ev("swap_ins", ref.swapIns, u.swapIns, UnitCount))
	}
	f.Evidence = append(f.Evidence, ev("memory_limit_hits", ref.limitHits, u.limitHits, UnitCount))
	limit := ""
	for _, wl := range a.run.Meta.Workloads {
		if wl.Cgroup == a.owner(cg) && wl.Memory != "" {
			limit = " (limit " + wl.Memory + ")"
		}
	}
	f.Summary = fmt.Sprintf("%s keeps faulting back what was swapped out of it: %s of it in swap, "+
		"%.0f pages a second brought back in the %s window (%.0f major faults, %.0f anon refaults), %.0f/s in its first half "+
		"and %.0f/s in its second. Its working set does not fit its memory%s: swap keeps it alive but "+
		"every fault-back waits on the swap device.",
		name, human.Bytes(u.swapMax), rate, u.w.Name, u.majors, u.refaults, u.firstHalf, u.secondHalf, limit)
	if io := a.swapDeviceIO(u.w, rundir.OpRead, func(c string) bool { return within(c, cg) }); io.requests > 0 {
		f.Evidence = append(f.Evidence, io.evidence("swap_device_reads", name, u.w)...)
		f.Summary += fmt.Sprintf(" Its reads on the swap device %s (its swap-ins) waited %s in all, %d requests at %s each on average, p99 %s.",
			io.device, human.Seconds(io.wait), io.requests, human.Seconds(io.wait/float64(io.requests)), human.Seconds(io.p99))
	}
	f.Summary += " Raise its memory limit or shrink its working set."
	return f
}

// nodeSwapThrashing: the node swapped in and out at high rates in the same window; the cgroups
// that brought back the most pages then are its culprits.
func (a *analysis) nodeSwapThrashing() *Finding {
	vm := a.run.Series(rundir.MetricVmstat).Cgroup("")
	in, out := vm.Label(rundir.LabelName, "pswpin"), vm.Label(rundir.LabelName, "pswpout")
	var worst *rundir.Window
	var worstRate float64
	for _, w := range a.windows {
		w = observed(w, in, out)
		rin, rout := ratio(in.Delta(w), w.Seconds()), ratio(out.Delta(w), w.Seconds())
		if rin >= swapNodeMinPagesPerSecond && rout >= swapNodeMinPagesPerSecond && min(rin, rout) > worstRate {
			worst, worstRate = &w, min(rin, rout)
		}
	}
	if worst == nil {
		return nil
	}
	w := *worst
	var refIn, refOut float64
	if a.compare && w.Name == a.stress.Name {
		refIn, refOut = in.Delta(a.baseline), out.Delta(a.baseline)
	}
	f := &Finding{
		ID: IDSwapThrashing, Severity: SeverityWarning, Victim: rundir.WorkloadNode, Culprits: []string{},
		Evidence: []Evidence{
			{Metric: "pswpin", Phase: w.Name, Baseline: refIn, Value: in.Delta(w), Unit: UnitCount},
			{Metric: "pswpout", Phase: w.Name, Baseline: refOut, Value: out.Delta(w), Unit: UnitCount},
		},
	}
	// Culprits by pages brought back, charged to their workloads; only the deepest cgroups count,
	// as their parents' counters include them.
	byOwner := map[string]float64{}
	cgs := slices.Collect(maps.Keys(a.run.Series(rundir.MetricMemorySwap).ByCgroup()))
	for _, cg := range cgs {
		if slices.ContainsFunc(cgs, func(c string) bool { return c != cg && within(c, cg) }) {
			continue
		}
		byOwner[a.owner(cg)] += a.swapUse(cg, nil, w).faultBack()
	}
	var shares []share
	for cg, v := range byOwner {
		shares = append(shares, share{cgroup: cg, value: v})
	}
	for _, c := range culprits(shares) {
		n := a.name(c.cgroup)
		f.Culprits = append(f.Culprits, n)
		f.Evidence = append(f.Evidence, Evidence{Metric: "fault_backs", Workload: n, Culprit: n, Phase: w.Name, Value: c.value, Unit: UnitCount})
	}
	by := ""
	if len(f.Culprits) > 0 {
		by = ", mostly brought back by " + joinNames(f.Culprits)
	}
	f.Summary = fmt.Sprintf("The node swapped in and out at once in the %s window: %.0f pages a second in and %.0f out%s. "+
		"Memory is overcommitted beyond what swap can absorb: every page written out is soon read back.",
		w.Name, ratio(in.Delta(w), w.Seconds()), ratio(out.Delta(w), w.Seconds()), by)
	// The node's own swap-outs: kswapd's writes, charged to the root cgroup.
	if io := a.swapDeviceIO(w, rundir.OpWrite, func(c string) bool { return c == "" || c == "/" }); io.requests > 0 {
		f.Evidence = append(f.Evidence, io.evidence("swap_device_node_writes", rundir.WorkloadNode, w)...)
		f.Summary += fmt.Sprintf(" The node's own writes on the swap device %s (kswapd's swap-outs) moved %s in %d requests, p99 %s.",
			io.device, human.Bytes(io.bytes), io.requests, human.Seconds(io.p99))
	}
	f.Summary += " Lower the density or the working sets, or give the node memory."
	return f
}

// swapDeviceIO is what the block tracer saw of one op on the swap device in a window, from the
// cgroups a predicate keeps: a thrashing cgroup's reads are its swap-ins, which its faulting
// tasks wait for (a swap file shares its disk with file reads, which count too); writes issued
// by kswapd are charged to the root cgroup, the node's.
type swapDeviceIO struct {
	device   string
	requests uint64
	wait     float64 // seconds in queue and service, summed over the requests
	p99      float64 // queue p99 plus service p99, standing for the requests' p99
	bytes    float64
}

func (a *analysis) swapDeviceIO(w rundir.Window, op string, keep func(cgroup string) bool) swapDeviceIO {
	io := swapDeviceIO{device: a.swapDevice()}
	if io.device == "" {
		return io
	}
	of := func(metric string) rundir.SeriesSet {
		var out rundir.SeriesSet
		for cg, ss := range a.run.Series(metric).Label(rundir.LabelDevice, io.device).Label(rundir.LabelOp, op).ByCgroup() {
			if keep(cg) {
				out = append(out, ss...)
			}
		}
		return out
	}
	q, s := of(rundir.MetricBlkQueue).HistDelta(w), of(rundir.MetricBlkService).HistDelta(w)
	io.requests, io.wait, io.p99 = s.Count, secs(q.SumNs+s.SumNs), q.Quantile(0.99)+s.Quantile(0.99)
	io.bytes = of(rundir.MetricBlkBytes).Delta(w)
	return io
}

// evidence lists the requests, their wait and p99, and their bytes, as <prefix>_requests and
// so on, with the device.
func (io swapDeviceIO) evidence(prefix, workload string, w rundir.Window) []Evidence {
	out := []Evidence{
		{Metric: prefix + "_requests", Workload: workload, Phase: w.Name, Value: float64(io.requests), Unit: UnitCount},
		{Metric: prefix + "_wait_seconds", Workload: workload, Phase: w.Name, Value: io.wait, Unit: UnitSeconds},
		{Metric: prefix + "_p99_seconds", Workload: workload, Phase: w.Name, Value: io.p99, Unit: UnitSeconds},
		{Metric: prefix + "_bytes", Workload: workload, Phase: w.Name, Value: io.bytes, Unit: UnitBytes},
	}
	for i := range out {
		out[i].Device = io.device
	}
	return out
}
