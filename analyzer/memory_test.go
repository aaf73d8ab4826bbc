package analyzer

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/nodectl/nodectl/rundir"
)

const memHog = runCg + "/memory-hog-0"

func memHogWorkload() rundir.Workload {
	return rundir.Workload{Name: "memory-hog-0", Kind: "memory", Cgroup: memHog}
}

// oomEvent records an OOM kill of pid (comm) in cgroup at sec, the limit of limitCgroup hit.
func (b *builder) oomEvent(sec float64, cgroup, pid, comm, limitCgroup string) *builder {
	l := labels(rundir.LabelOOMPID, pid, rundir.LabelOOMComm, comm, rundir.LabelOOMTriggerPID, pid, rundir.LabelOOMTriggerComm, comm)
	if limitCgroup != "" {
		l[rundir.LabelOOMLimitCgroup] = limitCgroup
		l[rundir.LabelOOMUsage] = "134217728"
		l[rundir.LabelOOMLimit] = "134217728"
	}
	b.recs = append(b.recs, rundir.Record{Type: rundir.TypeEvent, Time: at(sec), Name: rundir.EventOOMKill, Cgroup: cgroup,
		Labels: l, Message: "OOM kill"})
	return b
}

func TestMemoryReclaim(t *testing.T) {
	limited := victimWorkload()
	limited.Memory = "128Mi"
	memcg := []string{rundir.LabelKind, rundir.ReclaimMemcg}
	direct := []string{rundir.LabelKind, rundir.ReclaimDirect}
	for _, c := range []struct {
		name     string
		build    func() *builder
		want     bool
		severity string
		culprits []string
		says     string
	}{
		{"own_limit", func() *builder {
			return newRun(limited).
				histogram(rundir.MetricReclaimStall, victim, lat(0, 0), lat(400, 0.002), memcg...).
				counter(rundir.MetricReclaimPages, victim, 0, 40000, memcg...)
		}, true, SeverityWarning, []string{}, "Its own memory limit (128Mi)"},
		{"direct_neighbour_grew", func() *builder {
			return newRun(victimWorkload(), memHogWorkload()).
				histogram(rundir.MetricReclaimStall, victim, lat(0, 0), lat(1000, 0.004), direct...).
				counter(rundir.MetricReclaimPages, victim, 0, 90000, direct...).
				gauge(rundir.MetricMemoryUsage, victim, []float64{100 << 20}, []float64{100 << 20}).
				gauge(rundir.MetricMemoryUsage, memHog, []float64{1 << 20}, []float64{1 << 30, 2 << 30, 3 << 30})
		}, true, SeverityCritical, []string{"memory-hog-0"}, "direct reclaim"},
		{"parent_limit", func() *builder {
			return newRun(victimWorkload(), memHogWorkload()).
				histogram(rundir.MetricReclaimStall, victim, lat(0, 0), lat(400, 0.002), memcg...).
				gauge(rundir.MetricMemoryUsage, memHog, []float64{1 << 20}, []float64{1 << 20, 512 << 20})
		}, true, SeverityWarning, []string{"memory-hog-0"}, "A memory limit above its cgroup"},
		// The hog filled its memory before the stress phase's first reading: it grew all the same.
		{"parent_limit_hog_full_at_once", func() *builder {
			return newRun(victimWorkload(), memHogWorkload()).
				histogram(rundir.MetricReclaimStall, victim, lat(0, 0), lat(400, 0.002), memcg...).
				gauge(rundir.MetricMemoryUsage, memHog, []float64{1 << 20}, []float64{200 << 20})
		}, true, SeverityWarning, []string{"memory-hog-0"}, "A memory limit above its cgroup"},
		// Its own limit stalls it in both phases: reported, as a quota is, with no rise.
		{"steady_own_limit", func() *builder {
			return newRun(limited).
				histogram(rundir.MetricReclaimStall, victim, lat(200, 0.002), lat(400, 0.002), memcg...)
		}, true, SeverityWarning, []string{}, "in baseline and stress"},
		// A parent's limit stalls it as much in both phases: the neighbours changed nothing.
		{"steady_parent_limit", func() *builder {
			return newRun(victimWorkload(), memHogWorkload()).
				histogram(rundir.MetricReclaimStall, victim, lat(200, 0.002), lat(400, 0.002), memcg...).
				gauge(rundir.MetricMemoryUsage, memHog, []float64{1 << 20}, []float64{1 << 20, 512 << 20})
		}, false, "", nil, ""},
		{"noise", func() *builder {
			return newRun(limited).
				histogram(rundir.MetricReclaimStall, victim, lat(0, 0), lat(10, 0.0001), memcg...)
		}, false, "", nil, ""},
		{"churned_child", func() *builder {
			return newRun(limited).
				histogram(rundir.MetricReclaimStall, victim+"/sandbox-1", lat(0, 0), lat(400, 0.002), memcg...)
		}, true, SeverityWarning, []string{}, "Its own memory limit"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rep := c.build().analyze(t)
			if !c.want {
				if slices.Contains(ids(rep), IDMemoryReclaim) {
					t.Fatalf("unexpected memory-reclaim: %+v", rep.Findings)
				}
				return
			}
			f := finding(t, rep, IDMemoryReclaim)
			if f.Victim != "victim" || f.Severity != c.severity || !slices.Equal(f.Culprits, c.culprits) {
				t.Errorf("victim %q severity %q culprits %v, want victim %q %v", f.Victim, f.Severity, f.Culprits, c.severity, c.culprits)
			}
			if !strings.Contains(f.Summary, c.says) {
				t.Errorf("summary %q does not say %q", f.Summary, c.says)
			}
			if e := evidence(t, f, "reclaim_stall_share", ""); e.Value <= e.Baseline && !strings.HasPrefix(c.name, "steady") {
				t.Errorf("stall share %v, baseline %v: want a rise", e.Value, e.Baseline)
			}
		})
	}
}

