package analyzer

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/nodectl/nodectl/internal/human"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

// Finding ids of the memory rules.
const (
	IDMemoryReclaim = "memory-reclaim"
	IDOOMKill       = "oom-kill" //rundir:other: a finding id
)

// Thresholds of memory-reclaim; docs/findings.md explains them.
const (
	reclaimStallMinSeconds = 0.050 // less stall time in a window is noise
	reclaimStallMinShare   = 0.005 // stall time over the window's wall time
	reclaimRiseFactor      = 2.0   // stall time a second, stress over baseline
	// reclaimCriticalShare: stalls summing to this share of the window's wall time are critical.
	reclaimCriticalShare = 0.10
	// growthMinBytes: a neighbour whose memory grew less than this in the window is no culprit.
	growthMinBytes = 16 << 20
)

// memory applies memory-reclaim to every workload and reports every OOM kill (docs/findings.md).
// Under an emulated node (a density run's node workload) the node speaks for the sandboxes in
// it: one finding over its whole subtree, not one per sandbox.
func (a *analysis) memory() []Finding {
	var out []Finding
	for _, w := range a.run.Meta.Workloads {
		if a.underNode(w.Cgroup) {
			continue
		}
		if f := a.memoryReclaim(w); f != nil {
			out = append(out, *f)
		}
	}
	return append(out, a.oomKills()...)
}

// reclaimStalls is what a workload's tasks spent reclaiming in a window, by kind.
type reclaimStalls struct {
	w     rundir.Window
	stall map[string]hist.Log2 // by kind
	pages map[string]float64
	total float64 // seconds, all kinds
}

// underNode reports whether cgroup lies below the run's emulated node.
func (a *analysis) underNode(cgroup string) bool {
	n := a.nodeCgroup()
	return n != "" && cgroup != n && within(cgroup, n)
}

// reclaimStallsOf measures the reclaim stalls of cgroup and the cgroups it owns in w (for the
// emulated node, every cgroup below it).
func (a *analysis) reclaimStallsOf(cgroup string, w rundir.Window) reclaimStalls {
	r := reclaimStalls{w: w, stall: map[string]hist.Log2{}, pages: map[string]float64{}}
	subtree := cgroup == a.nodeCgroup()
	mine := func(ss rundir.SeriesSet) map[string]rundir.SeriesSet {
		out := map[string]rundir.SeriesSet{}
		for cg, s := range ss.ByCgroup() {
			if subtree && !within(cg, cgroup) || !subtree && a.owner(cg) != cgroup {
				continue
			}
			for kind, k := range s.ByLabel(rundir.LabelKind) {
				out[kind] = append(out[kind], k...)
			}
		}
		return out
	}
	for kind, ss := range mine(a.run.Series(rundir.MetricReclaimStall)) {
		h := ss.HistDelta(w)
		r.stall[kind] = h
		r.total += secs(h.SumNs)
	}
	for kind, ss := range mine(a.run.Series(rundir.MetricReclaimPages)) {
		r.pages[kind] = ss.Delta(w)
	}
	return r
}

// material reports whether the stalls are more than noise for their window.
func (r reclaimStalls) material() bool {
	return r.total >= reclaimStallMinSeconds && ratio(r.total, r.w.Seconds()) >= reclaimStallMinShare
}

