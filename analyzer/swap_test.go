package analyzer

import (
	"testing"

	"github.com/nodectl/nodectl/rundir"
)

const sandbox = runCg + "/sandbox-0"

func sandboxWorkload() rundir.Workload {
	return rundir.Workload{Name: "sandbox-0", Kind: "sandbox", Cgroup: sandbox, Memory: "64Mi"}
}

// points records a counter with the given (time, value) samples.
func (b *builder) points(metric, cgroup string, tv []float64, kv ...string) *builder {
	for i := 0; i+1 < len(tv); i += 2 {
		v := tv[i+1]
		b.recs = append(b.recs, rundir.Record{Type: rundir.TypeSample, Time: at(tv[i]), Metric: metric, Cgroup: cgroup, Labels: labels(kv...), Value: &v})
	}
	return b
}

// thrashing is a sandbox at its limit in the stress phase (20 s): 64 MiB in swap, majors and
// anon refaults at majors/20 and refaults/20 a second, evenly over the phase.
func thrashing(cg string, majors, refaults float64) *builder {
	return newRun(sandboxWorkload()).thrash(cg, majors, refaults)
}

func (b *builder) thrash(cg string, majors, refaults float64) *builder {
	return b.gauge(rundir.MetricMemorySwap, cg, []float64{0}, []float64{64 << 20}).
		counter(rundir.MetricMemoryMajorFaults, cg, 0, majors).
		counter(rundir.MetricMemoryRefaults, cg, 0, refaults, rundir.LabelKind, "anon").
		counter(rundir.MetricMemoryLimitEvents, cg, 0, 5000, rundir.LabelKind, "max")
}

func (b *builder) nodeSwap(in, out float64) *builder {
	return b.counter(rundir.MetricVmstat, "", 0, in, rundir.LabelName, "pswpin").
		counter(rundir.MetricVmstat, "", 0, out, rundir.LabelName, "pswpout")
}

func swapFindings(rep *Report) []Finding {
	var out []Finding
	for _, f := range rep.Findings {
		if f.ID == IDSwapThrashing {
			out = append(out, f)
		}
	}
	return out
}

func TestSwapThrashing(t *testing.T) {
	rep := thrashing(sandbox, 10000, 12000).nodeSwap(8000, 9000).analyze(t)
	found := swapFindings(rep)
	if len(found) != 2 {
		t.Fatalf("%d swap-thrashing findings, want the sandbox's and the node's: %+v", len(found), found)
	}
	f := found[0]
	if f.Victim != "sandbox-0" || f.Severity != SeverityWarning || len(f.Culprits) != 0 {
		t.Errorf("finding %s/%s culprits %v, want a warning for sandbox-0 with no culprits", f.Victim, f.Severity, f.Culprits)
	}
	for metric, want := range map[string]float64{
		"memory_swap_bytes_max": 64 << 20, "major_faults": 10000, "anon_refaults": 12000, "memory_limit_hits": 5000,
	} {
		e := evidence(t, f, metric, "")
		if e.Value != want || e.Baseline != 0 || e.Phase != rundir.PhaseStress || e.Workload != "sandbox-0" {
			t.Errorf("%s: %+v, want %v in stress against 0", metric, e, want)
		}
	}
	for _, e := range f.Evidence {
		if e.Metric == "swap_ins" {
			t.Error("swap_ins evidence without swap-in records (a v1 host has none)")
		}
	}
	t.Log(f.Summary)

	node := found[1]
	if node.Victim != "node" || len(node.Culprits) != 1 || node.Culprits[0] != "sandbox-0" {
		t.Errorf("node finding %s culprits %v, want the node with sandbox-0", node.Victim, node.Culprits)
	}
	if e := evidence(t, node, "pswpin", ""); e.Value != 8000 {
		t.Errorf("pswpin %v, want 8000", e.Value)
	}
	if e := evidence(t, node, "fault_backs", "sandbox-0"); e.Value != 12000 {
		t.Errorf("fault-backs of sandbox-0 %v, want the highest of its counts, 12000", e.Value)
	}
	t.Log(node.Summary)
}

func TestSwapThrashingCritical(t *testing.T) {
	rep := thrashing(sandbox, 30000, 0).counter(rundir.MetricMemorySwapPages, sandbox, 0, 25000, rundir.LabelOp, "in").analyze(t)
	f := finding(t, rep, IDSwapThrashing)
	if f.Severity != SeverityCritical {
		t.Errorf("severity %s at 1500 fault-backs a second, want critical", f.Severity)
	}
	if e := evidence(t, f, "swap_ins", ""); e.Value != 25000 {
		t.Errorf("swap_ins %v, want 25000", e.Value)
	}
}

