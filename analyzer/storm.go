package analyzer

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/nodectl/nodectl/internal/human"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

// An fsync-storm run (`nodectl stress fsync-storm`) releases N writers at once, each writing a
// file and fsyncing it, several times (rounds). Each writer is a workload of kind fsync-writer in
// its own cgroup; each storm is a phase round-<n>, from just before the go to the snapshot after
// the last fsync returned, so the tracer's counters over the phase are the storm's.
const (
	stormTopWriters = 3 // writers a round's explanation names as holding the device
)

// Storm tabulates an fsync-storm run: each writer's times to durable, and each storm's tail
// explained from the device's side.
type Storm struct {
	Writers []StormWriter `json:"writers"`
	Rounds  []StormRound  `json:"rounds"`
}

// StormWriter is one writer over every storm. The per-storm lists are in round order and hold
// one value per storm the writer finished.
type StormWriter struct {
	Name           string    `json:"name"`
	Cgroup         string    `json:"cgroup"`
	DurableSeconds []float64 `json:"durable_seconds"` // first write to the fsync's return
	WriteSeconds   []float64 `json:"write_seconds"`   // the writes: page cache copy and any dirty throttling
	FsyncSeconds   []float64 `json:"fsync_seconds"`   // the fsync: writeback of its data and the device's flush
	DurableP50     float64   `json:"durable_p50_seconds"`
	DurableMax     float64   `json:"durable_max_seconds"`
	WriteP50       float64   `json:"write_p50_seconds"`
	FsyncP50       float64   `json:"fsync_p50_seconds"`
	// Its cgroup's block I/O on the device over all storms (the block tracer, --trace).
	Bytes       float64 `json:"bytes"`
	QueueMean   float64 `json:"blk_queue_mean_seconds"`
	ServiceMean float64 `json:"blk_service_mean_seconds"`
}

// StormRound is one storm: its times to durable, who held the device, how its requests split
// between waiting in the queue and being served, and what writeback did.
type StormRound struct {
	Name       string  `json:"name"` // the phase, round-<n>
	Seconds    float64 `json:"seconds"`
	Writers    int     `json:"writers"` // writers whose fsync returned
	DurableP50 float64 `json:"durable_p50_seconds"`
	DurableMax float64 `json:"durable_max_seconds"`
	Slowest    string  `json:"slowest"`
	// StartSkew is how far apart the writers' first writes were: the go reached them together.
	StartSkew float64 `json:"start_skew_seconds"`
	WriteP50  float64 `json:"write_p50_seconds"`
	FsyncP50  float64 `json:"fsync_p50_seconds"`
	// WritersCPUCores is the CPU time the writers used in the storm over its length: what
	// copying their data into the page cache (and submitting it) cost.
	WritersCPUCores float64 `json:"writers_cpu_cores"`

	Device string `json:"device"`
	// Block tracer, every request on the device in the storm (all cgroups, all operations).
	QueueMean   float64 `json:"blk_queue_mean_seconds"`
	QueueP95    float64 `json:"blk_queue_p95_seconds"`
	ServiceMean float64 `json:"blk_service_mean_seconds"`
	ServiceP95  float64 `json:"blk_service_p95_seconds"`
	QueueShare  float64 `json:"queue_share"` // queue time over queue + service time, summed over requests
	DeviceBytes float64 `json:"device_bytes"`
	HeldBy      []Held  `json:"held_by"`     // writers by bytes issued, most first, at most three
	OtherBytes  float64 `json:"other_bytes"` // by cgroups that are no writer: the flusher's writeback, the journal

	// Node memory, sampled by the driver through the storm (bytes).
	DirtyPeak                float64 `json:"dirty_peak_bytes"`
	WritebackPeak            float64 `json:"writeback_peak_bytes"`
	DirtyThreshold           float64 `json:"dirty_threshold_bytes"`
	DirtyBackgroundThreshold float64 `json:"dirty_background_threshold_bytes"`
	// DirtyThrottled: dirty memory passed the midpoint of the two thresholds, where
	// balance_dirty_pages starts pausing writers.
	DirtyThrottled bool `json:"dirty_throttled"`

	Explanation string `json:"explanation"`
}

