package analyzer

import (
	"fmt"
	"strings"
	"testing"

	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

// stormWriter is one writer of a synthetic storm: its times, its bytes on the device and its
// requests' queue and service time.
type stormWriter struct {
	durable, write   float64
	bytes            float64
	queue, service   float64 // per request
	requests         uint64
	cpu              float64 // CPU seconds used in the storm
	finished, traced bool
}

// stormRun builds an fsync-storm run of one storm, round-1 over (0 s, 2 s], with the writers
// and, when other > 0, bytes by the root cgroup (the flusher, the journal).
func stormRun(other float64, dirtyPeak float64, ws ...stormWriter) *builder {
	b := &builder{meta: rundir.Meta{ID: "s1", Scenario: rundir.ScenarioFsyncStorm, Node: "node-a", Kernel: "6.18.0", Start: at(-1),
		Tracer: map[string]string{"blkio": rundir.TracerAttached, "fsync": rundir.TracerAttached}}}
	b.recs = append(b.recs,
		rundir.Record{Type: rundir.TypePhase, Time: at(0), Name: "round-1", Event: rundir.EventStart},
		rundir.Record{Type: rundir.TypePhase, Time: at(2), Name: "round-1", Event: rundir.EventEnd})
	v := func(x float64) *float64 { return &x }
	cum := func(metric, cg string, total float64, kv ...string) {
		for _, s := range []struct{ t, v float64 }{{0, 0}, {2, total}} {
			b.recs = append(b.recs, rundir.Record{Type: rundir.TypeSample, Time: at(s.t), Metric: metric, Cgroup: cg, Labels: labels(kv...), Value: v(s.v)})
		}
	}
	hists := func(metric, cg string, h hist.Log2) {
		for _, s := range []hist.Log2{{}, h} {
			t := 0.0
			if s.Count > 0 {
				t = 2
			}
			b.recs = append(b.recs, rundir.Record{Type: rundir.TypeSample, Time: at(t), Metric: metric, Cgroup: cg, Labels: labels(rundir.LabelDevice, disk, rundir.LabelOp, "write"), Hist: &s})
		}
	}
	for i, w := range ws {
		name := fmt.Sprintf("fsync-writer-%d", i)
		cg := runCg + "/" + name
		b.meta.Workloads = append(b.meta.Workloads, rundir.Workload{Name: name, Kind: rundir.KindStormWriter, Cgroup: cg, Device: disk})
		if w.finished {
			end := at(0.01 + w.durable)
			b.recs = append(b.recs,
				rundir.Record{Type: rundir.TypeSample, Time: end, Metric: rundir.MetricStormDurable, Cgroup: cg, Value: v(w.durable)},
				rundir.Record{Type: rundir.TypeSample, Time: end, Metric: rundir.MetricStormWrite, Cgroup: cg, Value: v(w.write)},
				rundir.Record{Type: rundir.TypeSample, Time: end, Metric: rundir.MetricStormFsync, Cgroup: cg, Value: v(w.durable - w.write)})
		}
		if w.cpu > 0 {
			cum(rundir.MetricCPUUsage, cg, w.cpu)
		}
		if w.traced {
			cum(rundir.MetricBlkBytes, cg, w.bytes, rundir.LabelDevice, disk, rundir.LabelOp, "write")
			hists(rundir.MetricBlkQueue, cg, lat(w.requests, w.queue))
			hists(rundir.MetricBlkService, cg, lat(w.requests, w.service))
		}
	}
	if other > 0 {
		cum(rundir.MetricBlkBytes, "/", other, rundir.LabelDevice, disk, rundir.LabelOp, "write")
	}
	for i, d := range []float64{dirtyPeak / 2, dirtyPeak, dirtyPeak / 4} {
		t := at(0.5 + float64(i)*0.5)
		b.recs = append(b.recs,
			rundir.Record{Type: rundir.TypeSample, Time: t, Metric: rundir.MetricDirty, Value: v(d)},
			rundir.Record{Type: rundir.TypeSample, Time: t, Metric: rundir.MetricWriteback, Value: v(d / 2)},
			rundir.Record{Type: rundir.TypeSample, Time: t, Metric: rundir.MetricDirtyThreshold, Value: v(4 << 30)},
			rundir.Record{Type: rundir.TypeSample, Time: t, Metric: rundir.MetricDirtyBackThreshold, Value: v(2 << 30)})
	}
	return b
}

func writer(durable, bytes, queue float64) stormWriter {
	return stormWriter{durable: durable, write: 0.1, bytes: bytes, queue: queue, service: 0.004, requests: 100, finished: true, traced: true}
}

func TestStormTailIsDiskContention(t *testing.T) {
	const mib = 1 << 20
	rep := stormRun(8*mib, 300*mib,
		writer(0.4, 64*mib, 0.002), writer(0.5, 64*mib, 0.002), writer(0.45, 64*mib, 0.002), writer(1.6, 64*mib, 0.03)).analyze(t)
	if rep.Storm == nil || len(rep.Storm.Writers) != 4 || len(rep.Storm.Rounds) != 1 {
		t.Fatalf("storm table %+v, want 4 writers and 1 round", rep.Storm)
	}
	rd := rep.Storm.Rounds[0]
	if rd.Slowest != "fsync-writer-3" || rd.DurableMax != 1.6 || rd.DurableP50 != 0.45 || rd.Writers != 4 {
		t.Errorf("round %+v: want slowest fsync-writer-3 at 1.6 s, p50 0.45 s", rd)
	}
	if rd.DeviceBytes != 264*mib || rd.OtherBytes != 8*mib || len(rd.HeldBy) != stormTopWriters || !approx(rd.HeldBy[0].Share, 64.0/264) {
		t.Errorf("device bytes %v, other %v, held by %+v", rd.DeviceBytes, rd.OtherBytes, rd.HeldBy)
	}
	if rd.QueueShare <= 0.5 || rd.DirtyPeak != 300*mib || rd.DirtyThrottled {
		t.Errorf("queue share %.2f, dirty peak %v throttled %v; want a queued tail, no throttling", rd.QueueShare, rd.DirtyPeak, rd.DirtyThrottled)
	}
	for _, want := range []string{"waiting in the queue", "under the background threshold", "fsync-writer-"} {
		if !strings.Contains(rd.Explanation, want) {
			t.Errorf("explanation %q does not say %q", rd.Explanation, want)
		}
	}
	if w := rep.Storm.Writers[3]; len(w.DurableSeconds) != 1 || w.DurableSeconds[0] != 1.6 || w.Bytes != 64*mib {
		t.Errorf("writer 3: %+v", w)
	}

	f := finding(t, rep, IDDiskContention)
	if f.Victim != "fsync-writer-3" || len(f.Culprits) != 3 || f.Severity != SeverityCritical {
		t.Errorf("finding %s of %s, culprits %v; want critical, fsync-writer-3 against the three others", f.Severity, f.Victim, f.Culprits)
	}
	if e := evidence(t, f, "fsync_storm_durable", ""); e.Value != 1.6 || e.Baseline != 0.45 || e.Phase != "round-1" {
		t.Errorf("durable evidence %+v: want 1.6 against the median 0.45 in round-1", e)
	}
	dev := Evidence{}
	for _, e := range f.Evidence {
		if e.Metric == "blk_queue_mean" && e.Device == disk && e.Workload == "" {
			dev = e
		}
	}
	if dev.Value <= dev.Baseline {
		t.Errorf("device queue mean %+v: want it above the service mean (its baseline)", dev)
	}
	if e := evidence(t, f, "blk_bytes", "fsync-writer-0"); e.Value != 64*mib || e.Baseline != 64*mib {
		t.Errorf("culprit bytes %+v", e)
	}
}

func TestStormEvenStormHasNoFinding(t *testing.T) {
	rep := stormRun(0, 100<<20, writer(0.4, 64<<20, 0.001), writer(0.42, 64<<20, 0.001), writer(0.45, 64<<20, 0.001)).analyze(t)
	if len(rep.Findings) != 0 {
		t.Errorf("an even storm has findings %v", ids(rep))
	}
	if !strings.Contains(rep.Storm.Rounds[0].Explanation, "the device's own time") {
		t.Errorf("explanation %q: want the device's service time named", rep.Storm.Rounds[0].Explanation)
	}
}

func TestStormDirtyThrottlingAndMissingWriters(t *testing.T) {
	unfinished := writer(0, 0, 0)
	unfinished.finished, unfinished.traced = false, false
	rep := stormRun(0, 3.5*(1<<30), writer(0.4, 64<<20, 0.001), unfinished).analyze(t)
	rd := rep.Storm.Rounds[0]
	if !rd.DirtyThrottled || !strings.Contains(rd.Explanation, "balance_dirty_pages") {
		t.Errorf("dirty peak 3.5 GiB between thresholds 2 and 4 GiB: throttled %v, %q", rd.DirtyThrottled, rd.Explanation)
	}
	if rd.Writers != 1 || len(rep.Storm.Writers[1].DurableSeconds) != 0 {
		t.Errorf("round counts %d writers, writer 1 has %v; want 1 and none", rd.Writers, rep.Storm.Writers[1].DurableSeconds)
	}
	if len(rep.Notes) != 1 || !strings.Contains(rep.Notes[0], "1 of 2 writer fsyncs never returned") {
		t.Errorf("notes %q", rep.Notes)
	}
}

// Writes that take longer than the fsync are the page cache copy's, and the explanation says so
// with the CPU the writers used.
func TestStormWritesDominate(t *testing.T) {
	slow := func() stormWriter {
		w := writer(0.8, 64<<20, 0.001)
		w.write, w.cpu = 0.6, 0.9
		return w
	}
	rep := stormRun(0, 100<<20, slow(), slow()).analyze(t)
	rd := rep.Storm.Rounds[0]
	if !approx(rd.WritersCPUCores, 0.9) || !strings.Contains(rd.Explanation, "the writers kept 0.9 cores busy") {
		t.Errorf("writers' CPU %.2f cores, explanation %q; want 1.8 s over the 2 s storm said", rd.WritersCPUCores, rd.Explanation)
	}
	if even := stormRun(0, 100<<20, writer(0.4, 64<<20, 0.001)).analyze(t); strings.Contains(even.Storm.Rounds[0].Explanation, "The writes, not the fsync") {
		t.Errorf("an fsync-bound storm blames the writes: %q", even.Storm.Rounds[0].Explanation)
	}
}
