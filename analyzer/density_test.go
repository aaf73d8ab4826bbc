package analyzer

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodectl/nodectl/rundir"
)

const densityNode = "/nodectl/density-r1"

// densityStepSpec is one synthetic step of 10 s: what the node showed in it.
type densityStepSpec struct {
	density             int
	readiness           []float64 // seconds, one per sandbox started in the step
	workingSet, swap    float64   // bytes, peak
	swapFileUsed        float64
	psiFull             float64 // seconds of full pressure in the settled hold (its last 5 s)
	oomKills, swapBusyS float64
	cpuSeconds          float64 // CPU time the node used in the step
}

// densityRun builds a density run of steps; step i runs (10i, 10i+10], its hold from 10i+5.
func densityRun(nodeMem, swapBytes int64, collapse map[string]string, steps ...densityStepSpec) *builder {
	node := rundir.Workload{Name: "node", Kind: "node", Cgroup: densityNode, Device: "254:0"}
	b := &builder{meta: rundir.Meta{ID: "density-r1", Scenario: "density", Node: "node-a", Kernel: "6.18.0", Start: at(-1), Workloads: []rundir.Workload{node}}}
	b.recs = append(b.recs, rundir.Record{Type: rundir.TypeEvent, Time: at(-1), Name: rundir.EventDensityConfig, Labels: map[string]string{
		"node_memory_bytes": strconv.FormatInt(nodeMem, 10), "swap_bytes": strconv.FormatInt(swapBytes, 10), "request_bytes": strconv.Itoa(150 << 20),
		"cpus": "2", "criterion_readiness_p99_seconds": "10", "criterion_psi_full_share": "0.1", "criterion_oom_kill": "1", "criterion_tick_gap_seconds": "5",
	}})
	sample := func(t float64, metric, cg string, v float64, kv ...string) {
		b.recs = append(b.recs, rundir.Record{Type: rundir.TypeSample, Time: at(t), Metric: metric, Cgroup: cg, Labels: labels(kv...), Value: &v})
	}
	var launched, full, ooms, busy, cpu float64
	for i, s := range steps {
		start, hold, end := float64(10*i), float64(10*i+5), float64(10*i+10)
		name := "step-" + strconv.Itoa(s.density)
		b.recs = append(b.recs,
			rundir.Record{Type: rundir.TypePhase, Time: at(start), Name: name, Event: rundir.EventStart},
			rundir.Record{Type: rundir.TypeEvent, Time: at(hold), Name: rundir.EventHold, Labels: map[string]string{"phase": name}},
			rundir.Record{Type: rundir.TypePhase, Time: at(end), Name: name, Event: rundir.EventEnd})
		for j, r := range s.readiness {
			launched++
			sample(start+0.1*float64(j+1), rundir.MetricDensitySandboxes, "", launched)
			sample(start+1, rundir.MetricSandboxReadiness, densityNode+"/sandbox-"+strconv.Itoa(int(launched)-1), r)
		}
		// Cumulative counters at the step's start, hold and end.
		sample(start, rundir.MetricCgroupPressure, densityNode, full, rundir.LabelResource, "memory", rundir.LabelKind, "full")
		sample(hold, rundir.MetricCgroupPressure, densityNode, full, rundir.LabelResource, "memory", rundir.LabelKind, "full")
		full += s.psiFull
		ooms += s.oomKills
		busy += s.swapBusyS
		sample(end, rundir.MetricCgroupPressure, densityNode, full, rundir.LabelResource, "memory", rundir.LabelKind, "full")
		sample(end, rundir.MetricDensityOOMKills, densityNode, ooms)
		sample(start, rundir.MetricCPUUsage, densityNode, cpu)
		cpu += s.cpuSeconds
		sample(end, rundir.MetricCPUUsage, densityNode, cpu)
		sample(end, rundir.MetricDiskIOTime, "", busy, rundir.LabelDevice, "254:0")
		sample(start, rundir.MetricDiskIOTime, "", busy-s.swapBusyS, rundir.LabelDevice, "254:0")
		sample(end-1, rundir.MetricDensityMemory, densityNode, s.workingSet, rundir.LabelName, "working_set")
		sample(end-1, rundir.MetricDensityMemory, densityNode, s.swap, rundir.LabelName, "swap")
		sample(end-1, rundir.MetricDensitySwap, "", s.swapFileUsed, rundir.LabelName, "used")
	}
	if collapse != nil {
		b.recs = append(b.recs, rundir.Record{Type: rundir.TypeEvent, Time: at(float64(10 * len(steps))), Name: rundir.EventCollapse, Labels: collapse})
	}
	return b
}

