package analyzer

import (
	"fmt"
	"slices"
	"strings"

	"github.com/nodectl/nodectl/agent/hist"
	"github.com/nodectl/nodectl/agent/record"
)

// Thresholds of the rules; docs/findings.md explains each.
const (
	// criticalSlowdown: a victim this many times slower than in its baseline is critical.
	criticalSlowdown = 2.0
	// culpritMinShare: a neighbour is named a culprit if it holds this share of what all
	// neighbours caused (wait or bytes).
	culpritMinShare = 0.10

	// cpu-contention.
	runqRiseFactor          = 2.0   // run-queue p99, mean or wait a second, stress over baseline
	cpuWorkRiseFactor       = 1.2   // probe CPU-work p50, stress over baseline
	neighbourWaitMinShare   = 0.25  // neighbours' share of the victim's attributed waits
	neighbourWaitMinSeconds = 0.010 // less wait added by neighbours is noise

	// cpu-throttling.
	throttledPeriodsMinShare = 0.20 // throttled share of the CFS periods the victim ran in
	throttledPeriodsMin      = 3    // fewer throttled periods is noise
	throttledWallMinShare    = 0.10 // throttled time over the window's wall time,
	throttledUsageMinShare   = 0.50 // or over the CPU time the victim used

	// disk-contention.
	fsyncRiseFactor     = 1.5      // fsync p95, stress over baseline
	fsyncMinRiseSeconds = 0.005    // smaller rises of the p95 are noise
	neighbourBytesMin   = 16 << 20 // block I/O neighbours added on the device in the stress phase
	// neighbourDeviceShareMin: the neighbours' share of the data moved on the device in the
	// stress phase. Below it the device mostly served the victim, and a slower fsync has
	// another cause (a CPU-starved victim or journal thread, say).
	neighbourDeviceShareMin = 0.2
)

// cpuContention: neighbours preempted the victim (docs/findings.md).
func (a *analysis) cpuContention(v record.Workload) *Finding {
	if !a.compare {
		return nil
	}
	runq := a.run.Series(record.MetricRunqLatency).Cgroup(v.Cgroup)
	rb, rs := runq.HistDelta(a.baseline), runq.HistDelta(a.stress)
	p99b, p99s := rb.Quantile(0.99), rs.Quantile(0.99)
	// The wait a second counts too: a throttled victim already waits out the rest of its CFS
	// periods in the baseline, which sets its p99, and its mean is over hundreds of short waits a
	// second. Neighbours that keep it under its quota replace those long waits with many more
	// of their own, and the total shows it when p99 and mean may not.
	perSecB, perSecS := ratio(secs(rb.SumNs), a.baseline.Seconds()), ratio(secs(rs.SumNs), a.stress.Seconds())
	latencyRose := ratio(p99s, p99b) >= runqRiseFactor || ratio(rs.Mean(), rb.Mean()) >= runqRiseFactor ||
		ratio(perSecS, perSecB) >= runqRiseFactor

	work := a.run.Series(record.MetricProbeCPUWork).Cgroup(v.Cgroup)
	wb, ws := work.Values(a.baseline), work.Values(a.stress)
	workB, workS := quantile(wb, 0.5), quantile(ws, 0.5)
	slowdown := ratio(workS, workB)
	workRose := len(wb) > 0 && len(ws) > 0 && slowdown >= cpuWorkRiseFactor

	pw := a.preemptions(v.Cgroup)
	shareS := ratio(pw.neighbourS, pw.attributedS)
	if !latencyRose || !workRose || pw.added < neighbourWaitMinSeconds || shareS < neighbourWaitMinShare {
		return nil
	}

	f := &Finding{
		ID: IDCPUContention, Severity: severity(slowdown), Victim: v.Name,
		Evidence: []Evidence{
			a.evidence("runq_latency_p99", v.Name, p99b, p99s, UnitSeconds),
			a.evidence("runq_latency_mean", v.Name, rb.Mean(), rs.Mean(), UnitSeconds),
			a.evidence("runq_latency_max_at_least", v.Name, rb.LongestAtLeast(), rs.LongestAtLeast(), UnitSeconds),
			a.evidence("runq_wait_seconds", v.Name, secs(rb.SumNs), secs(rs.SumNs), UnitSeconds),
			a.evidence("runq_wait_per_second", v.Name, perSecB, perSecS, UnitRatio),
			a.evidence("probe_cpu_work_p50", v.Name, workB, workS, UnitSeconds),
			a.evidence("runq_neighbour_wait_share", v.Name, ratio(pw.neighbourB, pw.attributedB), shareS, UnitRatio),
		},
	}
	a.blame(f, v.Name, pw)
	f.Summary = fmt.Sprintf("%s's CPU work took %s longer (p50 %s → %s) because %s preempted it: "+
		"neighbours account for %s of its waits after a preemption, its tasks waited %s → %s of every second "+
		"and its run-queue p99 went %s → %s. "+
		"A CPU limit caps a neighbour but reserves nothing for the victim: give the victim a larger "+
		"CPU request (weight) or dedicated cores, or move or limit the culprits.",
		v.Name, factor(slowdown), fmtSeconds(workB), fmtSeconds(workS), joinNames(f.Culprits),
		fmtPercent(shareS), fmtSeconds(perSecB), fmtSeconds(perSecS), fmtSeconds(p99b), fmtSeconds(p99s))
	if longest := rs.LongestAtLeast(); longest >= stallMinSeconds && longest >= stallOverP99*p99s {
		f.Summary += fmt.Sprintf(" One wait lasted at least %s, far beyond any fair share: a stall, which the total wait above includes.", fmtSeconds(longest))
	}
	return f
}