// A parent's counters include its child's: only the child is reported.
func TestSwapThrashingDeepest(t *testing.T) {
	rep := thrashing(sandbox, 10000, 0).thrash(runCg, 10000, 0).analyze(t)
	found := swapFindings(rep)
	if len(found) != 1 || found[0].Victim != "sandbox-0" {
		t.Fatalf("findings %+v, want sandbox-0's only", found)
	}
}

func TestSwapThrashingNot(t *testing.T) {
	for name, b := range map[string]*builder{
		// Cold memory swapped out and left there: nothing comes back.
		"swapped_out_cold": newRun(sandboxWorkload()).
			gauge(rundir.MetricMemorySwap, sandbox, []float64{0}, []float64{64 << 20}).
			counter(rundir.MetricMemoryMajorFaults, sandbox, 0, 100),
		// Major faults of file pages (a binary re-read) without swap are another story.
		"no_swap": newRun(sandboxWorkload()).
			gauge(rundir.MetricMemorySwap, sandbox, []float64{0}, []float64{0}).
			counter(rundir.MetricMemoryMajorFaults, sandbox, 0, 50000),
		// A burst of fault-backs at the start of the phase that stops: not kept up.
		"burst": newRun(sandboxWorkload()).
			gauge(rundir.MetricMemorySwap, sandbox, []float64{0}, []float64{64 << 20}).
			points(rundir.MetricMemoryMajorFaults, sandbox, []float64{0, 0, 10, 0, 12, 20000, 20, 20000, 30, 20100}),
		// The node swaps out but reads nothing back.
		"node_out_only": newRun(sandboxWorkload()).nodeSwap(100, 50000),
		"quiet":         newRun(sandboxWorkload()),
		// Counters first read at 0.5 s hold what happened before the run (since boot, for the
		// node's): only their growth from that reading on counts.
		"counted_before": newRun(sandboxWorkload()).
			gauge(rundir.MetricMemorySwap, sandbox, []float64{64 << 20}, []float64{64 << 20}).
			points(rundir.MetricMemoryMajorFaults, sandbox, []float64{0.5, 1e6, 10, 1e6, 30, 1e6}).
			points(rundir.MetricVmstat, "", []float64{0.5, 1e6, 10, 1e6, 30, 1e6}, rundir.LabelName, "pswpin").
			points(rundir.MetricVmstat, "", []float64{0.5, 1e6, 10, 1e6, 30, 1e6}, rundir.LabelName, "pswpout"),
	} {
		t.Run(name, func(t *testing.T) {
			if found := swapFindings(b.analyze(t)); len(found) != 0 {
				t.Fatalf("findings %+v, want none", found)
			}
		})
	}
}

// Samples far apart: the window is cut at the sample nearest its middle (21 s), not at 20 s,
// where the first half would hold no sample and so no faults.
func TestSwapThrashingSparseSamples(t *testing.T) {
	rep := newRun(sandboxWorkload()).
		gauge(rundir.MetricMemorySwap, sandbox, []float64{0}, []float64{64 << 20}).
		points(rundir.MetricMemoryMajorFaults, sandbox, []float64{0, 0, 10, 0, 21, 11000, 30, 20000}).
		analyze(t)
	f := finding(t, rep, IDSwapThrashing)
	if e := evidence(t, f, "major_faults", ""); e.Value != 20000 {
		t.Errorf("major faults %v, want 20000", e.Value)
	}
}