func TestDensityMemoryCollapseWithoutSwap(t *testing.T) {
	const gi = 1 << 30
	b := densityRun(gi, 0, map[string]string{"density": "6", "signal": "psi-memory-full", "value": "0.4", "bound": "0.1"},
		densityStepSpec{density: 2, readiness: []float64{0.1, 0.2}, workingSet: 0.3 * gi},
		densityStepSpec{density: 4, readiness: []float64{0.1, 0.3}, workingSet: 0.6 * gi},
		densityStepSpec{density: 6, readiness: []float64{0.5, 0.9}, workingSet: 0.99 * gi, psiFull: 2},
	)
	run := b.open(t)
	rep, err := Analyze(run)
	if err != nil {
		t.Fatal(err)
	}
	f := finding(t, rep, IDMemoryCollapse)
	dr := rep.Density
	if dr.MaxStable != 4 || dr.Collapse == nil || dr.Collapse.Density != 6 || dr.Collapse.Signal != "psi-memory-full" {
		t.Fatalf("max stable %d, collapse %+v; want 4 and psi-memory-full at 6", dr.MaxStable, dr.Collapse)
	}
	if len(dr.Steps) != 3 || dr.Steps[2].Started != 2 || dr.Steps[2].Ready != 2 || dr.Steps[2].ReadinessP99 != 0.9 {
		t.Errorf("steps %+v", dr.Steps)
	}
	// Pressure is over the settled hold: 2 s of full in 5 s.
	if got := dr.Steps[2].PSIMemoryFull; got < 0.39 || got > 0.41 {
		t.Errorf("PSI full share of step-6 %.3f, want 0.4 (over the hold, not the step)", got)
	}
	if got := dr.Steps[2].Signals; strings.Join(got, ",") != "psi-memory-full" {
		t.Errorf("signals of step-6 %v, want psi-memory-full", got)
	}
	if dr.Ceiling == nil || dr.Ceiling.Resource != CeilingMemory || dr.Ceiling.ByRequest != 6 {
		t.Errorf("ceiling %+v, want the memory working set, 6 admitted by a 150Mi request in 1Gi", dr.Ceiling)
	}
	if e := evidence(t, f, "density", ""); e.Baseline != 4 || e.Value != 6 || e.Phase != "step-6" {
		t.Errorf("density evidence %+v", e)
	}
	if e := evidence(t, f, "working_set", ""); e.Value != 0.99*gi {
		t.Errorf("working set evidence %+v", e)
	}
	if !strings.Contains(f.Summary, "psi-memory-full crossed first") || !strings.Contains(f.Summary, "no swap") {
		t.Errorf("summary %q", f.Summary)
	}
}

func TestDensityCeiling(t *testing.T) {
	const gi = 1 << 30
	tests := map[string]struct {
		swap int64
		step densityStepSpec
		want string
	}{
		"swap_exhausted":    {swap: gi, step: densityStepSpec{density: 4, readiness: []float64{1, 1}, workingSet: gi, swap: 0.8 * gi, swapFileUsed: 0.95 * gi}, want: CeilingSwap},
		"swap_device_busy":  {swap: gi, step: densityStepSpec{density: 4, readiness: []float64{1, 1}, workingSet: gi, swap: 0.5 * gi, swapBusyS: 9}, want: CeilingSwapIO},
		"working_set":       {swap: gi, step: densityStepSpec{density: 4, readiness: []float64{1, 1}, workingSet: gi, swap: 0.5 * gi, swapBusyS: 2}, want: CeilingMemory},
		"no_swap_oom_kills": {step: densityStepSpec{density: 4, readiness: []float64{1, 1}, workingSet: gi, oomKills: 1}, want: CeilingMemory},
		// 19 s of CPU in a 10 s step on 2 CPUs: saturated. With memory to spare that is the
		// ceiling; with the memory full it is the reclaim and refaults of a memory ceiling.
		"cpu_with_memory_to_spare": {step: densityStepSpec{density: 4, readiness: []float64{1, 1}, workingSet: 0.6 * gi, cpuSeconds: 19}, want: CeilingCPU},
		"cpu_with_memory_full":     {step: densityStepSpec{density: 4, readiness: []float64{1, 1}, workingSet: 0.99 * gi, cpuSeconds: 19}, want: CeilingMemory},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			b := densityRun(gi, tc.swap, map[string]string{"density": "4", "signal": "oom-kill", "value": "1", "bound": "0"},
				densityStepSpec{density: 2, readiness: []float64{0.1, 0.1}, workingSet: 0.5 * gi}, tc.step)
			dr := newAnalysis(b.open(t)).densityTable()
			if dr.Ceiling == nil || dr.Ceiling.Resource != tc.want {
				t.Fatalf("ceiling %+v, want %s", dr.Ceiling, tc.want)
			}
			if dr.MaxStable != 2 {
				t.Errorf("max stable %d, want 2", dr.MaxStable)
			}
		})
	}
}

