package analyzer

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nodectl/nodectl/internal/human"
	"github.com/nodectl/nodectl/rundir"
)

// IDLeaseLate: the kubelet renewed the node's Lease late (docs/findings.md).
const IDLeaseLate = "lease-late"

// The kubelet renews its Lease every quarter of the Lease's duration (10 s of 40 s); a renewal
// leaseLateMargin later than that is late: the agent's default lease_late trigger.
const (
	leaseRenewFraction = 4
	leaseLateMargin    = 3 * time.Second
	// A kernel cause accounts for the lateness when it took at least this share of it.
	leaseCauseShare = 0.25
	// The kubelet "did not run" over the gap when it used less CPU than this share of its
	// baseline rate, or than this share of a core.
	leaseIdleOfBaseline = 0.25
	leaseIdleShare      = 0.01
	// Or when its CPU time stood still for at least this share of the lateness, and for more
	// than twice its longest such stretch in the baseline.
	leaseStoppedShare = 0.5
)

// leaseLate explains the latest-coming renewal of the node's Lease in the window from the
// kubelet's side, over the gap before it: the neighbours that kept it off a CPU, reclaim and
// fsync stalls, swap-in, or none of these (it was stopped, or blocked in user space).
func (a *analysis) leaseLate(rep *Report) {
	var worst rundir.LeaseRenewal
	var cg string
	for _, r := range a.run.Records {
		l, ok := rundir.ParseLeaseRenewal(r)
		if !ok || l.Resync || r.Time.Before(a.stress.Start) || r.Time.After(a.stress.End) || l.LeaseDuration <= 0 {
			continue
		}
		if l.Gap < l.LeaseDuration/leaseRenewFraction+leaseLateMargin || l.Gap <= worst.Gap {
			continue
		}
		worst, cg = l, r.Cgroup
	}
	if worst.Gap == 0 {
		return
	}
	if cg == "" {
		cg = a.kubeletCgroup()
	}
	if f := a.explainLease(worst, cg); f != nil {
		rep.Findings = append(rep.Findings, *f)
	}
}

// kubeletCgroup is the cgroup of the daemon workload named kubelet, "" when none.
func (a *analysis) kubeletCgroup() string {
	for _, w := range a.run.Meta.Workloads {
		if w.Kind == rundir.KindDaemon && slices.Contains(strings.Split(w.Name, "+"), "kubelet") {
			return w.Cgroup
		}
	}
	return ""
}