// A single wait of at least stallMinSeconds and stallOverP99 times the p99 is called out in
// cpu-contention's summary: fair sharing at any weight does not keep a task off the CPU that
// long, and the p99 hides it.
const (
	stallMinSeconds = 1.0
	stallOverP99    = 10.0
)

// preemptionWaits is how a cgroup's run-queue waits split between its neighbours and the rest
// (its own tasks, its quota, an idle CPU, kernel threads), in the baseline (B) and stress (S)
// phases. A wait is charged to whoever preempted the task, or, for a task that woke up on a
// busy CPU, to whatever ran there just before it.
type preemptionWaits struct {
	waits                    map[string]record.SeriesSet // by preemptor: seconds, preempted and woken
	preempted, woken         map[string]record.SeriesSet // by preemptor: seconds of each kind
	preemptions, wakeups     map[string]record.SeriesSet // by preemptor: how many waits of each kind
	neighbours               []share                     // wait each neighbour added over its baseline rate
	added                    float64                     // the sum of that
	neighbourB, neighbourS   float64
	attributedB, attributedS float64
}

// preemptions splits the waits of cgroup by preemptor. Neighbours are every preemptor but the
// cgroup's own quota, its own tasks and kernel threads (system work, not a neighbour). A
// neighbour is charged what it added over its baseline rate: a steady background preemptor
// explains no rise.
func (a *analysis) preemptions(cgroup string) preemptionWaits {
	// Preemptors below a workload's cgroup are that workload.
	byPreemptor := func(metric string) map[string]record.SeriesSet {
		out := map[string]record.SeriesSet{}
		for p, ss := range a.run.Series(metric).Cgroup(cgroup).ByLabel(record.LabelPreemptor) {
			out[a.owner(p)] = append(out[a.owner(p)], ss...)
		}
		return out
	}
	pw := preemptionWaits{
		preempted:   byPreemptor(record.MetricRunqPreemptWait),
		woken:       byPreemptor(record.MetricRunqWakeupWait),
		preemptions: byPreemptor(record.MetricRunqPreemptions),
		wakeups:     byPreemptor(record.MetricRunqWakeupWaits),
	}
	pw.waits = merge(pw.preempted, pw.woken)
	for preemptor, ss := range pw.waits {
		b, s := ss.Delta(a.baseline), ss.Delta(a.stress)
		pw.attributedB += b
		pw.attributedS += s
		if preemptor == record.CgroupIdle || preemptor == record.CgroupThrottled || preemptor == record.CgroupKernel || within(preemptor, cgroup) {
			continue
		}
		pw.neighbourB += b
		pw.neighbourS += s
		more := a.added(b, s)
		pw.neighbours = append(pw.neighbours, share{cgroup: preemptor, value: more})
		pw.added += more
	}
	return pw
}

