package analyzer

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodectl/nodectl/rundir"
)

func TestObservedContentionNamesPods(t *testing.T) {
	b := agentWindow()
	b.meta.Pods = []rundir.Pod{
		{Cgroup: victim, Name: "shop/web-0/app", Kind: "container", Namespace: "shop", Pod: "web-0", Container: "app"},
		{Cgroup: cpuHog0, Name: "batch/hog-a", Kind: "pod", Namespace: "batch", Pod: "hog-a", Sandbox: true},
		{Cgroup: runCg + "/cpu-hog", Name: "batch/hog-b", Kind: "pod", Namespace: "batch", Pod: "hog-b"}, // cpu-hog-1 is not below it
	}
	rep := b.analyze(t)
	f := finding(t, rep, IDCPUContention)
	if f.Victim != "shop/web-0/app" {
		t.Errorf("victim %q, want the container's name", f.Victim)
	}
	if !slices.Equal(f.Culprits, []string{"batch/hog-a", cpuHog1}) {
		t.Errorf("culprits %v, want the named pod and the unnamed cgroup by its path", f.Culprits)
	}
}

const kubelet = "/system.slice/kubelet.service"

// leaseWindow is an agent window whose kubelet renewed its 40 s Lease every 10 s, but once
// gap seconds after the previous renewal, seen at the window's end (30 s).
func leaseWindow(gap float64) *builder {
	b := newRun(rundir.Workload{Name: "kubelet", Kind: rundir.KindDaemon, Cgroup: kubelet})
	b.meta.Scenario = rundir.ScenarioAgent
	for i := range b.recs {
		if b.recs[i].Name == rundir.PhaseStress {
			b.recs[i].Name = rundir.PhaseWindow
		}
	}
	renew := func(t, gap float64) {
		l := rundir.LeaseRenewal{RenewTime: at(t), Gap: time.Duration(gap * float64(time.Second)),
			LeaseDuration: 40 * time.Second, Holder: "node-a"}
		b.recs = append(b.recs, l.Record(at(t), kubelet))
	}
	renew(5, 10)
	renew(30-gap, 10)
	renew(30, gap)
	return b
}

func TestLeaseLateStopped(t *testing.T) {
	// The kubelet stopped: no CPU, no waits over the gap.
	b := leaseWindow(15).counter(rundir.MetricCPUUsage, kubelet, 0.2, 0)
	f := finding(t, b.analyze(t), IDLeaseLate)
	if f.Severity != SeverityWarning || len(f.Culprits) != 0 {
		t.Errorf("severity %s, culprits %v; want a warning naming no culprit", f.Severity, f.Culprits)
	}
	if e := evidence(t, f, "lease_renewal_gap_seconds", ""); e.Value != 15 || e.Baseline != 10 {
		t.Errorf("gap evidence %+v, want 15 s against the 10 s interval", e)
	}
	if !strings.Contains(f.Summary, "did not run") {
		t.Errorf("summary %q does not say the kubelet did not run", f.Summary)
	}
}

func TestLeaseLatePreempted(t *testing.T) {
	// Over the gap (15 s to 30 s) the kubelet waited 8 s for a CPU behind a pod.
	b := leaseWindow(15).counter(rundir.MetricCPUUsage, kubelet, 0.2, 0.4).
		histogram(rundir.MetricRunqLatency, kubelet, lat(100, 1e-4), lat(40, 0.2)).
		counter(rundir.MetricRunqPreemptWait, kubelet, 0, 8, rundir.LabelPreemptor, cpuHog0)
	b.meta.Pods = []rundir.Pod{{Cgroup: cpuHog0, Name: "batch/hog-a", Kind: "pod"}}
	f := finding(t, b.analyze(t), IDLeaseLate)
	if !slices.Equal(f.Culprits, []string{"batch/hog-a"}) {
		t.Errorf("culprits %v, want the pod that preempted the kubelet", f.Culprits)
	}
	if !strings.Contains(f.Summary, "waited") {
		t.Errorf("summary %q does not say the kubelet waited for a CPU", f.Summary)
	}
}