// memoryReclaim: the workload's tasks stalled reclaiming memory (docs/findings.md). Stalls
// against its own limit are reported in any window, as its own quota is by cpu-throttling;
// stalls from the node's or a parent's shortage only when they rose in the stress phase.
func (a *analysis) memoryReclaim(v rundir.Workload) *Finding {
	var hit []reclaimStalls
	for _, w := range a.windows {
		if s := a.reclaimStallsOf(v.Cgroup, w); s.material() {
			hit = append(hit, s)
		}
	}
	if len(hit) == 0 {
		return nil
	}
	worst := hit[0]
	for _, s := range hit[1:] {
		if s.total > worst.total {
			worst = s
		}
	}
	shown, ref, quoted := worst, reclaimStalls{stall: map[string]hist.Log2{}, pages: map[string]float64{}}, worst
	rose := false
	if a.compare {
		shown, ref = a.reclaimStallsOf(v.Cgroup, a.stress), a.reclaimStallsOf(v.Cgroup, a.baseline)
		rose = shown.material() && ratio(ratio(shown.total, shown.w.Seconds()), ratio(ref.total, ref.w.Seconds())) >= reclaimRiseFactor
		if shown.material() {
			quoted = shown
		}
	}
	// memcg reclaim is a limit: the workload's own when it has one. Anything else (direct
	// reclaim, or a limit above the workload's cgroup) is memory the node or the parent ran
	// short of, and the neighbours that grew took it.
	memcg, direct := secs(quoted.stall[rundir.ReclaimMemcg].SumNs), secs(quoted.stall[rundir.ReclaimDirect].SumNs)
	ownLimit := memcg >= direct && v.Memory != ""
	if a.compare && !rose && !ownLimit {
		return nil // as much in the baseline: the neighbours changed nothing
	}

	share := ratio(quoted.total, quoted.w.Seconds())
	f := &Finding{ID: IDMemoryReclaim, Severity: SeverityWarning, Victim: v.Name, Culprits: []string{}}
	if share >= reclaimCriticalShare {
		f.Severity = SeverityCritical
	}
	ev := func(metric string, b, s float64, unit string) Evidence {
		return Evidence{Metric: metric, Workload: v.Name, Phase: shown.w.Name, Baseline: b, Value: s, Unit: unit}
	}
	for _, kind := range []string{rundir.ReclaimMemcg, rundir.ReclaimDirect} {
		h, hb := shown.stall[kind], ref.stall[kind]
		if h.Count == 0 && hb.Count == 0 {
			continue
		}
		stalls := ev("reclaim_stall_seconds_"+kind, secs(hb.SumNs), secs(h.SumNs), UnitSeconds)
		if h.Count > 0 {
			stalls.Histogram = &h
		}
		f.Evidence = append(f.Evidence, stalls,
			ev("reclaim_stall_p99_"+kind, hb.Quantile(0.99), h.Quantile(0.99), UnitSeconds),
			ev("reclaim_stall_max_at_least_"+kind, hb.LongestAtLeast(), h.LongestAtLeast(), UnitSeconds),
			ev("reclaim_stalls_"+kind, float64(hb.Count), float64(h.Count), UnitCount),
			ev("reclaim_pages_"+kind, ref.pages[kind], shown.pages[kind], UnitCount))
	}
	f.Evidence = append(f.Evidence, ev("reclaim_stall_share", ratio(ref.total, ref.w.Seconds()), ratio(shown.total, shown.w.Seconds()), UnitRatio))
	var parts []string
	for _, kind := range []string{rundir.ReclaimMemcg, rundir.ReclaimDirect} {
		if h := quoted.stall[kind]; h.Count > 0 {
			parts = append(parts, fmt.Sprintf("%s in %d %s reclaims (p99 %s, the longest at least %s, %.0f pages)",
				human.Seconds(secs(h.SumNs)), h.Count, kind, human.Seconds(h.Quantile(0.99)), human.Seconds(h.LongestAtLeast()), quoted.pages[kind]))
		}
	}
	var where []string
	for _, s := range hit {
		where = append(where, s.w.Name)
	}

	// What the stalls slowed: the victim's writes (which allocate page cache) and fsyncs that
	// got slower with them, when its device does not explain that and the stall time added
	// accounts for what they lost.
	var symptoms string
	if a.compare && rose && v.Kind == rundir.KindVictim {
		if vv := a.victim(v); !vv.disk.explains() {
			if io := vv.slowedIO(); len(io) > 0 && accountsFor(a.added(ref.total, shown.total), lost(io)) {
				_, symptoms = a.affects(f, v.Name, io)
			}
		}
	}
	if v.Kind == rundir.KindVictim && len(f.Affects) == 0 {
		if base, stress := a.probeReadings(v.Cgroup, measureWriteFsync, ref.w), a.probeReadings(v.Cgroup, measureWriteFsync, shown.w); len(stress) > 0 {
			f.Evidence = append(f.Evidence, ev("probe_write_fsync_p95", quantile(base, 0.95), quantile(stress, 0.95), UnitSeconds))
			symptoms = fmt.Sprintf("its write+fsync p95 was %s in %s", human.Seconds(quantile(stress, 0.95)), shown.w.Name)
		}
	}

	var cause string
	if ownLimit {
		if limit, err := resource.ParseQuantity(v.Memory); err == nil {
			f.Evidence = append(f.Evidence, ev("memory_limit_bytes", limit.AsApproximateFloat64(), limit.AsApproximateFloat64(), UnitBytes))
		}
		cause = fmt.Sprintf("its own memory limit (%s) made it reclaim, not its neighbours: its memory, "+
			"page cache included, does not fit under it. Raise its memory limit or shrink its working set.", v.Memory)
	} else {
		shortage := "the node ran short of free memory (direct reclaim)"
		if memcg >= direct {
			shortage = "a memory limit above its cgroup was reached (it has none of its own)"
		}
		growers := a.growers(v.Cgroup, quoted.w)
		for _, c := range culprits(growers) {
			n := a.name(c.cgroup)
			f.Culprits = append(f.Culprits, n)
			e := ev("memory_growth_bytes", 0, c.value, UnitBytes)
			e.Culprit = n
			f.Evidence = append(f.Evidence, e)
		}
		cause = shortage + ": "
		if len(f.Culprits) > 0 {
			its := "their"
			if len(f.Culprits) == 1 {
				its = "its"
			}
			cause += joinNames(f.Culprits) + " grew " + its + " memory the most meanwhile. "
		} else {
			cause += "no neighbour's memory grew by much meanwhile. "
		}
		cause += "Limit the neighbours' memory, or run fewer of them next to the workload."
	}
	f.Summary = fmt.Sprintf("%s's tasks stalled reclaiming memory in %s; in %s %s, %s of the wall time",
		v.Name, joinNames(where), quoted.w.Name, joinNames(parts), human.Percent(share))
	switch {
	case len(f.Affects) > 0:
		f.Summary += "; with the stalls, not with its device, " + symptoms
	case symptoms != "":
		f.Summary += "; " + symptoms
	}
	f.Summary += ". " + capitalize(cause)
	return f
}