// Held is one writer's part of the device in a storm.
type Held struct {
	Workload string  `json:"workload"`
	Bytes    float64 `json:"bytes"`
	Share    float64 `json:"share"` // of the device's bytes in the storm
}

// StormReport is what `nodectl stress fsync-storm -o json` prints.
type StormReport struct {
	Writers  []StormWriter `json:"writers"`
	Rounds   []StormRound  `json:"rounds"`
	Findings []Finding     `json:"findings"`
}

// storm fills in an fsync-storm run's tables, its finding and its notes.
func (a *analysis) storm(rep *Report) {
	var writers []rundir.Workload
	for _, w := range a.run.Meta.Workloads {
		if w.Kind == rundir.KindStormWriter {
			writers = append(writers, w)
		}
	}
	var rounds []rundir.Window
	for _, w := range a.windows {
		if rundir.IsRoundPhase(w.Name) {
			rounds = append(rounds, w)
		}
	}
	s := &Storm{Writers: make([]StormWriter, 0, len(writers)), Rounds: make([]StormRound, 0, len(rounds))}
	for _, w := range writers {
		s.Writers = append(s.Writers, a.stormWriter(w, rounds))
	}
	for _, win := range rounds {
		s.Rounds = append(s.Rounds, a.stormRound(win, writers))
	}
	rep.Storm = s
	if f := a.stormTail(s, writers, rounds); f != nil {
		rep.Findings = append(rep.Findings, *f)
	}
	done := 0
	for _, sw := range s.Writers {
		done += len(sw.DurableSeconds)
	}
	if want := len(writers) * len(rounds); done < want {
		rep.Notes = append(rep.Notes, fmt.Sprintf("%d of %d writer fsyncs never returned (the run was interrupted or a writer failed): "+
			"the storms count only those that did", want-done, want))
	}
	if len(rounds) > 0 && a.run.Meta.Tracer[rundir.ProgramBlkio] != rundir.TracerAttached {
		rep.Notes = append(rep.Notes, "no block tracer (run with --trace): the storms' queue and service times and the bytes per writer are unknown")
	}
}

// stormDevice is the device the writers write to, from meta.json.
func stormDevice(writers []rundir.Workload) string {
	for _, w := range writers {
		if w.Device != "" {
			return w.Device
		}
	}
	return ""
}

func (a *analysis) stormWriter(w rundir.Workload, rounds []rundir.Window) StormWriter {
	of := func(metric string) rundir.SeriesSet { return a.run.Series(metric).Cgroup(w.Cgroup) }
	sw := StormWriter{Name: w.Name, Cgroup: w.Cgroup, DurableSeconds: []float64{}, WriteSeconds: []float64{}, FsyncSeconds: []float64{}}
	var queue, service hist.Log2
	for _, win := range rounds {
		if d := of(rundir.MetricStormDurable).Values(win); len(d) > 0 {
			sw.DurableSeconds = append(sw.DurableSeconds, d[0])
		}
		if v := of(rundir.MetricStormWrite).Values(win); len(v) > 0 {
			sw.WriteSeconds = append(sw.WriteSeconds, v[0])
		}
		if v := of(rundir.MetricStormFsync).Values(win); len(v) > 0 {
			sw.FsyncSeconds = append(sw.FsyncSeconds, v[0])
		}
		sw.Bytes += dataBytes(a.run).Cgroup(w.Cgroup).Label(rundir.LabelDevice, w.Device).Delta(win)
		queue = queue.Add(of(rundir.MetricBlkQueue).Label(rundir.LabelDevice, w.Device).HistDelta(win))
		service = service.Add(of(rundir.MetricBlkService).Label(rundir.LabelDevice, w.Device).HistDelta(win))
	}
	sw.DurableP50, sw.DurableMax = quantile(sw.DurableSeconds, 0.5), quantile(sw.DurableSeconds, 1)
	sw.WriteP50, sw.FsyncP50 = quantile(sw.WriteSeconds, 0.5), quantile(sw.FsyncSeconds, 0.5)
	sw.QueueMean, sw.ServiceMean = queue.Mean(), service.Mean()
	return sw
}

