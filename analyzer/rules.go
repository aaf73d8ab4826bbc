package analyzer

import (
	"fmt"
	"slices"
	"strings"

	"github.com/nodectl/nodectl/internal/human"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

// Thresholds of the rules; docs/findings.md explains each.
const (
	// criticalSlowdown: a victim this many times slower than in its baseline is critical.
	criticalSlowdown = 2.0
	// culpritMinShare: a neighbour is named a culprit if it holds this share of what all
	// neighbours caused (wait or bytes).
	culpritMinShare = 0.10

	// cpu-contention.
	neighbourWaitMinShare   = 0.25  // neighbours' share of the victim's attributed waits
	neighbourWaitMinSeconds = 0.010 // less wait added by neighbours is noise
	// causeCoverMin: the time a cause added (the wait neighbours added, the reclaim stalls),
	// summed over the victim's threads, must be at least this share of the time its probe lost
	// for that cause to explain the loss.
	causeCoverMin = 0.5

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

// cpuContention: neighbours preempted the victim, and it got slower: its CPU work, or its I/O
// when its device does not explain that (docs/findings.md).
func (a *analysis) cpuContention(v rundir.Workload) *Finding {
	if !a.compare {
		return nil
	}
	cw := a.cpuWaits(v.Cgroup)
	if !cw.byNeighbours() {
		return nil
	}
	rb, rs, pw := cw.rb, cw.rs, cw.pw
	// What got slower: its CPU work, and its I/O when the device does not explain that (the
	// write and fsync path waited for a CPU too). The neighbours' added wait, summed over the
	// victim's threads, must account for the time its probe lost: else something else (memory
	// bandwidth, interrupts) did most of it.
	vv := a.victim(v)
	cpuWork := vv.slowed(measureCPUWork)
	var viaIO []probeChange
	if !vv.disk.explains() {
		viaIO = vv.slowedIO()
	}
	// All of them if the wait covers their loss, else the CPU work or the I/O alone (the I/O
	// with the wait less what the CPU work took of it: spentBeside).
	var affected []probeChange
	for _, cs := range [][]probeChange{append(slices.Clone(cpuWork), viaIO...), cpuWork, viaIO} {
		if len(cs) > 0 && cw.covers(lost(cs), vv.spentBeside(cs)) {
			affected = cs
			break
		}
	}
	if len(affected) == 0 {
		return nil
	}
	viaIO = slices.DeleteFunc(slices.Clone(affected), isCPUWork)

	f := &Finding{
		ID: IDCPUContention, Victim: v.Name,
		Evidence: []Evidence{
			a.evidence("runq_latency_p99", v.Name, rb.Quantile(0.99), rs.Quantile(0.99), UnitSeconds),
			a.evidence("runq_latency_mean", v.Name, rb.Mean(), rs.Mean(), UnitSeconds),
			a.evidence("runq_latency_max_at_least", v.Name, rb.LongestAtLeast(), rs.LongestAtLeast(), UnitSeconds),
			a.evidence("runq_wait_seconds", v.Name, secs(rb.SumNs), secs(rs.SumNs), UnitSeconds),
			a.evidence("runq_wait_per_second", v.Name, cw.perSecB, cw.perSecS, UnitRatio),
			a.evidence("runq_neighbour_wait_share", v.Name, ratio(pw.neighbourB, pw.attributedB), cw.share, UnitRatio),
			a.evidence("probe_delay_seconds", v.Name, vv.delayB, vv.delayS, UnitSeconds),
			a.evidence("runq_wait_outside_probe_seconds", v.Name, max(0, secs(rb.SumNs)-vv.delayB), max(0, secs(rs.SumNs)-vv.delayS), UnitSeconds),
		},
	}
	if c, ok := vv.change(measureCPUWork); ok && !c.slowed() {
		f.Evidence = append(f.Evidence, a.evidence("probe_cpu_work_p50", v.Name, c.p50B, c.p50S, UnitSeconds))
	}
	slowdown, symptoms := a.affects(f, v.Name, affected)
	f.Severity = severity(slowdown)
	if len(viaIO) > 0 {
		f.Evidence = append(f.Evidence, vv.disk.evidence(a, v.Name)...)
	}
	a.blame(f, v.Name, pw)
	f.Summary = fmt.Sprintf("%s got slower because %s held its CPU: %s. "+
		"Neighbours account for %s of its waits after a preemption, its tasks waited %s → %s of every second "+
		"and its run-queue p99 went %s → %s.",
		v.Name, joinNames(f.Culprits), symptoms, human.Percent(cw.share), human.Seconds(cw.perSecB), human.Seconds(cw.perSecS),
		human.Seconds(rb.Quantile(0.99)), human.Seconds(rs.Quantile(0.99)))
	if len(viaIO) > 0 {
		f.Summary += fmt.Sprintf(" Its %s slowed though its device does not explain it (%s): the I/O path waited for a CPU, not for the disk.",
			joinNames(measureLabels(viaIO)), vv.disk.whyNot())
	}
	if v.Runtime == rundir.RuntimeRunsc {
		f.Summary += fmt.Sprintf(" In its gVisor sandbox the run-queue wait is summed over the Sentry's, gofer's and stubs' threads: "+
			"of its %s, the probe's own operations took %s longer than their baseline medians; the other %s or so were "+
			"sandbox threads waiting off the workload's timed path, a cost in CPU more than in its latency.",
			human.Seconds(secs(rs.SumNs)), human.Seconds(vv.delayS), human.Seconds(max(0, secs(rs.SumNs)-vv.delayS)))
	}
	if longest := rs.LongestAtLeast(); longest >= stallMinSeconds && longest >= stallOverP99*rs.Quantile(0.99) {
		f.Summary += fmt.Sprintf(" One wait lasted at least %s, far beyond any fair share: a stall, which the total wait above includes.", human.Seconds(longest))
	}
	f.Summary += " A CPU limit caps a neighbour but reserves nothing for the victim: give the victim a larger " +
		"CPU request (weight) or dedicated cores, or move or limit the culprits."
	return f
}

// isCPUWork: c is the change of the probe's CPU work.
func isCPUWork(c probeChange) bool { return c.measure == measureCPUWork }

// cpuWaits is what the run queue says of a cgroup's tasks from the baseline to the stress
// phase: their waits, and who they waited behind.
type cpuWaits struct {
	rb, rs           hist.Log2 // run-queue latency
	perSecB, perSecS float64   // wait a second of the phase
	pw               preemptionWaits
	share            float64 // the neighbours' share of the attributed wait in stress
	// added is how much more its tasks waited in all, over the baseline's rate: neighbours
	// that only took turns from its own threads or its quota made it wait no longer.
	added float64
}

func (a *analysis) cpuWaits(cgroup string) cpuWaits {
	runq := a.run.Series(rundir.MetricRunqLatency).Cgroup(cgroup)
	c := cpuWaits{rb: runq.HistDelta(a.baseline), rs: runq.HistDelta(a.stress), pw: a.preemptions(cgroup)}
	c.perSecB, c.perSecS = ratio(secs(c.rb.SumNs), a.baseline.Seconds()), ratio(secs(c.rs.SumNs), a.stress.Seconds())
	c.share = ratio(c.pw.neighbourS, c.pw.attributedS)
	c.added = a.added(secs(c.rb.SumNs), secs(c.rs.SumNs))
	return c
}

// byNeighbours: neighbours made the tasks wait, more than in the baseline and for a good share
// of their attributed waits.
func (c cpuWaits) byNeighbours() bool {
	return c.pw.added >= neighbourWaitMinSeconds && c.share >= neighbourWaitMinShare
}

// covers: the wait the neighbours added, and the rise of all its waiting, each less spent (wait
// that delayed another measure), account for lost seconds of the probe's time.
func (c cpuWaits) covers(lost, spent float64) bool {
	return accountsFor(min(c.pw.added, c.added)-spent, lost)
}

// whyNot says why the CPU does not explain lost seconds of the probe's time, spent of the wait
// having delayed the CPU work.
func (c cpuWaits) whyNot(lost, spent float64) string {
	if !c.byNeighbours() {
		return fmt.Sprintf("neighbours added %s of run-queue wait, %s of its attributed waits", human.Seconds(c.pw.added), human.Percent(c.share))
	}
	less := ""
	if spent > 0 {
		less = fmt.Sprintf(", less the %s its CPU work lost,", human.Seconds(spent))
	}
	return fmt.Sprintf("the wait neighbours added (%s) or its run-queue wait's rise (%s)%s is not half the %s it lost",
		human.Seconds(c.pw.added), human.Seconds(c.added), less, human.Seconds(lost))
}

// affects records in f the victim's measures a cause slowed: their keys in Affects and their
// evidence. It returns the largest slowdown among them and a sentence part describing each.
func (a *analysis) affects(f *Finding, victim string, changes []probeChange) (float64, string) {
	var slowdown float64
	var parts []string
	for _, c := range changes {
		f.Affects = append(f.Affects, c.measure.key)
		f.Evidence = append(f.Evidence, c.evidence(a, victim)...)
		slowdown = max(slowdown, c.slowdown())
		parts = append(parts, c.describe())
	}
	return slowdown, strings.Join(parts, "; ")
}

// measureLabels names the measures of changes for a person.
func measureLabels(changes []probeChange) []string {
	out := make([]string, len(changes))
	for i, c := range changes {
		out[i] = c.measure.label
	}
	return out
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
	waits                    map[string]rundir.SeriesSet // by preemptor: seconds, preempted and woken
	preempted, woken         map[string]rundir.SeriesSet // by preemptor: seconds of each kind
	preemptions, wakeups     map[string]rundir.SeriesSet // by preemptor: how many waits of each kind
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
	byPreemptor := func(metric string) map[string]rundir.SeriesSet {
		out := map[string]rundir.SeriesSet{}
		for p, ss := range a.run.Series(metric).Cgroup(cgroup).ByLabel(rundir.LabelPreemptor) {
			out[a.owner(p)] = append(out[a.owner(p)], ss...)
		}
		return out
	}
	pw := preemptionWaits{
		preempted:   byPreemptor(rundir.MetricRunqPreemptWait),
		woken:       byPreemptor(rundir.MetricRunqWakeupWait),
		preemptions: byPreemptor(rundir.MetricRunqPreemptions),
		wakeups:     byPreemptor(rundir.MetricRunqWakeupWaits),
	}
	pw.waits = merge(pw.preempted, pw.woken)
	for preemptor, ss := range pw.waits {
		b, s := ss.Delta(a.baseline), ss.Delta(a.stress)
		pw.attributedB += b
		pw.attributedS += s
		if preemptor == rundir.CgroupIdle || preemptor == rundir.CgroupThrottled || preemptor == rundir.CgroupKernel || within(preemptor, cgroup) {
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
func merge(a, b map[string]rundir.SeriesSet) map[string]rundir.SeriesSet {
	out := make(map[string]rundir.SeriesSet, len(a)+len(b))
	for k, v := range a {
		out[k] = append(out[k], v...)
	}
	for k, v := range b {
		out[k] = append(out[k], v...)
	}
	return out
}

// cpuThrottling: the victim's own CPU quota stopped it, in any phase (docs/findings.md).
func (a *analysis) cpuThrottling(v rundir.Workload) *Finding {
	type throttle struct {
		w                                  rundir.Window
		periods, throttled, seconds, usage float64
	}
	measure := func(w rundir.Window) throttle {
		delta := func(metric string) float64 { return a.run.Series(metric).Cgroup(v.Cgroup).Delta(w) }
		return throttle{w: w, periods: delta(rundir.MetricCPUPeriods), throttled: delta(rundir.MetricCPUThrottled),
			seconds: delta(rundir.MetricCPUThrottledTime), usage: delta(rundir.MetricCPUUsage)}
	}
	// A share of no periods is none: the sampler read the periods and the throttled periods
	// at different samples (a cgroup's slow tier in rotation), or the window caught neither.
	share := func(t throttle) float64 {
		if t.periods <= 0 {
			return 0
		}
		return t.throttled / t.periods
	}
	var hit []throttle
	for _, w := range a.windows {
		t := measure(w)
		if t.throttled >= throttledPeriodsMin && share(t) >= throttledPeriodsMinShare &&
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
			shown.w.Name, human.Percent(share(shown)))
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
		where = append(where, fmt.Sprintf("%s%s in %s", human.Percent(share(t)), of, t.w.Name))
	}
	limit := ""
	if v.CPU != "" {
		limit = " (limit " + v.CPU + ")"
	}
	f := &Finding{
		ID: IDCPUThrottling, Severity: severity(slowdown), Victim: v.Name, Culprits: []string{},
		Summary: fmt.Sprintf("%s's own CPU quota%s throttled it in %s, %s throttled against %s of CPU used "+
			"in %s: its limit, not its neighbours, slows it. Raise or remove its CPU limit.%s",
			v.Name, limit, joinNames(where), human.Seconds(quoted.seconds), human.Seconds(quoted.usage), quoted.w.Name, stressNote),
		Evidence: []Evidence{
			ev("cpu_throttled_period_ratio", share(ref), share(shown), UnitRatio),
			ev("cpu_throttled_periods", ref.throttled, shown.throttled, UnitCount),
			ev("cpu_throttled_seconds", ref.seconds, shown.seconds, UnitSeconds),
			ev("cpu_usage_seconds", ref.usage, shown.usage, UnitSeconds),
		},
	}
	// Throttled more in the stress phase, the victim's CPU work lost time to its own quota
	// when the throttled time added accounts for that loss.
	if a.compare && v.Kind == rundir.KindVictim {
		if work := a.victim(v).slowed(measureCPUWork); len(work) > 0 && accountsFor(a.added(ref.seconds, shown.seconds), lost(work)) {
			_, symptoms := a.affects(f, v.Name, work)
			f.Summary += fmt.Sprintf(" Throttled more in %s, its %s.", shown.w.Name, symptoms)
		}
	}
	return f
}

// diskContention: the victim's writes and fsyncs slowed while neighbours loaded its device and
// the device slowed down (docs/findings.md).
func (a *analysis) diskContention(v rundir.Workload) *Finding {
	if !a.compare {
		return nil
	}
	vv := a.victim(v)
	d := vv.disk
	if !d.explains() {
		return nil
	}
	f := &Finding{ID: IDDiskContention, Victim: v.Name}
	var slowdown float64
	var symptoms string
	if c, probed := vv.change(measureFsync); probed {
		if slowdown, symptoms = a.affects(f, v.Name, vv.slowedIO()); slowdown == 0 {
			return nil
		}
		if !c.slowed() { // the fsync p95 is this finding's headline measure: always shown
			f.Evidence = append(f.Evidence, a.evidence("probe_fsync_p95", v.Name, c.p95B, c.p95S, UnitSeconds))
		}
	} else if slowdown, symptoms = a.tracedIO(f, v); slowdown == 0 {
		return nil
	}
	f.Severity = severity(slowdown)
	for _, c := range culprits(d.neighbours) {
		n := a.name(c.cgroup)
		f.Culprits = append(f.Culprits, n)
		e := a.evidence("blk_bytes", v.Name, d.bytes[c.cgroup].Delta(a.baseline), d.bytes[c.cgroup].Delta(a.stress), UnitBytes)
		e.Culprit, e.Device = n, d.device
		f.Evidence = append(f.Evidence, e)
	}
	e := a.evidence("blk_bytes", v.Name, d.ownBytesB, d.ownBytes, UnitBytes)
	e.Device = d.device
	f.Evidence = append(f.Evidence, e)
	f.Evidence = append(f.Evidence, d.evidence(a, v.Name)...)
	where := a.queueOrService(d.device, f)
	f.Summary = fmt.Sprintf("%s's I/O got slower while %s issued most of the neighbours' %s of I/O on device %s: %s%s. "+
		"Move the victim's or the neighbours' data to another disk, or cap the neighbours' I/O "+
		"(io.max / blkio throttle) or weight it below the victim's.",
		v.Name, joinNames(f.Culprits), human.Bytes(d.neighbourBytes), d.device, symptoms, where)
	return f
}

// tracedIO is disk-contention's symptom for a victim whose probe timed no fsync (one with no
// probe: a cgroup an agent window examines): ioChange's rise. It adds the evidence to f and
// returns the rise (0 when none counts) and its description.
func (a *analysis) tracedIO(f *Finding, v rundir.Workload) (float64, string) {
	c, traced := a.ioChange(v.Cgroup, a.victim(v).disk.device)
	if traced == nil {
		return 0, ""
	}
	f.Affects = append(f.Affects, traced.affects)
	f.Evidence = append(f.Evidence, c.evidence(a, traced.prefix, v.Name)...)
	return c.slowdown(), c.describe(traced.label, traced.events, a.stress.Name)
}

// tracedHist is a tracer's latency histogram that can show a cgroup's I/O got slower.
type tracedHist struct {
	metric, prefix string // the series, and its evidence's prefix
	label, events  string // for a person
	affects        string // in the finding's affects
}

// tracedHists, in the order ioChange tries them: the fsyncs, then the block requests' two
// parts (a cgroup that never fsyncs still waits for its reads and writes).
var tracedHists = []tracedHist{
	{rundir.MetricFsyncLatency, "fsync_latency", "its traced fsync", "fsyncs", measureFsync.key},
	{rundir.MetricBlkQueue, "blk_queue", "its block requests' queue time", "requests", affectsBlkRequests},
	{rundir.MetricBlkService, "blk_service", "its block requests' service time", "requests", affectsBlkRequests},
}

// ioChange is how the traced I/O of cgroup and its descendants on device got slower
// (histchange.go): its fsyncs' latency, else the larger rise of its block requests' queue and
// service times. traced is nil when none got slower.
func (a *analysis) ioChange(cgroup, device string) (c histChange, traced *tracedHist) {
	for i := range tracedHists {
		th := &tracedHists[i]
		if traced != nil && traced.affects != th.affects {
			break
		}
		var b, s hist.Log2
		for cg, ss := range a.run.Series(th.metric).Label(rundir.LabelDevice, device).ByCgroup() {
			if within(cg, cgroup) {
				b, s = b.Add(ss.HistDelta(a.baseline)), s.Add(ss.HistDelta(a.stress))
			}
		}
		if got, ok := compareHist(b, s); ok && got.slowed() && got.slowdown() > c.slowdown() {
			c, traced = got, th
		}
	}
	return c, traced
}

// busiestDevice is the device label with the most events (fsyncs, requests) in w.
func busiestDevice(events rundir.SeriesSet, w rundir.Window) string {
	return events.Busiest(rundir.LabelDevice, func(ss rundir.SeriesSet) float64 { return float64(ss.HistDelta(w).Count) })
}

// queueOrService adds the device-wide block queue and service time evidence to f and returns a
// clause saying which grew more: time waiting in the I/O scheduler behind other requests, or
// time the device took to serve them.
func (a *analysis) queueOrService(device string, f *Finding) string {
	deviceWide := func(metric string) (b, s hist.Log2) {
		ss := a.run.Series(metric).Label(rundir.LabelDevice, device)
		return ss.HistDelta(a.baseline), ss.HistDelta(a.stress)
	}
	qb, qs := deviceWide(rundir.MetricBlkQueue)
	sb, ss := deviceWide(rundir.MetricBlkService)
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
			"the victim's requests waited behind the neighbours' I/O", human.Seconds(qb.Mean()), human.Seconds(qs.Mean()),
			human.Seconds(sb.Mean()), human.Seconds(ss.Mean()))
	case service > 1:
		return fmt.Sprintf("; on the device, service time grew more than queue time (mean %s → %s against %s → %s): "+
			"the device itself slowed under the load", human.Seconds(sb.Mean()), human.Seconds(ss.Mean()),
			human.Seconds(qb.Mean()), human.Seconds(qs.Mean()))
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