// growers lists, for every sampled cgroup outside victim (and not an ancestor of another
// sampled cgroup, which would count its children twice), how much its memory usage rose in w:
// its highest reading less its last one before w (a hog that filled its memory as the stress
// phase began grew by all of it), or less its first in w when w starts the recording, added up
// by owning workload.
func (a *analysis) growers(victim string, w rundir.Window) []share {
	by := a.run.Series(rundir.MetricMemoryUsage).ByCgroup()
	growth := map[string]float64{}
	for cg, ss := range by {
		if within(cg, victim) || within(victim, cg) || ancestorOfAny(cg, by) {
			continue
		}
		vs := ss.Values(w)
		if len(vs) == 0 {
			continue
		}
		from := vs[0]
		if before := ss.Values(rundir.Window{End: w.Start}); len(before) > 0 {
			from = before[len(before)-1]
		}
		growth[a.owner(cg)] += max(0, slices.Max(vs)-from)
	}
	var out []share
	for cg, g := range growth {
		if g >= growthMinBytes {
			out = append(out, share{cgroup: cg, value: g})
		}
	}
	return out
}

// ancestorOfAny reports whether cg is an ancestor of another cgroup of by.
func ancestorOfAny(cg string, by map[string]rundir.SeriesSet) bool {
	for o := range by {
		if o != cg && within(o, cg) {
			return true
		}
	}
	return false
}

// killEvent is one OOM kill as the tracer recorded it.
type killEvent struct {
	rec   rundir.Record
	phase string
}

// oomKills: one finding per workload (or cgroup, outside workloads) that lost a process to the
// OOM killer in the run (docs/findings.md).
func (a *analysis) oomKills() []Finding {
	byOwner := map[string][]killEvent{}
	var order []string
	for _, r := range a.run.Records {
		if r.Type != rundir.TypeEvent || r.Name != rundir.EventOOMKill {
			continue
		}
		o := a.owner(r.Cgroup)
		if a.underNode(o) {
			o = a.nodeCgroup() // the node's finding lists the sandboxes' kills
		}
		if _, ok := byOwner[o]; !ok {
			order = append(order, o)
		}
		byOwner[o] = append(byOwner[o], killEvent{rec: r, phase: a.phaseOfRecord(r)})
	}
	var out []Finding
	for _, o := range order {
		out = append(out, a.oomKill(o, byOwner[o]))
	}
	// Without the tracer's events (it did not attach, or its ring overflowed), the cgroup
	// sampler's counters still tell that a workload lost processes.
	for _, w := range a.run.Meta.Workloads {
		if _, ok := byOwner[w.Cgroup]; ok || a.underNode(w.Cgroup) && byOwner[a.nodeCgroup()] != nil {
			continue
		}
		n := a.run.Series(rundir.MetricOOMKills).Cgroup(w.Cgroup).Delta(a.run.Span())
		if n == 0 {
			n = a.run.Series(rundir.MetricMemoryOOMKills).Cgroup(w.Cgroup).Delta(a.run.Span())
		}
		if n > 0 {
			out = append(out, Finding{ID: IDOOMKill, Severity: SeverityCritical, Victim: w.Name, Culprits: []string{},
				Summary: fmt.Sprintf("the OOM killer killed %.0f of %s's processes in the run (which ones is not recorded: "+
					"the reclaim tracer's kill events are missing).", n, w.Name),
				Evidence: []Evidence{{Metric: "oom_kills", Workload: w.Name, Phase: a.run.Span().Name, Value: n, Unit: UnitCount}}})
		}
	}
	return out
}