func (a *analysis) explainLease(l rundir.LeaseRenewal, cg string) *Finding {
	interval := l.LeaseDuration / leaseRenewFraction
	late := (l.Gap - interval).Seconds()
	gap := rundir.Window{Name: a.stress.Name, Start: l.RenewTime.Add(-l.Gap), End: l.RenewTime}
	sev := SeverityWarning
	if l.Gap >= l.LeaseDuration {
		sev = SeverityCritical
	}
	f := &Finding{ID: IDLeaseLate, Severity: sev, Victim: "kubelet",
		Evidence: []Evidence{{Metric: "lease_renewal_gap_seconds", Workload: "kubelet", Phase: a.stress.Name,
			Baseline: interval.Seconds(), Value: l.Gap.Seconds(), Unit: UnitSeconds}}}
	head := fmt.Sprintf("the kubelet renewed the node's Lease %s after the previous renewal (it renews every %s; the Lease lasts %s)",
		human.Seconds(l.Gap.Seconds()), human.Seconds(interval.Seconds()), human.Seconds(l.LeaseDuration.Seconds()))
	if cg == "" {
		f.Summary = head + ": the kubelet's process was not found, so the kernel's side is unknown."
		return f
	}
	ev := func(metric string, v float64, unit string) {
		f.Evidence = append(f.Evidence, Evidence{Metric: metric, Workload: "kubelet", Phase: a.stress.Name, Value: v, Unit: unit})
	}
	runq := a.run.Series(rundir.MetricRunqLatency).Cgroup(cg).HistDelta(gap)
	waited := secs(runq.SumNs)
	usage := a.run.Series(rundir.MetricCPUUsage).Cgroup(cg)
	ran := usage.Delta(gap)
	idle := max(leaseIdleShare, leaseIdleOfBaseline*ratio(usage.Delta(a.baseline), a.baseline.Seconds())) * l.Gap.Seconds()
	step := time.Duration(a.run.Meta.Interval)
	stopped, stoppedBefore := usage.LongestFlat(gap, step), usage.LongestFlat(a.baseline, step)
	stalls := a.reclaimStallsOf(cg, gap)
	fsync := secs(a.run.Series(rundir.MetricFsyncLatency).Cgroup(cg).HistDelta(gap).SumNs)
	swapIn := a.run.Series(rundir.MetricVmstat).Label(rundir.LabelName, "pswpin").Delta(gap)
	ev("runq_wait_seconds", waited, UnitSeconds)
	ev("runq_latency_max", runq.LongestAtLeast(), UnitSeconds)
	ev("cpu_usage_seconds", ran, UnitSeconds)
	f.Evidence = append(f.Evidence, Evidence{Metric: "cpu_stopped_seconds", Workload: "kubelet", Phase: a.stress.Name,
		Baseline: stoppedBefore.Seconds(), Value: stopped.Seconds(), Unit: UnitSeconds})
	ev(rundir.MetricReclaimStall, stalls.total, UnitSeconds)
	ev("fsync_seconds", fsync, UnitSeconds)
	ev("swap_in_pages", swapIn, UnitCount)

	var causes []string
	if waited >= leaseCauseShare*late {
		var shares []share
		for p, ss := range merge(a.run.Series(rundir.MetricRunqPreemptWait).Cgroup(cg).ByLabel(rundir.LabelPreemptor),
			a.run.Series(rundir.MetricRunqWakeupWait).Cgroup(cg).ByLabel(rundir.LabelPreemptor)) {
			if p == rundir.CgroupIdle || p == rundir.CgroupThrottled || p == rundir.CgroupKernel || within(p, cg) {
				continue
			}
			shares = append(shares, share{cgroup: a.owner(p), value: ss.Delta(gap)})
		}
		shares = sumShares(shares)
		for _, c := range culprits(shares) {
			n := a.name(c.cgroup)
			f.Culprits = append(f.Culprits, n)
			f.Evidence = append(f.Evidence, Evidence{Metric: "runq_wait_behind_seconds", Workload: "kubelet", Culprit: n,
				Phase: a.stress.Name, Value: c.value, Unit: UnitSeconds})
		}
		c := fmt.Sprintf("it waited %s for a CPU", human.Seconds(waited))
		if len(f.Culprits) > 0 {
			c += " behind " + joinNames(f.Culprits)
		}
		causes = append(causes, c)
	}
	if stalls.total >= leaseCauseShare*late {
		causes = append(causes, fmt.Sprintf("it stalled %s in memory reclaim", human.Seconds(stalls.total)))
	}
	if fsync >= leaseCauseShare*late {
		causes = append(causes, fmt.Sprintf("its fsyncs took %s", human.Seconds(fsync)))
	}
	if swapIn > 0 && stalls.total+fsync+waited < leaseCauseShare*late {
		causes = append(causes, fmt.Sprintf("the node swapped %.0f pages in meanwhile (major faults stall the kubelet outside the traced waits)", swapIn))
	}
	switch {
	case len(causes) > 0:
		f.Summary = head + ": over that gap " + strings.Join(causes, "; ") + "."
	case ran < idle:
		f.Summary = head + fmt.Sprintf(": over that gap the kubelet did not run (%s of CPU), and neither waited for a CPU (%s), "+
			"nor stalled in reclaim (%s) or fsync (%s): it was stopped or blocked outside the kernel's waits (a signal, a lock, the API server).",
			human.Seconds(ran), human.Seconds(waited), human.Seconds(stalls.total), human.Seconds(fsync))
	case stopped.Seconds() >= leaseStoppedShare*late && stopped > 2*stoppedBefore:
		f.Summary = head + fmt.Sprintf(": the kubelet did not run at all for %s of that gap (its CPU time stood still; at most %s in the baseline), "+
			"and neither waited long for a CPU (%s) nor stalled in reclaim (%s) or fsync (%s): it was stopped or blocked outside the kernel's waits (a signal, a lock, the API server).",
			human.Seconds(stopped.Seconds()), human.Seconds(stoppedBefore.Seconds()), human.Seconds(waited), human.Seconds(stalls.total), human.Seconds(fsync))
	default:
		f.Summary = head + fmt.Sprintf(": the kernel does not explain it: over that gap the kubelet ran %s of CPU, waited %s for a CPU, "+
			"stalled %s in reclaim and %s in fsync; it was busy or blocked in user space (the API server, a lock).",
			human.Seconds(ran), human.Seconds(waited), human.Seconds(stalls.total), human.Seconds(fsync))
	}
	return f
}

// sumShares adds up the shares of one cgroup.
func sumShares(in []share) []share {
	by := map[string]float64{}
	for _, s := range in {
		by[s.cgroup] += s.value
	}
	out := make([]share, 0, len(by))
	for cg, v := range by {
		out = append(out, share{cgroup: cg, value: v})
	}
	return out
}
