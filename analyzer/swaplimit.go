package analyzer

import (
	"cmp"
	"fmt"
	"maps"
	"slices"

	"github.com/nodectl/nodectl/internal/human"
	"github.com/nodectl/nodectl/rundir"
)

// IDSwapLimit: a cgroup filled its own swap limit while it pressed on its memory limit: its
// limit, not the node's swap, bounded it.
const IDSwapLimit = "swap-limit"

// swapLimitFullShare: a cgroup whose swap reached this share of its swap limit has filled it
// (the kernel leaves it a few pages short, reclaiming or killing first).
const swapLimitFullShare = 0.9

// swapLimited is a cgroup at its swap limit in one window.
type swapLimited struct {
	w              rundir.Window
	limit, swapMax float64 // bytes
	// Over the window: swap charges its limit refused (v2 memory.swap.events max), memory
	// limit hits, OOM kills.
	swapHits, limitHits, oomKills float64
	nodeSwapTotal, nodeSwapFree   float64 // bytes: the node's swap, its largest total and least free in the window
}

// swapLimits applies swap-limit to every cgroup with a swap limit (docs/findings.md): the
// deepest one that filled it, in its worst window.
func (a *analysis) swapLimits() []Finding {
	hit := map[string]swapLimited{}
	for cg, limits := range a.run.Series(rundir.MetricMemorySwapLimit).ByCgroup() {
		for _, w := range a.windows {
			u, ok := a.swapLimited(cg, limits, w)
			if !ok {
				continue
			}
			if prev, seen := hit[cg]; !seen || u.oomKills > prev.oomKills || u.oomKills == prev.oomKills && u.limitHits > prev.limitHits {
				hit[cg] = u
			}
		}
	}
	var out []Finding
	cgroups := slices.Collect(maps.Keys(hit))
	for cg, u := range hit {
		// A v1 child's hierarchical limit is its parent's too: the deepest cgroup speaks.
		if slices.ContainsFunc(cgroups, func(c string) bool { return c != cg && within(c, cg) }) {
			continue
		}
		out = append(out, a.swapLimitFinding(cg, u))
	}
	slices.SortFunc(out, func(x, y Finding) int { return cmp.Compare(x.Victim, y.Victim) })
	return out
}

// swapLimited measures cgroup in w: it qualifies when the kernel refused it swap past its limit
// there, or when its swap reached swapLimitFullShare of its limit while it hit its memory limit
// or lost a task to the OOM killer (a sample may miss the peak of a cgroup killed at once; the
// refusals it counts).
func (a *analysis) swapLimited(cg string, limits rundir.SeriesSet, w rundir.Window) (swapLimited, bool) {
	u := swapLimited{w: w}
	for _, v := range limits.Values(w) {
		u.limit = max(u.limit, v)
	}
	if u.limit <= 0 {
		return u, false
	}
	for _, v := range a.run.Series(rundir.MetricMemorySwap).Cgroup(cg).Values(w) {
		u.swapMax = max(u.swapMax, v)
	}
	events := a.run.Series(rundir.MetricMemoryLimitEvents).Cgroup(cg)
	swapHits, hits := events.Label(rundir.LabelKind, rundir.LimitSwap), events.Label(rundir.LabelKind, rundir.LimitMax)
	kills := a.run.Series(rundir.MetricMemoryOOMKills).Cgroup(cg)
	w = observed(w, swapHits, hits, kills)
	u.swapHits, u.limitHits, u.oomKills = swapHits.Delta(w), hits.Delta(w), kills.Delta(w)
	full := u.swapMax >= swapLimitFullShare*u.limit && (u.limitHits > 0 || u.oomKills > 0)
	if u.swapHits <= 0 && !full {
		return u, false
	}
	meminfo := a.run.Series(rundir.MetricMeminfo)
	for _, v := range meminfo.Label(rundir.LabelName, "SwapTotal").Values(w) {
		u.nodeSwapTotal = max(u.nodeSwapTotal, v)
	}
	u.nodeSwapFree = u.nodeSwapTotal
	for _, v := range meminfo.Label(rundir.LabelName, "SwapFree").Values(w) {
		u.nodeSwapFree = min(u.nodeSwapFree, v)
	}
	return u, true
}

func (a *analysis) swapLimitFinding(cg string, u swapLimited) Finding {
	name := a.name(cg)
	ev := func(metric string, v float64, unit string) Evidence {
		return Evidence{Metric: metric, Workload: name, Phase: u.w.Name, Value: v, Unit: unit}
	}
	sev := SeverityWarning
	if u.oomKills > 0 {
		sev = SeverityCritical
	}
	f := Finding{ID: IDSwapLimit, Severity: sev, Victim: name, Culprits: []string{}, Evidence: []Evidence{
		ev("memory_swap_bytes_max", u.swapMax, UnitBytes),
		ev(rundir.MetricMemorySwapLimit, u.limit, UnitBytes),
		ev("swap_limit_hits", u.swapHits, UnitCount),
		ev("memory_limit_hits", u.limitHits, UnitCount),
		ev("oom_kills", u.oomKills, UnitCount),
	}}
	var pressed []string
	if u.swapHits > 0 {
		pressed = append(pressed, fmt.Sprintf("the kernel refused it swap %.0f times at that limit", u.swapHits))
	}
	pressed = append(pressed, fmt.Sprintf("it hit its memory limit %.0f times", u.limitHits))
	if u.oomKills > 0 {
		pressed = append(pressed, fmt.Sprintf("it lost %.0f task(s) to the OOM killer", u.oomKills))
	}
	f.Summary = fmt.Sprintf("%s filled its own swap limit (%s phase): at most %s in swap, as sampled, of the %s it may use; %s.",
		name, u.w.Name, human.Bytes(u.swapMax), human.Bytes(u.limit), joinNames(pressed))
	if u.nodeSwapTotal > 0 {
		share := ratio(u.limit, u.nodeSwapTotal)
		f.Evidence = append(f.Evidence,
			Evidence{Metric: "node_swap_total_bytes", Phase: u.w.Name, Value: u.nodeSwapTotal, Unit: UnitBytes},
			Evidence{Metric: "node_swap_free_bytes", Phase: u.w.Name, Value: u.nodeSwapFree, Unit: UnitBytes},
			ev("swap_limit_node_share", share, UnitRatio))
		bound := "this limit, not the node's swap, bounded it"
		if u.nodeSwapFree < (1-swapLimitFullShare)*u.nodeSwapTotal {
			bound = "the node's swap was nearly full too"
		}
		f.Summary += fmt.Sprintf(" The node had %s of its %s swap free: %s. "+
			"Its limit is %s of the node's swap; under the kubelet's LimitedSwap a Burstable container gets "+
			"(its memory request / the node's memory) × the node's swap, so its request is about %s of the node's memory.",
			human.Bytes(u.nodeSwapFree), human.Bytes(u.nodeSwapTotal), bound, human.Percent(share), human.Percent(share))
	}
	f.Summary += " Raise its memory request (its share of swap) or its memory limit, or shrink its working set."
	return f
}