// oomKill is the finding for the kills of owner's processes.
func (a *analysis) oomKill(owner string, kills []killEvent) Finding {
	victim := a.name(owner)
	f := Finding{ID: IDOOMKill, Severity: SeverityCritical, Victim: victim, Culprits: []string{}}
	var procs []string
	limits := map[string]bool{}
	for _, k := range kills {
		l := k.rec.Labels
		where := k.phase
		if w := a.owner(k.rec.Cgroup); w != owner {
			where = a.name(w) + ", " + where // a sandbox of the emulated node
		}
		procs = append(procs, fmt.Sprintf("%s (pid %s, in %s)", l[rundir.LabelOOMComm], l[rundir.LabelOOMPID], where))
		limits[l[rundir.LabelOOMLimitCgroup]] = true
	}
	f.Evidence = append(f.Evidence, Evidence{Metric: "oom_kills", Workload: victim, Phase: kills[0].phase,
		Value: float64(len(kills)), Unit: UnitCount})
	last := kills[len(kills)-1].rec.Labels
	var cause string
	switch lc := last[rundir.LabelOOMLimitCgroup]; {
	case lc == "":
		cause = "The node itself ran out of memory (no cgroup's limit was hit)"
		f.Culprits = a.biggestUsers(owner, "/")
	case a.owner(lc) == owner:
		cause = fmt.Sprintf("Its own memory limit was hit (%s of %s)", fmtBytesLabel(last[rundir.LabelOOMUsage]),
			fmtBytesLabel(last[rundir.LabelOOMLimit]))
		if w := a.workloadByCgroup(owner); w != nil && w.Memory != "" {
			cause += ", limit " + w.Memory
		}
		cause += ": its working set does not fit. Raise its memory limit or shrink its working set"
	default:
		cause = fmt.Sprintf("The memory limit of %s, above it, was hit (%s of %s): what runs under that limit "+
			"together did not fit", a.name(lc), fmtBytesLabel(last[rundir.LabelOOMUsage]), fmtBytesLabel(last[rundir.LabelOOMLimit]))
		f.Culprits = a.biggestUsers(owner, lc)
	}
	for _, k := range []string{rundir.LabelOOMUsage, rundir.LabelOOMLimit} {
		var v float64
		if _, err := fmt.Sscan(last[k], &v); err == nil {
			f.Evidence = append(f.Evidence, Evidence{Metric: "oom_" + strings.TrimSuffix(k, "_bytes") + "_bytes",
				Workload: a.name(last[rundir.LabelOOMLimitCgroup]), Phase: kills[len(kills)-1].phase, Value: v, Unit: UnitBytes})
		}
	}
	if len(f.Culprits) > 0 {
		cause += "; the largest users of that memory were " + joinNames(f.Culprits)
	}
	what := "process" //rundir:other
	if len(procs) > 1 {
		what = "processes"
	}
	f.Summary = fmt.Sprintf("The OOM killer killed %s's %s %s. %s.", victim, what, joinNames(procs), cause)
	return f
}

// biggestUsers names the workloads (other than owner's) below limit with the highest memory usage
// reading in the run, the largest and those near it, as culprits.
func (a *analysis) biggestUsers(owner, limit string) []string {
	var shares []share
	for _, w := range a.run.Meta.Workloads {
		if w.Cgroup == owner || !within(w.Cgroup, limit) {
			continue
		}
		if vs := a.run.Series(rundir.MetricMemoryUsage).Cgroup(w.Cgroup).Values(a.run.Span()); len(vs) > 0 {
			shares = append(shares, share{cgroup: w.Cgroup, value: slices.Max(vs)})
		}
	}
	var out []string
	for _, c := range culprits(shares) {
		out = append(out, a.name(c.cgroup))
	}
	return out
}

// workloadByCgroup is the workload whose cgroup is cgroup, nil if none.
func (a *analysis) workloadByCgroup(cgroup string) *rundir.Workload {
	for i, w := range a.run.Meta.Workloads {
		if w.Cgroup == cgroup {
			return &a.run.Meta.Workloads[i]
		}
	}
	return nil
}

// phaseOfRecord names the window r happened in: the first that holds it, else the whole run's.
func (a *analysis) phaseOfRecord(r rundir.Record) string {
	for _, w := range a.windows {
		if r.Time.After(w.Start) && !r.Time.After(w.End) {
			return w.Name
		}
	}
	return a.run.Span().Name
}

// fmtBytesLabel formats a byte count carried as a label value.
func fmtBytesLabel(s string) string {
	var v float64
	if _, err := fmt.Sscan(s, &v); err != nil {
		return "?"
	}
	return human.Bytes(v)
}
