package analyzer

import (
	"fmt"
	"slices"
	"time"

	"github.com/nodectl/nodectl/agent/record"
)

// IDSystemDaemonStarvation: a node daemon (the heartbeat probe standing in for the kubelet) woke
// up late because neighbours held the CPU.
const IDSystemDaemonStarvation = "system-daemon-starvation"

// kindHeartbeat is the Workload.Kind of the heartbeat probe.
const kindHeartbeat = "heartbeat"

const (
	// heartbeatRiseFactor: the worst lateness in the stress phase over the baseline's.
	heartbeatRiseFactor = 3.0
	// heartbeatMinLateness: a worst lateness below this is noise for a daemon whose period is
	// seconds, however much it rose.
	heartbeatMinLateness = 0.010
	// nodeMonitorGrace is the kube-controller-manager's node-monitor grace period: a node whose
	// status has not been renewed for this long is marked NotReady.
	nodeMonitorGrace = 40 * time.Second
)

// systemDaemonStarvation: the heartbeat probe woke up late in the stress phase, and neighbours
// preempted it (docs/findings.md).
func (a *analysis) systemDaemonStarvation(hb record.Workload) *Finding {
	if !a.compare {
		return nil
	}
	late := a.run.Series(record.MetricHeartbeatLateness).Cgroup(hb.Cgroup)
	lb, ls := late.Values(a.baseline), late.Values(a.stress)
	if len(lb) == 0 || len(ls) == 0 {
		return nil
	}
	worstB, worstS := slices.Max(lb), slices.Max(ls)
	pw := a.preemptions(hb.Cgroup)
	if worstS < heartbeatMinLateness || ratio(worstS, worstB) < heartbeatRiseFactor ||
		pw.added < neighbourWaitMinSeconds || ratio(pw.neighbourS, pw.attributedS) < neighbourWaitMinShare {
		return nil
	}
	// The longest time between two beats is one period plus the worst lateness.
	period := time.Duration(hb.Period).Seconds()
	gap := period + worstS
	sev := SeverityWarning
	if worstS >= period || gap >= nodeMonitorGrace.Seconds() {
		sev = SeverityCritical // a beat was missed, or the node would have gone NotReady
	}
	runq := a.run.Series(record.MetricRunqLatency).Cgroup(hb.Cgroup)
	rb, rs := runq.HistDelta(a.baseline), runq.HistDelta(a.stress)
	f := &Finding{
		ID: IDSystemDaemonStarvation, Severity: sev, Victim: hb.Name,
		Evidence: []Evidence{
			a.evidence("heartbeat_lateness_max", hb.Name, worstB, worstS, UnitSeconds),
			a.evidence("heartbeat_lateness_p50", hb.Name, quantile(lb, 0.5), quantile(ls, 0.5), UnitSeconds),
			a.evidence("heartbeat_gap_max", hb.Name, period+worstB, gap, UnitSeconds),
			a.evidence("heartbeat_gap_grace_share", hb.Name, (period+worstB)/nodeMonitorGrace.Seconds(), gap/nodeMonitorGrace.Seconds(), UnitRatio),
			a.evidence("runq_latency_p99", hb.Name, rb.Quantile(0.99), rs.Quantile(0.99), UnitSeconds),
		},
	}
	a.blame(f, hb.Name, pw)
	f.Summary = fmt.Sprintf("the %s probe in the system cgroup woke up to %s late (%s in the baseline) because %s preempted it; "+
		"its longest gap between beats, %s, is %s of the %s node-monitor grace period after which a node is marked NotReady. "+
		"Reserve CPUs for system daemons (kubelet reservedSystemCPUs, a cpuset for system.slice) or limit the culprits.",
		hb.Name, fmtSeconds(worstS), fmtSeconds(worstB), joinNames(f.Culprits), fmtSeconds(gap),
		fmtPercent(gap/nodeMonitorGrace.Seconds()), nodeMonitorGrace)
	return f
}
