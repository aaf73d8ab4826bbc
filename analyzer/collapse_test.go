package analyzer

import (
	"strings"
	"testing"
	"time"

	"github.com/nodectl/nodectl/rundir"
)

// An agent window gets the density verdict when the node collapsed in it: OOM kills with memory
// pressure on a full node, or a late Lease with memory and CPU to spare; a window with pressure
// alone, or a kill alone, gets none.
func TestNodeCollapseInAWindow(t *testing.T) {
	const gi = 1 << 30
	for name, tc := range map[string]struct {
		avail, psiFull float64 // GiB available in the window, seconds of full memory pressure in it
		kills          int
		leaseGap       float64 // seconds between the window's two renewals
		want           string  // the ceiling, "" for no finding
	}{
		"oom_kills_under_pressure": {avail: 0.05, psiFull: 6, kills: 2, leaseGap: 10, want: CeilingMemory},
		"lease_late_with_room":     {avail: 3, leaseGap: 17, want: CeilingHeartbeat},
		"pressure_alone":           {avail: 0.05, psiFull: 6, leaseGap: 10},
		"one_kill_no_pressure":     {avail: 2, kills: 1, leaseGap: 10},
	} {
		t.Run(name, func(t *testing.T) {
			b := emptyWindow()
			b.meta.Node = "node-a"
			b.points(rundir.MetricMeminfo, "", []float64{0, 4 * gi, 15, 4 * gi}, rundir.LabelName, "MemTotal").
				points(rundir.MetricMeminfo, "", []float64{0, 3 * gi, 15, tc.avail * gi}, rundir.LabelName, "MemAvailable").
				counter(rundir.MetricSystemPressure, "", 0, tc.psiFull, rundir.LabelResource, "memory", rundir.LabelKind, "full")
			for i := range tc.kills {
				b.recs = append(b.recs, rundir.Record{Type: rundir.TypeEvent, Time: at(12 + float64(i)), Name: rundir.EventOOMKill,
					Cgroup: "/kubepods/burstable/pod1/c1", Message: "OOM kill"})
			}
			renewals := []float64{5, 5 + tc.leaseGap}
			for i, renew := range renewals {
				l := rundir.LeaseRenewal{RenewTime: at(renew), LeaseDuration: 40 * time.Second, Lag: time.Millisecond}
				if i > 0 {
					l.Gap = time.Duration(tc.leaseGap * float64(time.Second))
				}
				b.recs = append(b.recs, l.Record(at(renew), "/kubelet"))
			}
			rep := b.analyze(t)
			var got *Finding
			for i := range rep.Findings {
				if rep.Findings[i].ID == IDNodeCollapse {
					got = &rep.Findings[i]
				}
			}
			if tc.want == "" {
				if got != nil {
					t.Fatalf("node-collapse %s", got.Summary)
				}
				return
			}
			if got == nil {
				t.Fatalf("no node-collapse: %v", ids(rep))
			}
			t.Log(got.Summary)
			if !strings.Contains(got.Summary, "Ceiling: "+tc.want) || got.Severity != SeverityCritical || got.Victim != rundir.WorkloadNode {
				t.Errorf("%s %s: %s; want the ceiling %s", got.Severity, got.Victim, got.Summary, tc.want)
			}
			if e := evidence(t, *got, "working_set", ""); e.Value != 4*gi-tc.avail*gi || e.Phase != rundir.PhaseWindow {
				t.Errorf("working set %+v, want MemTotal less the window's least MemAvailable", e)
			}
		})
	}
}