// A sweep that reached its max without a collapse has no finding and no ceiling.
func TestDensityNoCollapse(t *testing.T) {
	const gi = 1 << 30
	run := densityRun(gi, 0, nil,
		densityStepSpec{density: 2, readiness: []float64{0.1, 0.1}, workingSet: 0.2 * gi},
		densityStepSpec{density: 4, readiness: []float64{0.1, 0.1}, workingSet: 0.4 * gi},
	).open(t)
	rep, err := Analyze(run)
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(rep); len(got) != 0 {
		t.Errorf("findings %v, want none", got)
	}
	dr := rep.Density
	if dr.Collapse != nil || dr.Ceiling != nil || dr.MaxStable != 4 {
		t.Errorf("collapse %+v, ceiling %+v, max stable %d; want none, none, 4", dr.Collapse, dr.Ceiling, dr.MaxStable)
	}
}

// nodectl diff of a sweep without swap and one with it states the density gain.
func TestDiffStatesTheDensityGain(t *testing.T) {
	const gi = 1 << 30
	noSwap := densityRun(gi, 0, map[string]string{"density": "6", "signal": "psi-memory-full", "value": "0.4", "bound": "0.1"},
		densityStepSpec{density: 2, readiness: []float64{0.1, 0.2}, workingSet: 0.3 * gi},
		densityStepSpec{density: 4, readiness: []float64{0.1, 0.3}, workingSet: 0.6 * gi},
		densityStepSpec{density: 6, readiness: []float64{0.5, 0.9}, workingSet: 0.99 * gi, psiFull: 2},
	).open(t)
	withSwap := densityRun(gi, gi, nil,
		densityStepSpec{density: 2, readiness: []float64{0.1, 0.2}, workingSet: 0.3 * gi},
		densityStepSpec{density: 4, readiness: []float64{0.1, 0.3}, workingSet: 0.6 * gi},
		densityStepSpec{density: 6, readiness: []float64{0.2, 0.4}, workingSet: 0.9 * gi, swap: 0.2 * gi},
		densityStepSpec{density: 8, readiness: []float64{0.3, 0.5}, workingSet: 0.95 * gi, swap: 0.4 * gi},
	).open(t)
	d, err := Diff(noSwap, withSwap)
	if err != nil {
		t.Fatal(err)
	}
	dd := d.Density
	if dd == nil || dd.MaxStableA != 4 || dd.MaxStableB != 8 || dd.Gain == nil || *dd.Gain != 2 {
		t.Fatalf("density diff %+v, want 4 → 8, a gain of 2", dd)
	}
	if dd.CollapseA == nil || dd.CollapseA.Signal != "psi-memory-full" || dd.CollapseB != nil {
		t.Errorf("collapses %+v / %+v, want A at psi-memory-full and none in B", dd.CollapseA, dd.CollapseB)
	}
}