// A pod container laid out as the kubelet lays it, with a swap limit of a quarter of the node's
// swap (LimitedSwap): its swap reaches the limit while it hits its memory limit, and the node's
// swap is mostly free. The pod's own parent has no limit of its own.
func TestSwapLimit(t *testing.T) {
	const (
		pod       = "/kubepods/burstable/pod1"
		container = pod + "/c1"
	)
	for name, tc := range map[string]struct {
		swap, swapHits, kills float64
		want                  string // severity, "" for no finding
	}{
		"full_and_oom_killed": {swap: 31 << 20, kills: 1, want: SeverityCritical},
		"full_hitting_limit":  {swap: 30 << 20, want: SeverityWarning},
		"room_left":           {swap: 16 << 20},
		// Killed between two samples: the swap read low, the kernel's refusals say it was full.
		"refused_swap": {swap: 2 << 20, swapHits: 40, kills: 1, want: SeverityCritical},
	} {
		t.Run(name, func(t *testing.T) {
			b := newRun().
				gauge(rundir.MetricMemorySwapLimit, container, []float64{32 << 20}, []float64{32 << 20}).
				gauge(rundir.MetricMemorySwap, container, []float64{0}, []float64{tc.swap}).
				gauge(rundir.MetricMemorySwap, pod, []float64{0}, []float64{tc.swap}).
				counter(rundir.MetricMemoryLimitEvents, container, 0, 500, rundir.LabelKind, "max").
				counter(rundir.MetricMemoryOOMKills, container, 0, tc.kills).
				counter(rundir.MetricMemoryLimitEvents, container, 0, tc.swapHits, rundir.LabelKind, "swap")
			b.points(rundir.MetricMeminfo, "", []float64{0, 128 << 20, 15, 128 << 20, 25, 128 << 20}, rundir.LabelName, "SwapTotal").
				points(rundir.MetricMeminfo, "", []float64{0, 128 << 20, 15, 96 << 20, 25, 90 << 20}, rundir.LabelName, "SwapFree")
			var got []Finding
			for _, f := range b.analyze(t).Findings {
				if f.ID == IDSwapLimit {
					got = append(got, f)
				}
			}
			if tc.want == "" {
				if len(got) != 0 {
					t.Fatalf("findings %+v with room left under the limit", got)
				}
				return
			}
			if len(got) != 1 || got[0].Victim != container || got[0].Severity != tc.want {
				t.Fatalf("swap-limit findings %+v, want one %s for %s", got, tc.want, container)
			}
			f := got[0]
			t.Log(f.Summary)
			if e := evidence(t, f, "swap_limit_node_share", ""); e.Value != 0.25 {
				t.Errorf("share of the node's swap %+v, want 0.25 (32 MiB of 128)", e)
			}
			if e := evidence(t, f, "node_swap_free_bytes", ""); e.Value != 90<<20 {
				t.Errorf("node swap free %+v, want the window's least, 90 MiB", e)
			}
			if e := evidence(t, f, rundir.MetricMemorySwapLimit, ""); e.Value != 32<<20 || e.Phase != rundir.PhaseStress {
				t.Errorf("limit %+v", e)
			}
		})
	}
}

// With the swap area's disk known, a thrashing cgroup's reads there are its swap-ins, which its
// tasks waited for, and the root cgroup's writes there are kswapd's swap-outs, the node's.
func TestSwapThrashingWaitsOnTheSwapDevice(t *testing.T) {
	const ssd = "259:1"
	dev := func(op string) []string { return []string{rundir.LabelDevice, ssd, rundir.LabelOp, op} }
	b := thrashing(sandbox, 10000, 12000).nodeSwap(8000, 9000).
		gauge(rundir.MetricSwapArea, "", []float64{0}, []float64{64 << 20})
	for i := range b.recs {
		if b.recs[i].Metric == rundir.MetricSwapArea {
			b.recs[i].Labels = labels(rundir.LabelPath, "/dev/nvme1n1", rundir.LabelDevice, ssd, rundir.LabelName, "used")
		}
	}
	b.histogram(rundir.MetricBlkQueue, sandbox, lat(0, 0), lat(9000, 10e-6), dev("read")...).
		histogram(rundir.MetricBlkService, sandbox, lat(0, 0), lat(9000, 2e-3), dev("read")...).
		counter(rundir.MetricBlkBytes, sandbox, 0, 9000*4096, dev("read")...).
		histogram(rundir.MetricBlkQueue, "/", lat(0, 0), lat(300, 1e-3), dev("write")...).
		histogram(rundir.MetricBlkService, "/", lat(0, 0), lat(300, 8e-3), dev("write")...).
		counter(rundir.MetricBlkBytes, "/", 0, 36<<20, dev("write")...)
	found := swapFindings(b.analyze(t))
	if len(found) != 2 {
		t.Fatalf("findings %+v, want the sandbox's and the node's", found)
	}
	if e := evidence(t, found[0], "swap_device_reads_requests", ""); e.Value != 9000 || e.Device != ssd {
		t.Errorf("the sandbox's swap-ins %+v, want 9000 reads on %s", e, ssd)
	}
	if e := evidence(t, found[0], "swap_device_reads_wait_seconds", ""); e.Value < 9000*2e-3 || e.Value > 9000*4.1e-3 {
		t.Errorf("their wait %+v, want about 9000 × 2-4 ms (log2 buckets)", e)
	}
	if e := evidence(t, found[1], "swap_device_node_writes_bytes", ""); e.Value != 36<<20 {
		t.Errorf("the node's swap-outs %+v, want root's 36 MiB", e)
	}
	t.Log(found[0].Summary)
	t.Log(found[1].Summary)
}