// blame names the culprits among pw's neighbours in f, with each one's waits and their count as
// evidence charged to victim.
func (a *analysis) blame(f *Finding, victim string, pw preemptionWaits) {
	for _, c := range culprits(pw.neighbours) {
		n := a.name(c.cgroup)
		f.Culprits = append(f.Culprits, n)
		for _, e := range []Evidence{
			a.evidence("runq_preempt_wait_seconds", victim, pw.preempted[c.cgroup].Delta(a.baseline), pw.preempted[c.cgroup].Delta(a.stress), UnitSeconds),
			a.evidence("runq_wakeup_wait_seconds", victim, pw.woken[c.cgroup].Delta(a.baseline), pw.woken[c.cgroup].Delta(a.stress), UnitSeconds),
			a.evidence("runq_preemptions", victim, pw.preemptions[c.cgroup].Delta(a.baseline), pw.preemptions[c.cgroup].Delta(a.stress), UnitCount),
			a.evidence("runq_wakeup_waits", victim, pw.wakeups[c.cgroup].Delta(a.baseline), pw.wakeups[c.cgroup].Delta(a.stress), UnitCount),
		} {
			e.Culprit = n
			f.Evidence = append(f.Evidence, e)
		}
	}
}

// merge joins two groupings of series by the same key.
func merge(a, b map[string]record.SeriesSet) map[string]record.SeriesSet {
	out := make(map[string]record.SeriesSet, len(a)+len(b))
	for k, v := range a {
		out[k] = append(out[k], v...)
	}
	for k, v := range b {
		out[k] = append(out[k], v...)
	}
	return out
}

// cpuThrottling: the victim's own CPU quota stopped it, in any phase (docs/findings.md).
func (a *analysis) cpuThrottling(v record.Workload) *Finding {
	type throttle struct {
		w                                  record.Window
		periods, throttled, seconds, usage float64
	}
	measure := func(w record.Window) throttle {
		delta := func(metric string) float64 { return a.run.Series(metric).Cgroup(v.Cgroup).Delta(w) }
		return throttle{w: w, periods: delta(record.MetricCPUPeriods), throttled: delta(record.MetricCPUThrottled),
			seconds: delta(record.MetricCPUThrottledTime), usage: delta(record.MetricCPUUsage)}
	}
	var hit []throttle
	for _, w := range a.windows {
		t := measure(w)
		if t.throttled >= throttledPeriodsMin && ratio(t.throttled, t.periods) >= throttledPeriodsMinShare &&
			(ratio(t.seconds, w.Seconds()) >= throttledWallMinShare || ratio(t.seconds, t.usage) >= throttledUsageMinShare) {
			hit = append(hit, t)
		}
	}
	if len(hit) == 0 {
		return nil
	}

	// Report the stress phase against the baseline when both exist, else the worst window.
	worst := hit[0]
	for _, t := range hit[1:] {
		if ratio(t.seconds, t.w.Seconds()) > ratio(worst.seconds, worst.w.Seconds()) {
			worst = t
		}
	}
	shown, ref := worst, throttle{}
	if a.compare {
		shown, ref = measure(a.stress), measure(a.baseline)
	}
	// The summary quotes a window the quota held the victim back in. When the stress phase is
	// not one (neighbours kept the victim under its quota there), it says so rather than
	// blaming the quota for whatever slowed the victim in stress.
	quoted, stressNote := shown, ""
	if a.compare && !slices.ContainsFunc(hit, func(t throttle) bool { return t.w.Name == a.stress.Name }) {
		quoted = worst
		stressNote = fmt.Sprintf(" In %s it was throttled in only %s of its periods: its quota did not hold it back there.",
			shown.w.Name, fmtPercent(ratio(shown.throttled, shown.periods)))
	}
	slowdown := 0.0 // if it had run instead of waiting: (used + throttled) / used
	for _, t := range hit {
		slowdown = max(slowdown, ratio(t.usage+t.seconds, t.usage))
	}
	ev := func(metric string, b, s float64, unit string) Evidence {
		return Evidence{Metric: metric, Workload: v.Name, Phase: shown.w.Name, Baseline: b, Value: s, Unit: unit}
	}
	var where []string
	for i, t := range hit {
		of := ""
		if i == 0 {
			of = " of its CFS periods"
		}
		where = append(where, fmt.Sprintf("%s%s in %s", fmtPercent(ratio(t.throttled, t.periods)), of, t.w.Name))
	}
	limit := ""
	if v.CPU != "" {
		limit = " (limit " + v.CPU + ")"
	}
	return &Finding{
		ID: IDCPUThrottling, Severity: severity(slowdown), Victim: v.Name, Culprits: []string{},
		Summary: fmt.Sprintf("%s's own CPU quota%s throttled it in %s, %s throttled against %s of CPU used "+
			"in %s: its limit, not its neighbours, slows it. Raise or remove its CPU limit.%s",
			v.Name, limit, joinNames(where), fmtSeconds(quoted.seconds), fmtSeconds(quoted.usage), quoted.w.Name, stressNote),
		Evidence: []Evidence{
			ev("cpu_throttled_period_ratio", ratio(ref.throttled, ref.periods), ratio(shown.throttled, shown.periods), UnitRatio),
			ev("cpu_throttled_periods", ref.throttled, shown.throttled, UnitCount),
			ev("cpu_throttled_seconds", ref.seconds, shown.seconds, UnitSeconds),
			ev("cpu_usage_seconds", ref.usage, shown.usage, UnitSeconds),
		},
	}
}