// A sweep of pods on a Kubernetes node: the node's memory from /proc/meminfo, the kubelet's
// refusal, and the node Lease's renewals as the agent recorded them.
func TestDensityOfPodsOnANode(t *testing.T) {
	const gi = 1 << 30
	run := func(refused bool, leaseGap float64) *rundir.Run {
		t.Helper()
		collapse := map[string]string{"density": "4", "signal": rundir.SignalAdmission, "value": "1", "bound": "0"}
		if !refused {
			collapse["signal"] = rundir.SignalLeaseLate
		}
		b := densityRun(4*gi, 0, collapse,
			densityStepSpec{density: 2, readiness: []float64{1, 1}},
			densityStepSpec{density: 4, readiness: []float64{1}},
		)
		b.recs[0].Labels["node"] = "node-a"
		b.recs[0].Labels["criterion_lease_late_seconds"] = "3"
		mem := func(t float64, name string, v float64) {
			b.recs = append(b.recs, rundir.Record{Type: rundir.TypeSample, Time: at(t), Metric: rundir.MetricMeminfo, Labels: labels(rundir.LabelName, name), Value: &v})
		}
		mem(0, "MemTotal", 4*gi)
		mem(0, "MemAvailable", 3.5*gi)
		mem(15, "MemAvailable", 3*gi)
		mem(0, "SwapTotal", 0)
		mem(0, "SwapFree", 0)
		if refused {
			// The step's second pod: started, never ready.
			b.recs = append(b.recs, rundir.Record{Type: rundir.TypeSample, Time: at(10.2), Metric: rundir.MetricDensitySandboxes, Value: new(float64(4))},
				rundir.PodEnded{End: rundir.PodEndRefused, Reason: "OutOfpods"}.Record(at(11), "ns/sandbox-3/sandbox-3", "Node didn't have enough resource: pods, requested: 1, used: 16, capacity: 16"))
		}
		renewals := []float64{0, 4, 4 + leaseGap}
		for i, renew := range renewals {
			l := rundir.LeaseRenewal{RenewTime: at(renew), LeaseDuration: 40 * time.Second, Lag: time.Millisecond}
			if i > 0 {
				l.Gap = time.Duration((renew - renewals[i-1]) * float64(time.Second))
			}
			b.recs = append(b.recs, l.Record(at(renew), "/kubelet"))
		}
		return b.open(t)
	}

	rep, err := Analyze(run(true, 10))
	if err != nil {
		t.Fatal(err)
	}
	dr := rep.Density
	at4 := dr.Steps[1]
	if at4.Refused != 1 || !strings.Contains(at4.RefusedReason, "OutOfpods") || at4.Ready != 1 || at4.Started != 2 {
		t.Errorf("step-4 %+v: want one pod ready and one refused (OutOfpods)", at4)
	}
	if got := strings.Join(at4.Signals, ","); got != rundir.SignalAdmission {
		t.Errorf("signals of step-4 %q, want only admission: a refused pod is no readiness to wait for", got)
	}
	if at4.MemoryLimit != 4*gi || at4.WorkingSet != 1*gi || dr.Steps[0].WorkingSet != 0.5*gi {
		t.Errorf("node memory: step-2 %+v, step-4 %+v; want MemTotal less the lowest MemAvailable", dr.Steps[0], at4)
	}
	if dr.Ceiling == nil || dr.Ceiling.Resource != CeilingAdmission || !strings.Contains(dr.Ceiling.Explanation, "OutOfpods") {
		t.Errorf("ceiling %+v, want the kubelet's admission", dr.Ceiling)
	}

	// No refusal, but the kubelet renewed 14 s after the previous renewal: 4 s past its 10 s
	// interval, over the 3 s bound, with memory and CPU to spare.
	rep, err = Analyze(run(false, 14))
	if err != nil {
		t.Fatal(err)
	}
	dr = rep.Density
	if at4 := dr.Steps[1]; at4.LeaseLateMax != 4 || !slices.Contains(at4.Signals, rundir.SignalLeaseLate) {
		t.Errorf("step-4 %+v: want the Lease 4 s late", at4)
	}
	if dr.Steps[0].LeaseLateMax != 0 {
		t.Errorf("step-2 %+v: renewed on time", dr.Steps[0])
	}
	if dr.Ceiling == nil || dr.Ceiling.Resource != CeilingHeartbeat {
		t.Errorf("ceiling %+v, want the node's heartbeat", dr.Ceiling)
	}
}