func (a *analysis) stormRound(win rundir.Window, writers []rundir.Workload) StormRound {
	device := stormDevice(writers)
	rd := StormRound{Name: win.Name, Seconds: win.Seconds(), Device: device, HeldBy: []Held{}}
	var durable, writes, fsyncs []float64
	var first, last float64
	for _, w := range writers {
		samples := a.run.Series(rundir.MetricStormDurable).Cgroup(w.Cgroup).Samples(win)
		if len(samples) == 0 {
			continue
		}
		d := *samples[0].Value
		// A writer's start is its fsync's return minus its time to durable.
		start := samples[0].Time.Sub(win.Start).Seconds() - d
		if len(durable) == 0 || start < first {
			first = start
		}
		if len(durable) == 0 || start > last {
			last = start
		}
		durable = append(durable, d)
		if d > rd.DurableMax || rd.Slowest == "" {
			rd.DurableMax, rd.Slowest = d, w.Name
		}
		writes = append(writes, a.run.Series(rundir.MetricStormWrite).Cgroup(w.Cgroup).Values(win)...)
		rd.WritersCPUCores += a.run.Series(rundir.MetricCPUUsage).Cgroup(w.Cgroup).Delta(win)
		fsyncs = append(fsyncs, a.run.Series(rundir.MetricStormFsync).Cgroup(w.Cgroup).Values(win)...)
	}
	rd.Writers, rd.DurableP50, rd.StartSkew = len(durable), quantile(durable, 0.5), last-first
	rd.WriteP50, rd.FsyncP50 = quantile(writes, 0.5), quantile(fsyncs, 0.5)
	rd.WritersCPUCores = ratio(rd.WritersCPUCores, win.Seconds())

	onDevice := func(metric string) hist.Log2 {
		return a.run.Series(metric).Label(rundir.LabelDevice, device).HistDelta(win)
	}
	q, sv := onDevice(rundir.MetricBlkQueue), onDevice(rundir.MetricBlkService)
	rd.QueueMean, rd.QueueP95, rd.ServiceMean, rd.ServiceP95 = q.Mean(), q.Quantile(0.95), sv.Mean(), sv.Quantile(0.95)
	rd.QueueShare = ratio(secs(q.SumNs), secs(q.SumNs+sv.SumNs))
	var held []share
	for cg, ss := range dataBytes(a.run).Label(rundir.LabelDevice, device).ByCgroup() {
		b := ss.Delta(win)
		rd.DeviceBytes += b
		if slices.ContainsFunc(writers, func(w rundir.Workload) bool { return within(cg, w.Cgroup) }) {
			held = append(held, share{cgroup: a.owner(cg), value: b})
		} else {
			rd.OtherBytes += b
		}
	}
	slices.SortFunc(held, func(x, y share) int {
		return cmp.Or(cmp.Compare(y.value, x.value), strings.Compare(x.cgroup, y.cgroup))
	})
	for _, h := range held[:min(len(held), stormTopWriters)] {
		if h.value > 0 {
			rd.HeldBy = append(rd.HeldBy, Held{Workload: a.name(h.cgroup), Bytes: h.value, Share: ratio(h.value, rd.DeviceBytes)})
		}
	}

	peak := func(metric string) float64 {
		m := 0.0
		for _, v := range a.run.Series(metric).Values(win) {
			m = max(m, v)
		}
		return m
	}
	rd.DirtyPeak, rd.WritebackPeak = peak(rundir.MetricDirty), peak(rundir.MetricWriteback)
	rd.DirtyThreshold, rd.DirtyBackgroundThreshold = peak(rundir.MetricDirtyThreshold), peak(rundir.MetricDirtyBackThreshold)
	rd.DirtyThrottled = rd.DirtyThreshold > 0 && rd.DirtyPeak >= (rd.DirtyThreshold+rd.DirtyBackgroundThreshold)/2
	rd.Explanation = explainRound(rd)
	return rd
}