func TestLeaseOnTimeGivesNothing(t *testing.T) {
	b := leaseWindow(10.5).counter(rundir.MetricCPUUsage, kubelet, 0.2, 0.4)
	if rep := b.analyze(t); slices.Contains(ids(rep), IDLeaseLate) {
		t.Errorf("renewals 10.5 s apart gave %v", ids(rep))
	}
	// Past the lease duration: critical.
	b = leaseWindow(18).counter(rundir.MetricCPUUsage, kubelet, 0.2, 0.2)
	b.recs = append(b.recs, rundir.LeaseRenewal{RenewTime: at(29), Gap: 41 * time.Second, LeaseDuration: 40 * time.Second}.Record(at(29.5), kubelet))
	if f := finding(t, b.analyze(t), IDLeaseLate); f.Severity != SeverityCritical {
		t.Errorf("a 41 s gap of a 40 s Lease is %s, want critical", f.Severity)
	}
}

// bookedWindow: an agent window on a 2-core node whose pods request req millicores and whose
// cgroups used cpu seconds over the 20 s window.
func bookedWindow(req int64, cpu float64) *builder {
	b := agentWindow()
	b.meta.Booking = &rundir.Booking{AllocatableCPUMilli: 2000, AllocatableMemory: 4 << 30, MaxPods: 110,
		Pods: req / 50, RequestedCPUMilli: req, RequestedMemory: 1 << 30, SmallestCPURequest: 50}
	return b.counter(rundir.MetricCPUUsage, cpuHog0, 0, cpu)
}

func TestBookingCeiling(t *testing.T) {
	// 1,900m of 2,000m booked, 0.3 cores used: bookings, not the kernel, are the ceiling.
	f := finding(t, bookedWindow(1900, 2).analyze(t), IDCPUBookingCeiling)
	if f.Severity != SeverityWarning {
		t.Errorf("severity %s, want warning for a node booked full and idle", f.Severity)
	}
	if e := evidence(t, f, "cpu_booked", ""); e.Value != 1.9 || e.Baseline != 2 {
		t.Errorf("cpu_booked %+v, want 1.9 of 2 cores", e)
	}
	if !strings.Contains(f.Summary, "2 more pods of the smallest request") {
		t.Errorf("summary %q does not say how many more 50m pods fit", f.Summary)
	}
	// Booked and used alike: info.
	if f := finding(t, bookedWindow(1900, 36).analyze(t), IDCPUBookingCeiling); f.Severity != SeverityInfo {
		t.Errorf("a node booked and busy is %s, want info", f.Severity)
	}
	// Half booked: no finding.
	if rep := bookedWindow(1000, 2).analyze(t); slices.Contains(ids(rep), IDCPUBookingCeiling) {
		t.Errorf("a half-booked node gave %v", ids(rep))
	}
}

// The kubelet stopped for 12 s of a 15 s gap, then caught up: its CPU over the whole gap is
// no less than its baseline rate, but its CPU time stood still for 12 s, which it never did
// in the baseline.
func TestLeaseLateStoppedThenBusy(t *testing.T) {
	b := leaseWindow(15)
	b.meta.Interval = rundir.Duration(time.Second)
	var tv []float64
	cpu := 0.0
	for s := 0.0; s <= 30; s++ {
		switch {
		case s <= 16:
			cpu += 0.02
		case s < 29:
			continue // stopped: no change, so no sample
		default:
			cpu += 0.5
		}
		tv = append(tv, s, cpu)
	}
	b.points(rundir.MetricCPUUsage, kubelet, tv)
	f := finding(t, b.analyze(t), IDLeaseLate)
	if !strings.Contains(f.Summary, "did not run at all for 12") {
		t.Errorf("summary %q does not say the kubelet did not run for 12 s", f.Summary)
	}
	if e := evidence(t, f, "cpu_stopped_seconds", ""); e.Value != 12 || e.Baseline != 0 {
		t.Errorf("stopped evidence %+v, want 12 s against none in the baseline", e)
	}
}
