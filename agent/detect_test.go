package agent

import (
	"strings"
	"testing"
	"time"

	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

var t0 = time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)

func tick(n int) time.Time { return t0.Add(time.Duration(n) * time.Second) }

func runq(cg string, waits ...time.Duration) rundir.Record {
	var h hist.Log2
	for _, w := range waits {
		k := bucketOf(w)
		for len(h.Buckets) <= k {
			h.Buckets = append(h.Buckets, 0)
		}
		h.Buckets[k]++
		h.Count++
		h.SumNs += uint64(w)
	}
	return rundir.Record{Type: rundir.TypeSample, Metric: rundir.MetricRunqLatency, Cgroup: cg, Hist: &h}
}

func value(metric, cg string, v float64, kv ...string) rundir.Record {
	l := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		l[kv[i]] = kv[i+1]
	}
	return rundir.Record{Type: rundir.TypeSample, Metric: metric, Cgroup: cg, Value: &v, Labels: l}
}

func triggers(fs []firing) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Trigger+" "+f.Cgroup)
	}
	return out
}

func TestDetectorFiresOnceOnEachNewEvidence(t *testing.T) {
	d := newDetector(DefaultTriggers, func(cg string) (string, bool) { return "kubelet", cg == "/kubelet" })
	ms := time.Millisecond
	steps := []struct {
		batch []rundir.Record
		want  []string
	}{
		// First sight sets the references: a stall already counted fires nothing.
		{[]rundir.Record{runq("/a", 2*time.Second), runq("/kubelet", ms),
			value(rundir.MetricCgroupPressure, "/a", 1, rundir.LabelResource, rundir.ResourceMemory, rundir.LabelKind, rundir.PressureFull),
			value(rundir.MetricVmstat, "", 100, rundir.LabelName, vmSwapIn), value(rundir.MetricVmstat, "", 100, rundir.LabelName, vmSwapOut)}, nil},
		// A wait of 1.2 s is in [2^30, 2^31) ns, the first bucket of waits all at least 1 s: a
		// stall; the kubelet's 150 ms is past its 100 ms bound ([2^27, 2^28) ns, from 134 ms);
		// memory full 0.5 s of 1 s; swapping 300 pages/s each way.
		{[]rundir.Record{runq("/a", 2*time.Second, 1200*ms), runq("/kubelet", ms, 150*ms),
			value(rundir.MetricCgroupPressure, "/a", 1.5, rundir.LabelResource, rundir.ResourceMemory, rundir.LabelKind, rundir.PressureFull),
			value(rundir.MetricVmstat, "", 400, rundir.LabelName, vmSwapIn), value(rundir.MetricVmstat, "", 400, rundir.LabelName, vmSwapOut)},
			[]string{"runq_stall /a", "daemon_late /kubelet", "memory_pressure /a", "swap_thrashing "}},
		// Nothing new: nothing fires; a wait of 600 ms is below the stall's bucket (it holds 1 s
		// but begins at 0.54 s); swapping in only.
		{[]rundir.Record{runq("/a", 2*time.Second, 1200*ms, 600*ms), runq("/kubelet", ms, 150*ms, 50*ms),
			value(rundir.MetricCgroupPressure, "/a", 1.51, rundir.LabelResource, rundir.ResourceMemory, rundir.LabelKind, rundir.PressureFull),
			value(rundir.MetricVmstat, "", 1000, rundir.LabelName, vmSwapIn), value(rundir.MetricVmstat, "", 410, rundir.LabelName, vmSwapOut)}, nil},
		{[]rundir.Record{{Type: rundir.TypeEvent, Name: rundir.EventOOMKill, Cgroup: "/b", Time: tick(3), Message: "OOM kill"}},
			[]string{"oom_kill /b"}},
	}
	for i, s := range steps {
		got := triggers(d.observe(tick(i), s.batch))
		if len(got) != len(s.want) {
			t.Fatalf("interval %d fired %q, want %q", i, got, s.want)
		}
		for j := range got {
			if got[j] != s.want[j] {
				t.Errorf("interval %d fired %q, want %q", i, got, s.want)
			}
		}
	}
}

// A cgroup's pressure read in the sampler's rotation (every few intervals) is a rate over the
// time since its own last reading, not over one interval.
func TestDetectorPressureRateOverItsOwnReadings(t *testing.T) {
	d := newDetector(DefaultTriggers, func(string) (string, bool) { return "", false })
	psi := func(v float64) []rundir.Record {
		return []rundir.Record{value(rundir.MetricCgroupPressure, "/a", v, rundir.LabelResource, rundir.ResourceMemory, rundir.LabelKind, rundir.PressureFull)}
	}
	d.observe(tick(0), psi(0))
	d.observe(tick(1), nil)
	d.observe(tick(2), nil)
	d.observe(tick(3), nil)
	d.observe(tick(4), nil)
	// 0.3 s in 5 s is 6%, under 10%, though it is 30% of one interval.
	if got := d.observe(tick(5), psi(0.3)); len(got) != 0 {
		t.Errorf("fired %v", triggers(got))
	}
}