// explainRound says in words why the storm's slowest writer took as long as it did: its spread
// over the median, queue against service time on the device, who held the device, writeback.
func explainRound(rd StormRound) string {
	if rd.Writers == 0 {
		return "no writer's fsync returned."
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d writers started within %s of each other; durable p50 %s, slowest %s in %s (%s the median; writes p50 %s, fsync p50 %s).",
		rd.Writers, human.Seconds(rd.StartSkew), human.Seconds(rd.DurableP50), rd.Slowest, human.Seconds(rd.DurableMax),
		human.Factor(ratio(rd.DurableMax, rd.DurableP50)), human.Seconds(rd.WriteP50), human.Seconds(rd.FsyncP50))
	if rd.WriteP50 > rd.FsyncP50 && !rd.DirtyThrottled {
		fmt.Fprintf(&b, " The writes, not the fsync, took most of it: copying into the page cache")
		if rd.WritersCPUCores > 0 {
			fmt.Fprintf(&b, ", the writers kept %.1f cores busy on average through the storm", rd.WritersCPUCores)
		}
		b.WriteString(" (CPU and memory, not the disk, set that part).")
	}
	if rd.QueueMean+rd.ServiceMean > 0 {
		// Service time includes the wait in the device's own queue: a virtio or NVMe disk takes
		// many requests at once, so a storm can queue there rather than in the I/O scheduler.
		where := "the requests waited little in the I/O scheduler; the tail is the device's own time (its internal queue included)"
		if rd.QueueShare >= 0.5 {
			where = "the tail is waiting in the queue behind the other writers' requests, not a slow device"
		}
		fmt.Fprintf(&b, " On device %s requests spent %s of their time queued (mean %s queued, %s served; p95 %s and %s): %s.",
			rd.Device, human.Percent(rd.QueueShare), human.Seconds(rd.QueueMean), human.Seconds(rd.ServiceMean),
			human.Seconds(rd.QueueP95), human.Seconds(rd.ServiceP95), where)
	}
	if rd.DeviceBytes > 0 {
		var names []string
		for _, h := range rd.HeldBy {
			names = append(names, fmt.Sprintf("%s %s (%s)", h.Workload, human.Bytes(h.Bytes), human.Percent(h.Share)))
		}
		fmt.Fprintf(&b, " Of the %s written to it, the writers holding most were %s; %s came from cgroups that are no writer (the flusher's writeback, the journal).",
			human.Bytes(rd.DeviceBytes), joinNames(names), human.Bytes(rd.OtherBytes))
	}
	if rd.DirtyThreshold > 0 {
		switch {
		case rd.DirtyThrottled:
			fmt.Fprintf(&b, " Dirty memory peaked at %s, past the point (%s) where balance_dirty_pages pauses writers: the writes themselves were throttled.",
				human.Bytes(rd.DirtyPeak), human.Bytes((rd.DirtyThreshold+rd.DirtyBackgroundThreshold)/2))
		case rd.DirtyPeak >= rd.DirtyBackgroundThreshold:
			fmt.Fprintf(&b, " Dirty memory peaked at %s, over the background threshold %s: the flusher wrote back alongside the fsyncs (writeback peak %s), without throttling the writers.",
				human.Bytes(rd.DirtyPeak), human.Bytes(rd.DirtyBackgroundThreshold), human.Bytes(rd.WritebackPeak))
		default:
			fmt.Fprintf(&b, " Dirty memory peaked at %s, under the background threshold %s: no background writeback or dirty throttling, each fsync wrote back its own data (writeback peak %s).",
				human.Bytes(rd.DirtyPeak), human.Bytes(rd.DirtyBackgroundThreshold), human.Bytes(rd.WritebackPeak))
		}
	}
	return b.String()
}