// diskContention: the victim's fsyncs slowed while neighbours loaded its device
// (docs/findings.md).
func (a *analysis) diskContention(v record.Workload) *Finding {
	if !a.compare {
		return nil
	}
	fsyncs := a.run.Series(record.MetricFsyncLatency).Cgroup(v.Cgroup)
	device := v.Device
	if device == "" {
		device = busiestDevice(fsyncs, a.stress)
	}
	if device == "" {
		return nil // nothing says which device the victim writes to
	}
	probe := a.run.Series(record.MetricProbeFsync).Cgroup(v.Cgroup)
	pb, ps := probe.Values(a.baseline), probe.Values(a.stress)
	tb, ts := fsyncs.HistDelta(a.baseline), fsyncs.HistDelta(a.stress)

	// The probe times every fsync itself; without it, the tracer's histogram decides.
	var before, after float64
	var evidence []Evidence
	switch {
	case len(pb) > 0 && len(ps) > 0:
		before, after = quantile(pb, 0.95), quantile(ps, 0.95)
	case tb.Count > 0 && ts.Count > 0:
		before, after = tb.Quantile(0.95), ts.Quantile(0.95)
	default:
		return nil
	}
	if len(pb) > 0 || len(ps) > 0 {
		evidence = append(evidence, a.evidence("probe_fsync_p95", v.Name, quantile(pb, 0.95), quantile(ps, 0.95), UnitSeconds))
	}
	if tb.Count > 0 || ts.Count > 0 {
		evidence = append(evidence, a.evidence("fsync_latency_p95", v.Name, tb.Quantile(0.95), ts.Quantile(0.95), UnitSeconds))
	}
	slowdown := ratio(after, before)
	if slowdown < fsyncRiseFactor || after-before < fsyncMinRiseSeconds {
		return nil
	}

	// As for CPU, a culprit is charged the I/O it added over its baseline rate.
	bytes := dataBytes(a.run).Label(record.LabelDevice, device).ByCgroup()
	var neighbours []share
	var added, neighbourBytes float64
	for cg, ss := range bytes {
		if within(cg, v.Cgroup) {
			continue
		}
		b, s := ss.Delta(a.baseline), ss.Delta(a.stress)
		more := a.added(b, s)
		neighbours = append(neighbours, share{cgroup: cg, value: more})
		added += more
		neighbourBytes += s
	}
	own := bytes[v.Cgroup]
	if added < neighbourBytesMin || ratio(neighbourBytes, neighbourBytes+own.Delta(a.stress)) < neighbourDeviceShareMin {
		return nil
	}

	f := &Finding{ID: IDDiskContention, Severity: severity(slowdown), Victim: v.Name, Evidence: evidence}
	for _, c := range culprits(neighbours) {
		n := a.name(c.cgroup)
		f.Culprits = append(f.Culprits, n)
		e := a.evidence("blk_bytes", v.Name, bytes[c.cgroup].Delta(a.baseline), bytes[c.cgroup].Delta(a.stress), UnitBytes)
		e.Culprit, e.Device = n, device
		f.Evidence = append(f.Evidence, e)
	}
	e := a.evidence("blk_bytes", v.Name, own.Delta(a.baseline), own.Delta(a.stress), UnitBytes)
	e.Device = device
	f.Evidence = append(f.Evidence, e)
	where := a.queueOrService(device, f)
	f.Summary = fmt.Sprintf("%s's fsync p95 rose %s (%s → %s) while %s issued most of the neighbours' %s of I/O on device %s%s. "+
		"Move the victim's or the neighbours' data to another disk, or cap the neighbours' I/O "+
		"(io.max / blkio throttle) or weight it below the victim's.",
		v.Name, factor(slowdown), fmtSeconds(before), fmtSeconds(after), joinNames(f.Culprits),
		fmtBytes(neighbourBytes), device, where)
	return f
}