func TestLeaseLateFires(t *testing.T) {
	const kubelet = "/system.slice/kubelet.service"
	d := newDetector(DefaultTriggers, func(cg string) (string, bool) { return "kubelet", cg == kubelet })
	d.name = func(cg string) string { n, _ := d.daemon(cg); return n }
	renewal := func(gap time.Duration) rundir.Record {
		return rundir.LeaseRenewal{RenewTime: tick(0), Gap: gap, LeaseDuration: 40 * time.Second, Holder: "node-a"}.Record(tick(0), kubelet)
	}
	// On time (10 s), within the margin (12.9 s), and none for the first renewal seen.
	for _, gap := range []time.Duration{0, 10 * time.Second, 12900 * time.Millisecond} {
		if fs := d.observe(tick(1), []rundir.Record{renewal(gap)}); len(fs) != 0 {
			t.Errorf("a renewal %v after the previous fired %v", gap, triggers(fs))
		}
	}
	fs := d.observe(tick(2), []rundir.Record{renewal(16 * time.Second)})
	if len(fs) != 1 || fs[0].Trigger != TriggerLeaseLate || fs[0].Cgroup != kubelet || fs[0].Workload != "kubelet" {
		t.Fatalf("a renewal 16s after the previous fired %+v, want lease_late for the kubelet", fs)
	}
	if fs = d.observe(tick(3), []rundir.Record{renewal(45 * time.Second)}); len(fs) != 1 || !strings.Contains(fs[0].Evidence, "NotReady") {
		t.Errorf("a renewal past the Lease's duration: %+v, want evidence saying the node may go NotReady", fs)
	}
}

// ioHist is a histogram of metric in cg with labels kv holding durations ds.
func ioHist(metric, cg string, ds []time.Duration, kv ...string) rundir.Record {
	r := runq(cg, ds...)
	r.Metric = metric
	r.Labels = value(metric, cg, 0, kv...).Labels
	r.Value = nil
	return r
}

// A cgroup's fsync of a second or more fires fsync_stall for it, each of its series (syscall,
// device) on its own; a block request that waited 250 ms or more in a device's queue or in the
// device fires blk_request_wait for the node, whichever cgroup issued it.
func TestDetectorFiresOnSlowIO(t *testing.T) {
	d := newDetector(DefaultTriggers, func(string) (string, bool) { return "", false })
	ms := time.Millisecond
	fsync := func(cg, syscall string, ds ...time.Duration) rundir.Record {
		return ioHist(rundir.MetricFsyncLatency, cg, ds, rundir.LabelSyscall, syscall, rundir.LabelDevice, "254:0")
	}
	queue := func(cg string, ds ...time.Duration) rundir.Record {
		return ioHist(rundir.MetricBlkQueue, cg, ds, rundir.LabelDevice, "254:0", rundir.LabelOp, "write")
	}
	service := func(cg string, ds ...time.Duration) rundir.Record {
		return ioHist(rundir.MetricBlkService, cg, ds, rundir.LabelDevice, "254:0", rundir.LabelOp, "read")
	}
	steps := []struct {
		batch []rundir.Record
		want  []string
	}{
		// First sight: a second-long fsync already counted fires nothing.
		{[]rundir.Record{fsync("/a", "fsync", 2*time.Second), fsync("/a", "fdatasync", ms), queue("/a", ms), queue("", ms), service("/a", time.Second)}, nil},
		// 900 ms is under the fsync bound's bucket (from 1.07 s); 1.2 s is past it. A queue
		// wait of 300 ms is past 250 ms's bucket (from 268 ms), in the root cgroup's requests
		// too; 200 ms in the device is not.
		{[]rundir.Record{fsync("/a", "fsync", 2*time.Second, 900*ms), fsync("/a", "fdatasync", ms, 1200*ms),
			queue("/a", ms), queue("", ms, 300*ms), service("/a", time.Second, 200*ms)}, []string{"fsync_stall /a", "blk_request_wait "}},
		// The same counts again: nothing new; then 400 ms in the device.
		{[]rundir.Record{fsync("/a", "fsync", 2*time.Second, 900*ms), fsync("/a", "fdatasync", ms, 1200*ms),
			queue("/a", ms), queue("", ms, 300*ms), service("/a", time.Second, 200*ms)}, nil},
		{[]rundir.Record{service("/a", time.Second, 200*ms, 400*ms)}, []string{"blk_request_wait "}},
	}
	for i, s := range steps {
		fired := d.observe(tick(i), s.batch)
		if got := triggers(fired); strings.Join(got, ",") != strings.Join(s.want, ",") {
			t.Fatalf("interval %d fired %q, want %q", i, got, s.want)
		}
		for _, f := range fired {
			if !strings.Contains(f.Evidence, "254:0") || !strings.Contains(f.Evidence, "longest at least") {
				t.Errorf("evidence %q names no device or longest", f.Evidence)
			}
		}
	}
	d.forget([]string{"/a"})
	if _, ok := d.slowIO["/a"]; ok {
		t.Error("a removed cgroup's I/O series were kept")
	}
}