// journald writing most of what a saturated disk wrote, while the Lease went late: the window's
// ceiling is the journald flood, with journald its culprit, not the heartbeat alone.
func TestNodeCollapseByJournald(t *testing.T) {
	const gi = 1 << 30
	journald := "/system.slice/systemd-journald.service"
	b := emptyWindow(rundir.Workload{Name: "systemd-journald", Kind: rundir.KindDaemon, Cgroup: journald})
	b.meta.Node = "node-a"
	b.points(rundir.MetricMeminfo, "", []float64{0, 4 * gi}, rundir.LabelName, "MemTotal").
		points(rundir.MetricMeminfo, "", []float64{0, 3 * gi}, rundir.LabelName, "MemAvailable").
		counter(rundir.MetricBlkBytes, journald, 0, 800<<20, rundir.LabelDevice, "8:0", rundir.LabelOp, "write").
		counter(rundir.MetricBlkBytes, "/kubepods/burstable/pod1/c1", 0, 100<<20, rundir.LabelDevice, "8:0", rundir.LabelOp, "write").
		counter(rundir.MetricDiskIOTime, "", 1, 19, rundir.LabelDevice, "8:0")
	for i, renew := range []float64{5, 22} {
		l := rundir.LeaseRenewal{RenewTime: at(renew), LeaseDuration: 40 * time.Second, Lag: time.Millisecond}
		if i > 0 {
			l.Gap = 17 * time.Second
		}
		b.recs = append(b.recs, l.Record(at(renew), "/kubelet"))
	}
	f := finding(t, b.analyze(t), IDNodeCollapse)
	t.Log(f.Summary)
	if !strings.Contains(f.Summary, "Ceiling: "+CeilingJournald) || len(f.Culprits) != 1 || f.Culprits[0] != "systemd-journald" {
		t.Errorf("%s culprits %v, want the journald flood and journald", f.Summary, f.Culprits)
	}
	if e := evidence(t, f, "journald_write_share", "systemd-journald"); e.Value < 0.88 || e.Device != "8:0" {
		t.Errorf("journald's share %+v, want 800 of 900 MiB on 8:0", e)
	}
}

// OOM kills under pressure while evicted binaries were read back from a disk at its cap: the
// ceiling is the disk's refaults, charged to the pods whose pages they were.
func TestNodeCollapseByDiskRefaults(t *testing.T) {
	const gi = 1 << 30
	b := emptyWindow()
	b.meta.Node = "node-a"
	b.points(rundir.MetricMeminfo, "", []float64{0, 4 * gi}, rundir.LabelName, "MemTotal").
		points(rundir.MetricMeminfo, "", []float64{0, 0.3 * gi}, rundir.LabelName, "MemAvailable").
		counter(rundir.MetricSystemPressure, "", 0, 6, rundir.LabelResource, "memory", rundir.LabelKind, "full").
		counter(rundir.MetricVmstat, "", 0, 60000, rundir.LabelName, "workingset_refault_file").
		counter(rundir.MetricMemoryRefaults, "/kubepods/burstable/pod1", 0, 45000, rundir.LabelKind, "file").
		counter(rundir.MetricMemoryRefaults, "/kubepods/burstable/pod1/c1", 0, 45000, rundir.LabelKind, "file").
		counter(rundir.MetricMemoryRefaults, "/kubepods/burstable/pod2/c1", 0, 15000, rundir.LabelKind, "file").
		counter(rundir.MetricDiskBytes, "", 0, 300<<20, rundir.LabelDevice, "8:0", rundir.LabelOp, "read").
		counter(rundir.MetricDiskIOTime, "", 1, 19, rundir.LabelDevice, "8:0")
	b.recs = append(b.recs, rundir.Record{Type: rundir.TypeEvent, Time: at(15), Name: rundir.EventOOMKill, Cgroup: "/kubepods/burstable/pod2/c1"})
	f := finding(t, b.analyze(t), IDNodeCollapse)
	t.Log(f.Summary)
	if !strings.Contains(f.Summary, "Ceiling: "+CeilingDiskRefaults) {
		t.Errorf("summary %q, want the disk refaults' ceiling", f.Summary)
	}
	want := []string{"/kubepods/burstable/pod1/c1", "/kubepods/burstable/pod2/c1"}
	if strings.Join(f.Culprits, ",") != strings.Join(want, ",") {
		t.Errorf("culprits %v, want the containers by file refaults, deepest only: %v", f.Culprits, want)
	}
}