// A record-mode run, without phases, reports the stalls of the whole run.
func TestMemoryReclaimWithoutPhases(t *testing.T) {
	b := newRun(rundir.Workload{Name: "app", Kind: "victim", Cgroup: victim, Memory: "64Mi"})
	b.recs = nil
	b.histogram(rundir.MetricReclaimStall, victim, lat(0, 0), lat(300, 0.002), rundir.LabelKind, rundir.ReclaimMemcg)
	f := finding(t, b.analyze(t), IDMemoryReclaim)
	if f.Evidence[0].Phase != "run" {
		t.Errorf("phase %q, want run", f.Evidence[0].Phase)
	}
}

func TestOOMKill(t *testing.T) {
	limited := victimWorkload()
	limited.Memory = "128Mi"
	for _, c := range []struct {
		name     string
		build    func() *builder
		victim   string
		culprits []string
		says     []string
	}{
		{"own_limit", func() *builder {
			return newRun(limited, memHogWorkload()).oomEvent(15, victim, "4242", "probe", victim)
		}, "victim", []string{}, []string{"probe (pid 4242, in stress)", "Its own memory limit was hit (128.0 MiB of 128.0 MiB), limit 128Mi"}},
		{"parent_limit", func() *builder {
			return newRun(victimWorkload(), memHogWorkload(), hogWorkload("cpu", 0)).
				gauge(rundir.MetricMemoryUsage, memHog, []float64{1 << 20}, []float64{900 << 20}).
				gauge(rundir.MetricMemoryUsage, cpuHog0, []float64{1 << 20}, []float64{2 << 20}).
				oomEvent(12, victim+"/sandbox-0", "7", "dd", runCg)
		}, "victim", []string{"memory-hog-0"}, []string{"dd (pid 7, in stress)", "The memory limit of " + runCg}},
		{"node_wide", func() *builder {
			return newRun(victimWorkload(), memHogWorkload()).
				gauge(rundir.MetricMemoryUsage, memHog, []float64{1 << 20}, []float64{900 << 20}).
				oomEvent(5, memHog, "9", "hog", "")
		}, "memory-hog-0", []string{}, []string{"hog (pid 9, in baseline)", "The node itself ran out of memory"}},
		{"counter_only", func() *builder {
			return newRun(victimWorkload()).counter(rundir.MetricMemoryOOMKills, victim, 0, 2)
		}, "victim", []string{}, []string{"killed 2 of victim's processes"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			rep := c.build().analyze(t)
			f := finding(t, rep, IDOOMKill)
			if f.Victim != c.victim || f.Severity != SeverityCritical || !slices.Equal(f.Culprits, c.culprits) {
				t.Errorf("victim %q severity %q culprits %v, want %q critical %v", f.Victim, f.Severity, f.Culprits, c.victim, c.culprits)
			}
			for _, s := range c.says {
				if !strings.Contains(f.Summary, s) {
					t.Errorf("summary %q does not say %q", f.Summary, s)
				}
			}
			if n := evidence(t, f, "oom_kills", "").Value; n < 1 {
				t.Errorf("oom_kills %v, want at least 1", n)
			}
		})
	}
	if got := ids(newRun(victimWorkload()).analyze(t)); slices.Contains(got, IDOOMKill) {
		t.Errorf("oom-kill without any kill: %v", got)
	}
}

// In a density run the emulated node speaks for its sandboxes: one memory-reclaim finding over
// its subtree and one oom-kill finding listing the sandboxes' killed processes, not one each.
func TestNodeSpeaksForItsSandboxes(t *testing.T) {
	node := rundir.Workload{Name: "node", Kind: "node", Cgroup: runCg, Memory: "1Gi"}
	wl := []rundir.Workload{node}
	b := newRun()
	for i := range 3 {
		sb := rundir.Workload{Name: fmt.Sprintf("sandbox-%d", i), Kind: "sandbox", Cgroup: fmt.Sprintf("%s/sandbox-%d", runCg, i)}
		wl = append(wl, sb)
		b.histogram(rundir.MetricReclaimStall, sb.Cgroup, lat(0, 0), lat(300, 0.002), rundir.LabelKind, rundir.ReclaimMemcg)
		b.oomEvent(12+float64(i), sb.Cgroup, fmt.Sprint(100+i), "nodectl", runCg)
	}
	b.meta.Workloads = wl
	rep := b.analyze(t)
	var reclaim, oom []Finding
	for _, f := range rep.Findings {
		switch f.ID {
		case IDMemoryReclaim:
			reclaim = append(reclaim, f)
		case IDOOMKill:
			oom = append(oom, f)
		}
	}
	if len(reclaim) != 1 || reclaim[0].Victim != "node" {
		t.Fatalf("memory-reclaim findings %+v, want one for the node", reclaim)
	}
	if e := evidence(t, reclaim[0], "reclaim_stalls_memcg", ""); e.Value != 900 {
		t.Errorf("the node's reclaims %v, want its 3 sandboxes' 900", e.Value)
	}
	if len(oom) != 1 || oom[0].Victim != "node" || !strings.Contains(oom[0].Summary, "sandbox-2") {
		t.Fatalf("oom-kill findings %+v, want one for the node naming the sandboxes", oom)
	}
	if e := evidence(t, oom[0], "oom_kills", ""); e.Value != 3 {
		t.Errorf("oom kills %v, want 3", e.Value)
	}
}
