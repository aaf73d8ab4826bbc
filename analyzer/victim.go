package analyzer

import (
	"fmt"
	"slices"
	"strings"

	"github.com/nodectl/nodectl/internal/human"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

// The device slowed when the mean time of a block request (queue + service), all requests on
// it or the victim's own, rose blkRiseFactor from the baseline to the stress phase, or when it
// was busy (diskstats' io_ticks) blkRiseFactor as much of the time and busyRiseMin more of it.
// A deep device queue (virtio, NVMe) serves a neighbour's stream without longer requests, but
// not without being busier; the request mix (a neighbour's small requests) moves the mean
// request time either way, so either counts.
const (
	blkRiseFactor = 1.5
	busyRiseMin   = 0.10
)

// victimView is what the victim rules share about one victim, computed once: how each of its
// probe's measures changed from the baseline to the stress phase, and what its device says.
type victimView struct {
	changes []probeChange // measures with readings in both phases, in the order of probeMeasures
	disk    diskLoad
	// delayB and delayS are how much longer the probe's timed operations took, summed over the
	// phase's iterations, than the baseline's median of each: the part of the victim's waiting
	// that lay on its own path.
	delayB, delayS float64
}

// probeMeasures are the measures a victim's probe times in every iteration.
var probeMeasures = []probeMeasure{measureCPUWork, measureWriteFsync, measureFsync}

// victim returns the victim's view, computing it the first time (it needs both phases).
func (a *analysis) victim(v rundir.Workload) *victimView {
	if vv, ok := a.victims[v.Cgroup]; ok {
		return vv
	}
	vv := &victimView{disk: a.diskLoad(v)}
	for _, m := range probeMeasures {
		base, stress := a.probeReadings(v.Cgroup, m, a.baseline), a.probeReadings(v.Cgroup, m, a.stress)
		c, ok := compareProbe(m, base, stress)
		if !ok {
			continue
		}
		vv.changes = append(vv.changes, c)
	}
	for _, c := range onPath(vv.changes) {
		vv.delayB += c.excessB
		vv.delayS += c.excessS
	}
	a.victims[v.Cgroup] = vv
	return vv
}

// excess sums how far each value lies above ref.
func excess(values []float64, ref float64) float64 {
	var sum float64
	for _, v := range values {
		sum += max(0, v-ref)
	}
	return sum
}

// probeReadings are a probe's readings of m in w: one per iteration.
func (a *analysis) probeReadings(cgroup string, m probeMeasure, w rundir.Window) []float64 {
	of := func(metric string) rundir.SeriesSet { return a.run.Series(metric).Cgroup(cgroup) }
	switch m {
	case measureCPUWork:
		return of(rundir.MetricProbeCPUWork).Values(w)
	case measureWriteFsync:
		return writeFsync(of(rundir.MetricProbeWrite).Samples(w), of(rundir.MetricProbeFsync).Samples(w))
	}
	return of(rundir.MetricProbeFsync).Values(w)
}

// change returns the victim's change of m, if both phases measured it.
func (vv *victimView) change(m probeMeasure) (probeChange, bool) {
	for _, c := range vv.changes {
		if c.measure == m {
			return c, true
		}
	}
	return probeChange{}, false
}

// slowed lists the measures among ms that got slower.
func (vv *victimView) slowed(ms ...probeMeasure) []probeChange {
	var out []probeChange
	for _, c := range vv.changes {
		for _, m := range ms {
			if c.measure == m && c.slowed() {
				out = append(out, c)
			}
		}
	}
	return out
}

// spentBeside is the wait that cannot have delayed measures cs: none when they hold the CPU
// work, else the time the CPU work lost, slowed or not (it runs all the time, so a wait in it
// is time it loses, and that wait did not delay the I/O).
func (vv *victimView) spentBeside(cs []probeChange) float64 {
	if slices.ContainsFunc(cs, isCPUWork) {
		return 0
	}
	if c, ok := vv.change(measureCPUWork); ok {
		return c.lost()
	}
	return 0
}

// slowedIO lists the victim's I/O measures that got slower.
func (vv *victimView) slowedIO() []probeChange { return vv.slowed(measureWriteFsync, measureFsync) }

// diskLoad is what the victim's device says about a slower I/O: how much I/O the neighbours
// added there, and whether the device took longer to serve requests.
type diskLoad struct {
	device string
	bytes  map[string]rundir.SeriesSet // data bytes on the device, by issuing cgroup
	// neighbours are the bytes each other cgroup added over its baseline rate; added is their
	// sum, neighbourBytes and ownBytes what the others and the victim moved in the stress phase
	// (B: in the baseline).
	neighbours                      []share
	added, neighbourBytes, ownBytes float64
	neighbourBytesB, ownBytesB      float64
	// The mean time of a block request (queue + service) on the device, all requests and the
	// victim's own, in the baseline (B) and stress (S) phases; zero when none was traced.
	deviceB, deviceS, ownB, ownS float64
	// The share of each phase the device was busy; -1 when diskstats were not sampled.
	busyB, busyS float64
}

// diskLoad measures the victim's device: its workload's, else the one with most of its fsyncs,
// else the one that served most of its block requests.
func (a *analysis) diskLoad(v rundir.Workload) diskLoad {
	d := diskLoad{device: v.Device}
	if d.device == "" {
		d.device = busiestDevice(a.run.Series(rundir.MetricFsyncLatency).Cgroup(v.Cgroup), a.stress)
	}
	if d.device == "" {
		d.device = busiestDevice(a.run.Series(rundir.MetricBlkService).Cgroup(v.Cgroup), a.stress)
	}
	if d.device == "" {
		return d
	}
	// As for CPU, a neighbour is charged the I/O it added over its baseline rate.
	d.bytes = dataBytes(a.run).Label(rundir.LabelDevice, d.device).ByCgroup()
	for cg, ss := range d.bytes {
		b, s := ss.Delta(a.baseline), ss.Delta(a.stress)
		if within(cg, v.Cgroup) {
			d.ownBytesB += b
			d.ownBytes += s
			continue
		}
		more := a.added(b, s)
		d.neighbours = append(d.neighbours, share{cgroup: cg, value: more})
		d.added += more
		d.neighbourBytesB += b
		d.neighbourBytes += s
	}
	requestMean := func(own bool, w rundir.Window) float64 {
		var q, s hist.Log2
		for cg, ss := range a.run.Series(rundir.MetricBlkQueue).Label(rundir.LabelDevice, d.device).ByCgroup() {
			if !own || within(cg, v.Cgroup) {
				q = q.Add(ss.HistDelta(w))
			}
		}
		for cg, ss := range a.run.Series(rundir.MetricBlkService).Label(rundir.LabelDevice, d.device).ByCgroup() {
			if !own || within(cg, v.Cgroup) {
				s = s.Add(ss.HistDelta(w))
			}
		}
		if s.Count == 0 {
			return 0
		}
		return secs(q.SumNs+s.SumNs) / float64(s.Count)
	}
	d.deviceB, d.deviceS = requestMean(false, a.baseline), requestMean(false, a.stress)
	d.ownB, d.ownS = requestMean(true, a.baseline), requestMean(true, a.stress)
	d.busyB, d.busyS = -1, -1
	if busy := a.run.Series(rundir.MetricDiskIOTime).Label(rundir.LabelDevice, d.device); len(busy) > 0 {
		d.busyB, d.busyS = ratio(busy.Delta(a.baseline), a.baseline.Seconds()), ratio(busy.Delta(a.stress), a.stress.Seconds())
	}
	return d
}

// loaded: the neighbours added enough I/O on the device, and enough of what it moved, to slow
// the victim's.
func (d diskLoad) loaded() bool {
	return d.added >= neighbourBytesMin && ratio(d.neighbourBytes, d.neighbourBytes+d.ownBytes) >= neighbourDeviceShareMin
}

// slowed: requests on the device, all or the victim's own, took longer to serve. When the block
// tracer timed no request in a phase, nothing says otherwise.
func (d diskLoad) slowed() bool {
	if d.deviceB == 0 || d.deviceS == 0 {
		return true
	}
	return ratio(d.deviceS, d.deviceB) >= blkRiseFactor || d.ownB > 0 && ratio(d.ownS, d.ownB) >= blkRiseFactor || d.busier()
}

// busier: the device was busy a good deal more of the stress phase than of the baseline.
func (d diskLoad) busier() bool {
	return d.busyB >= 0 && ratio(d.busyS, d.busyB) >= blkRiseFactor && d.busyS-d.busyB >= busyRiseMin
}

// explains: the disk is the cause of a slower I/O of the victim.
func (d diskLoad) explains() bool { return d.device != "" && d.loaded() && d.slowed() }

// whyNot says why the device does not explain a slower I/O, for a finding that names another
// cause: e.g. "the mean time of its block requests on 254:0 went 28.3ms → 28.2ms (all requests'
// 25.4ms → 14.2ms) and the neighbours added only 7.1 MiB of I/O there".
func (d diskLoad) whyNot() string {
	if d.device == "" {
		return "nothing says which device it writes to"
	}
	var parts []string
	if !d.slowed() {
		busy := ""
		if d.busyB >= 0 {
			busy = fmt.Sprintf(", busy %s → %s of the time", human.Percent(d.busyB), human.Percent(d.busyS))
		}
		parts = append(parts, fmt.Sprintf("the mean time of its block requests on %s went %s → %s (all requests' %s → %s%s)",
			d.device, human.Seconds(d.ownB), human.Seconds(d.ownS), human.Seconds(d.deviceB), human.Seconds(d.deviceS), busy))
	}
	if !d.loaded() {
		parts = append(parts, fmt.Sprintf("the neighbours moved only %s there (%s of the device's data)",
			human.Bytes(d.neighbourBytes), human.Percent(ratio(d.neighbourBytes, d.neighbourBytes+d.ownBytes))))
	}
	return strings.Join(parts, " and ")
}

// evidence lists the device's request times and the neighbours' I/O on it.
func (d diskLoad) evidence(a *analysis, workload string) []Evidence {
	if d.device == "" {
		return nil
	}
	out := []Evidence{
		a.evidence("blk_request_mean", workload, d.ownB, d.ownS, UnitSeconds),
		a.evidence("blk_request_mean", "", d.deviceB, d.deviceS, UnitSeconds),
		a.evidence("blk_neighbour_bytes", workload, d.neighbourBytesB, d.neighbourBytes, UnitBytes),
	}
	if d.busyB >= 0 {
		out = append(out, a.evidence("disk_busy_share", "", d.busyB, d.busyS, UnitRatio))
	}
	for i := range out {
		out[i].Device = d.device
	}
	return out
}

// accountsFor: a cause that added this much time, summed over the victim's threads, accounts
// for the loss (causeCoverMin of it at least).
func accountsFor(added, loss float64) bool { return added >= causeCoverMin*loss }

// lost is the time the measures of changes lost in the stress phase, each once.
func lost(changes []probeChange) float64 {
	var sum float64
	for _, c := range onPath(changes) {
		sum += c.lost()
	}
	return sum
}

// unexplained notes what the victim rules leave open: each victim measure that got slower with
// no finding naming it in Affects (an effect without a cause is a gap the reader must see), a
// probe held through the whole stress phase, and a probe with too few iterations for any
// slowdown to count.
func (a *analysis) unexplained(findings []Finding) []string {
	if !a.compare {
		return nil
	}
	var out []string
	for _, w := range a.run.Meta.Workloads {
		if w.Kind != rundir.KindVictim {
			continue
		}
		explained := map[string]bool{}
		for _, f := range findings {
			if f.Victim == w.Name {
				for _, k := range f.Affects {
					explained[k] = true
				}
			}
		}
		vv, cw := a.victim(w), a.cpuWaits(w.Cgroup)
		// A probe held for the whole stress phase (one run-queue wait longer than the phase, or
		// a stalled device) finishes no iteration there: nothing to compare, and the wait is
		// recorded only once it ends, perhaps after the run.
		if len(a.probeReadings(w.Cgroup, measureCPUWork, a.baseline)) > 0 && len(a.probeReadings(w.Cgroup, measureCPUWork, a.stress)) == 0 {
			out = append(out, fmt.Sprintf("%s's probe finished no iteration in the %s phase (%s): it was held the whole phase, "+
				"a slowdown no rule can measure; its run-queue p99 went %s → %s and its longest wait was at least %s",
				w.Name, a.stress.Name, human.Seconds(a.stress.Seconds()), human.Seconds(cw.rb.Quantile(0.99)), human.Seconds(cw.rs.Quantile(0.99)),
				human.Seconds(cw.rs.LongestAtLeast())))
		}
		for _, c := range vv.changes {
			if p := minChance(c.nB, c.nS); p > probeAlpha {
				out = append(out, fmt.Sprintf("%s's probe ran %d iterations in the baseline and %d in the stress phase: too few for a "+
					"slowdown to count (even every stress iteration slower than every baseline one has a %s chance); run longer phases",
					w.Name, c.nB, c.nS, human.Percent(p)))
				break
			}
			if !c.slowed() || explained[c.measure.key] {
				continue
			}
			var why []string
			if c.measure != measureCPUWork {
				why = append(why, "its device does not ("+vv.disk.whyNot()+")")
			}
			// The CPU may account for this measure alone but not for all the victim lost.
			loss, spent := c.lost(), vv.spentBeside([]probeChange{c})
			if cw.byNeighbours() && cw.covers(loss, spent) {
				all := vv.slowed(probeMeasures...)
				loss, spent = lost(all), vv.spentBeside(all)
			}
			why = append(why, "the CPU does not ("+cw.whyNot(loss, spent)+")")
			rb, rs := a.reclaimStallsOf(w.Cgroup, a.baseline), a.reclaimStallsOf(w.Cgroup, a.stress)
			why = append(why, fmt.Sprintf("nor does reclaim (its stalls went %s → %s of every second)",
				human.Seconds(ratio(rb.total, a.baseline.Seconds())), human.Seconds(ratio(rs.total, a.stress.Seconds()))))
			out = append(out, fmt.Sprintf("%s's %s got slower but no finding explains it: %s. %s. Something the tracers do "+
				"not see (memory bandwidth, interrupts) may be the cause.",
				w.Name, c.measure.label, c.describe(), capitalize(strings.Join(why, ", "))))
		}
	}
	return out
}

// capitalize starts s with a capital letter.
func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