// A sweep of pods with a CPU request each, refused at admission once their requests filled the
// node's allocatable CPU while its CPUs idled: the ceiling is the kubelet's admission, and the
// bookings the agent read with the run say it was CPU booked, not used; a local sweep has no
// bookings and no such finding.
func TestDensityOfPodsBookedByCPU(t *testing.T) {
	const gi = 1 << 30
	b := densityRun(4*gi, 0, map[string]string{"density": "6", "signal": rundir.SignalAdmission, "value": "1", "bound": "0"},
		densityStepSpec{density: 4, readiness: []float64{1, 1, 1, 1}, cpuSeconds: 0.5},
		densityStepSpec{density: 6, readiness: []float64{1}, cpuSeconds: 0.5},
	)
	b.recs[0].Labels["node"] = "node-a"
	b.recs[0].Labels["cpu_request_milli"] = "396"
	b.recs = append(b.recs, rundir.PodEnded{End: rundir.PodEndRefused, Reason: "OutOfcpu"}.Record(at(11), "ns/sandbox-5/sandbox-5",
		"Node didn't have enough resource: cpu, requested: 396, used: 2000, capacity: 2000"))
	local := b.open(t)
	if rep, err := Analyze(local); err != nil || slices.Contains(ids(rep), IDCPUBookingCeiling) {
		t.Fatalf("a sweep without bookings: %v, findings %v", err, ids(rep))
	}
	b.meta.Booking = &rundir.Booking{AllocatableCPUMilli: 2000, AllocatableMemory: 4 * gi, MaxPods: 16, Pods: 6,
		RequestedCPUMilli: 5*396 + 20, RequestedMemory: gi, SmallestCPURequest: 20}
	rep, err := Analyze(b.open(t))
	if err != nil {
		t.Fatal(err)
	}
	if c := rep.Density.Ceiling; c == nil || c.Resource != CeilingAdmission || !strings.Contains(c.Explanation, "OutOfcpu") {
		t.Errorf("ceiling %+v, want the kubelet's admission (OutOfcpu)", c)
	}
	f := finding(t, rep, IDCPUBookingCeiling)
	if f.Severity != SeverityWarning || !strings.Contains(f.Summary, "booked full by CPU requests") {
		t.Errorf("%s %s: %s; want a warning that CPU requests, not use, filled the node", f.ID, f.Severity, f.Summary)
	}
	if e := evidence(t, f, "cpu_used", ""); e.Value > 0.1 || e.Phase != "step-6" {
		t.Errorf("cpu_used %+v, want the idle sandboxes' CPU over the last step", e)
	}
	if cfg := rundir.ParseDensityConfig(b.recs[0].Labels); cfg.CPURequestMilli != 396 {
		t.Errorf("config %+v: want the sandboxes' CPU request", cfg)
	}
}

// A sweep of pods has no swap of its own: the node's swap, from meminfo and its swap areas
// (the disk serving the one used most), bounds it as a local sweep's swap file does.
func TestDensityOfPodsWithTheNodesSwap(t *testing.T) {
	const gi = 1 << 30
	for name, tc := range map[string]struct {
		swapFree, busy float64
		want           string
	}{
		"swap_device_busy": {swapFree: 1.5 * gi, busy: 9, want: CeilingSwapIO},
		"swap_exhausted":   {swapFree: 0.02 * gi, busy: 2, want: CeilingSwap},
	} {
		t.Run(name, func(t *testing.T) {
			b := densityRun(4*gi, 0, map[string]string{"density": "4", "signal": "psi-memory-full", "value": "0.4", "bound": "0.1"},
				densityStepSpec{density: 2, readiness: []float64{1, 1}},
				densityStepSpec{density: 4, readiness: []float64{1, 1}, psiFull: 2},
			)
			b.recs[0].Labels["node"] = "node-a"
			b.meta.Workloads[0].Device = "" // a sweep of pods knows no device of its own
			sample := func(t float64, metric string, v float64, kv ...string) {
				b.recs = append(b.recs, rundir.Record{Type: rundir.TypeSample, Time: at(t), Metric: metric, Labels: labels(kv...), Value: &v})
			}
			for _, t := range []float64{0, 10, 19} {
				sample(t, rundir.MetricMeminfo, 4*gi, rundir.LabelName, "MemTotal")
				sample(t, rundir.MetricMeminfo, 0.1*gi, rundir.LabelName, "MemAvailable")
				sample(t, rundir.MetricMeminfo, 2*gi, rundir.LabelName, "SwapTotal")
				sample(t, rundir.MetricMeminfo, tc.swapFree, rundir.LabelName, "SwapFree")
				// Two swap areas: the local SSD's, used, and an idle one on the boot disk.
				sample(t, rundir.MetricSwapArea, 2*gi-tc.swapFree, rundir.LabelPath, "/dev/nvme1n1", rundir.LabelDevice, "259:1", rundir.LabelName, "used")
				sample(t, rundir.MetricSwapArea, 0, rundir.LabelPath, "/var/swap", rundir.LabelDevice, "254:0", rundir.LabelName, "used")
			}
			sample(10, rundir.MetricDiskIOTime, 0, rundir.LabelDevice, "259:1")
			sample(20, rundir.MetricDiskIOTime, tc.busy, rundir.LabelDevice, "259:1")
			// Two sandboxes' containers with LimitedSwap's share each (their pods have none);
			// the second filled it.
			for i, used := range []float64{64 << 20, 250 << 20} {
				c := densityNode + "/sandbox-" + strconv.Itoa(i) + "/c"
				b.points(rundir.MetricMemorySwapLimit, c, []float64{15, 256 << 20}).points(rundir.MetricMemorySwap, c, []float64{15, used})
			}
			dr := newAnalysis(b.open(t)).densityTable()
			if dr.Ceiling == nil || dr.Ceiling.Resource != tc.want {
				t.Fatalf("ceiling %+v, want %s", dr.Ceiling, tc.want)
			}
			at4 := dr.Steps[1]
			if at4.SwapLimits != 512<<20 || at4.SwapLimitMax != 256<<20 || at4.SwapLimited != 2 || at4.AtSwapLimit != 1 {
				t.Errorf("step-4 swap limits %v in all (largest %v) of %d cgroups, %d at theirs; want 512 MiB, 256 MiB, 2, 1",
					at4.SwapLimits, at4.SwapLimitMax, at4.SwapLimited, at4.AtSwapLimit)
			}
			if !strings.Contains(dr.Ceiling.Explanation, "2 cgroups have a swap limit of their own") {
				t.Errorf("ceiling %q says nothing of the pods' swap limits", dr.Ceiling.Explanation)
			}
			if at4.SwapSize != 2*gi || at4.SwapUsed != 2*gi-tc.swapFree || at4.SwapDeviceBusy != tc.busy/10 {
				t.Errorf("step-4 swap %v of %v, device busy %v; want the node's swap and its SSD's %v", at4.SwapUsed, at4.SwapSize, at4.SwapDeviceBusy, tc.busy/10)
			}
		})
	}
}