// stormTail reports the run's slowest writer as disk-contention when its storm's tail is
// material (docs/findings.md): it took fsyncRiseFactor times its storm's median and at least
// fsyncMinRiseSeconds more, while the other writers moved at least neighbourDeviceShareMin of
// the device's bytes. The culprits are the other writers that held the device, by bytes.
func (a *analysis) stormTail(s *Storm, writers []rundir.Workload, rounds []rundir.Window) *Finding {
	if len(writers) < 2 {
		return nil
	}
	// The slowest writer of the run, and the storm it was slowest in.
	vi, ri := -1, -1
	var worst float64
	for i, w := range writers {
		for j, win := range rounds {
			if d := a.run.Series(rundir.MetricStormDurable).Cgroup(w.Cgroup).Values(win); len(d) > 0 && d[0] > worst {
				vi, ri, worst = i, j, d[0]
			}
		}
	}
	if vi < 0 {
		return nil
	}
	v, win, rd := writers[vi], rounds[ri], s.Rounds[ri]
	if ratio(worst, rd.DurableP50) < fsyncRiseFactor || worst-rd.DurableP50 < fsyncMinRiseSeconds {
		return nil
	}
	device := stormDevice(writers)
	bytes := dataBytes(a.run).Label(rundir.LabelDevice, device).ByCgroup()
	own := bytes[v.Cgroup].Delta(win)
	var others []share
	var othersBytes float64
	for _, w := range writers {
		if w.Name == v.Name {
			continue
		}
		b := bytes[w.Cgroup].Delta(win)
		others = append(others, share{cgroup: w.Cgroup, value: b})
		othersBytes += b
	}
	if ratio(othersBytes, rd.DeviceBytes) < neighbourDeviceShareMin {
		return nil // without the block tracer, or when the victim moved nearly everything itself
	}

	// Per-writer measures against the storm's median writer.
	median := func(metric string, get func(rundir.Workload) float64) Evidence {
		var vs []float64
		for _, w := range writers {
			vs = append(vs, get(w))
		}
		return Evidence{Metric: metric, Workload: v.Name, Phase: win.Name, Baseline: quantile(vs, 0.5), Value: get(v), Unit: UnitSeconds}
	}
	first := func(metric string) func(rundir.Workload) float64 {
		return func(w rundir.Workload) float64 {
			if vs := a.run.Series(metric).Cgroup(w.Cgroup).Values(win); len(vs) > 0 {
				return vs[0]
			}
			return 0
		}
	}
	mean := func(metric string) func(rundir.Workload) float64 {
		return func(w rundir.Workload) float64 {
			return a.run.Series(metric).Cgroup(w.Cgroup).Label(rundir.LabelDevice, device).HistDelta(win).Mean()
		}
	}
	f := &Finding{ID: IDDiskContention, Severity: severity(ratio(worst, rd.DurableP50)), Victim: v.Name, Evidence: []Evidence{
		median("fsync_storm_durable", first(rundir.MetricStormDurable)),
		median("fsync_storm_write", first(rundir.MetricStormWrite)),
		median("fsync_storm_fsync", first(rundir.MetricStormFsync)),
		median("blk_queue_mean", mean(rundir.MetricBlkQueue)),
		median("blk_service_mean", mean(rundir.MetricBlkService)),
	}}
	// Device-wide: queue time against the device's own service time in the same storm.
	f.Evidence = append(f.Evidence, Evidence{Metric: "blk_queue_mean", Device: device, Phase: win.Name, Baseline: rd.ServiceMean, Value: rd.QueueMean, Unit: UnitSeconds},
		Evidence{Metric: "blk_queue_share", Device: device, Phase: win.Name, Value: rd.QueueShare, Unit: UnitRatio})
	for _, c := range culprits(others) {
		n := a.name(c.cgroup)
		f.Culprits = append(f.Culprits, n)
		f.Evidence = append(f.Evidence, Evidence{Metric: "blk_bytes", Workload: v.Name, Culprit: n, Device: device, Phase: win.Name,
			Baseline: own, Value: c.value, Unit: UnitBytes})
	}
	f.Summary = fmt.Sprintf("in %s, %s took %s to make its data durable, %s the median writer's %s, while %s moved %s of the %s written to device %s "+
		"and its requests spent %s of their time queued (mean %s queued against %s served): the writers that held the queue "+
		"made the tail. Stagger the writers (a snapshot storm), give them separate disks, or cap their I/O (io.max / blkio throttle).",
		win.Name, v.Name, human.Seconds(worst), human.Factor(ratio(worst, rd.DurableP50)), human.Seconds(rd.DurableP50), joinNames(f.Culprits),
		human.Percent(ratio(othersBytes, rd.DeviceBytes)), human.Bytes(rd.DeviceBytes), device, human.Percent(rd.QueueShare),
		human.Seconds(rd.QueueMean), human.Seconds(rd.ServiceMean))
	return f
}