// busiestDevice is the device label with the most fsyncs in w.
func busiestDevice(fsyncs record.SeriesSet, w record.Window) string {
	best, bestCount := "", uint64(0)
	for dev, ss := range fsyncs.ByLabel(record.LabelDevice) {
		if c := ss.HistDelta(w).Count; dev != "" && (c > bestCount || c == bestCount && dev < best) {
			best, bestCount = dev, c
		}
	}
	return best
}

// queueOrService adds the device-wide block queue and service time evidence to f and returns a
// clause saying which grew more: time waiting in the I/O scheduler behind other requests, or
// time the device took to serve them.
func (a *analysis) queueOrService(device string, f *Finding) string {
	deviceWide := func(metric string) (b, s hist.Log2) {
		ss := a.run.Series(metric).Label(record.LabelDevice, device)
		return ss.HistDelta(a.baseline), ss.HistDelta(a.stress)
	}
	qb, qs := deviceWide(record.MetricBlkQueue)
	sb, ss := deviceWide(record.MetricBlkService)
	if qs.Count == 0 && ss.Count == 0 {
		return ""
	}
	for _, e := range []Evidence{
		a.evidence("blk_queue_p95", "", qb.Quantile(0.95), qs.Quantile(0.95), UnitSeconds),
		a.evidence("blk_queue_mean", "", qb.Mean(), qs.Mean(), UnitSeconds),
		a.evidence("blk_service_p95", "", sb.Quantile(0.95), ss.Quantile(0.95), UnitSeconds),
		a.evidence("blk_service_mean", "", sb.Mean(), ss.Mean(), UnitSeconds),
	} {
		e.Device = device
		f.Evidence = append(f.Evidence, e)
	}
	queue, service := ratio(qs.Mean(), qb.Mean()), ratio(ss.Mean(), sb.Mean())
	switch {
	case queue > service && queue > 1:
		return fmt.Sprintf("; on the device, queue time grew more than service time (mean %s → %s against %s → %s): "+
			"the victim's requests waited behind the neighbours' I/O", fmtSeconds(qb.Mean()), fmtSeconds(qs.Mean()),
			fmtSeconds(sb.Mean()), fmtSeconds(ss.Mean()))
	case service > 1:
		return fmt.Sprintf("; on the device, service time grew more than queue time (mean %s → %s against %s → %s): "+
			"the device itself slowed under the load", fmtSeconds(sb.Mean()), fmtSeconds(ss.Mean()),
			fmtSeconds(qb.Mean()), fmtSeconds(qs.Mean()))
	}
	return ""
}

// added is how much more of something happened in the stress phase than the baseline's rate
// predicts for a phase that long: what the stress phase added.
func (a *analysis) added(baseline, stress float64) float64 {
	scale := 0.0
	if a.baseline.Seconds() > 0 {
		scale = a.stress.Seconds() / a.baseline.Seconds()
	}
	return max(0, stress-baseline*scale)
}

// evidence is a measure of the stress phase against the baseline phase.
func (a *analysis) evidence(metric, workload string, baseline, value float64, unit string) Evidence {
	return Evidence{Metric: metric, Workload: workload, Phase: a.stress.Name, Baseline: baseline, Value: value, Unit: unit}
}

func secs(ns uint64) float64 { return float64(ns) / 1e9 }

// joinNames lists names as "a", "a and b", "a, b and c".
func joinNames(names []string) string {
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}