// Evicted binaries read back from a disk at its cap bound a sweep before its memory did: the
// file refaults are most of what the disk read, and it was busy nearly all the step.
func TestDensityBoundByDiskRefaults(t *testing.T) {
	const gi = 1 << 30
	for name, tc := range map[string]struct {
		refaults, readMiB, busy float64 // in the collapsed step (10 s): file refaults, MiB read, busy seconds
		want                    string
	}{
		"refaults_at_the_disks_cap":  {refaults: 20000, readMiB: 100, busy: 9.5, want: CeilingDiskRefaults},
		"disk_idle":                  {refaults: 20000, readMiB: 100, busy: 2, want: CeilingMemory},
		"disk_busy_with_other_reads": {refaults: 2000, readMiB: 900, busy: 9.5, want: CeilingMemory},
	} {
		t.Run(name, func(t *testing.T) {
			b := densityRun(gi, 0, map[string]string{"density": "4", "signal": "psi-memory-full", "value": "0.4", "bound": "0.1"},
				densityStepSpec{density: 2, readiness: []float64{0.1, 0.1}, workingSet: 0.5 * gi},
				densityStepSpec{density: 4, readiness: []float64{1, 1}, workingSet: 0.85 * gi, psiFull: 2})
			b.points(rundir.MetricMemoryRefaults, densityNode, []float64{0, 0, 10, 100, 20, 100 + tc.refaults}, rundir.LabelKind, "file").
				points(rundir.MetricDiskBytes, "", []float64{0, 0, 10, 1 << 20, 20, 1<<20 + tc.readMiB*(1<<20)}, rundir.LabelDevice, "8:0", rundir.LabelOp, "read").
				points(rundir.MetricDiskIOTime, "", []float64{0, 0, 10, 0.5, 20, 0.5 + tc.busy}, rundir.LabelDevice, "8:0")
			dr := newAnalysis(b.open(t)).densityTable()
			if dr.Ceiling == nil || dr.Ceiling.Resource != tc.want {
				t.Fatalf("ceiling %+v, want %s", dr.Ceiling, tc.want)
			}
			if tc.want == CeilingDiskRefaults && (dr.Ceiling.Disk != "8:0" || dr.Ceiling.DiskBusy != 0.95) {
				t.Errorf("ceiling %+v, want disk 8:0 busy 95%%", dr.Ceiling)
			}
		})
	}
}
