package trace

import (
	"log/slog"
	"testing"
	"time"

	"github.com/nodectl/nodectl/record/trace/reclaim"
	"github.com/nodectl/nodectl/rundir"
)

// Reclaim stalls become per-cgroup samples by kind, and each OOM kill one event, emitted once at
// its own time with the killed process and the cgroup whose limit was hit.
func TestCollectReclaim(t *testing.T) {
	res := fakeResolver{"memory": {10: "/nodectl/r/victim", 11: "/nodectl/r"}}
	killed := time.Unix(1700000000, 5)
	st := reclaim.Stats{
		Stalls: map[reclaim.Key]reclaim.Stall{
			{Cgroup: 10, Kind: reclaim.KindMemcg}:      {Time: histOf(3000), Pages: 32},
			{Cgroup: 10, Kind: reclaim.KindCompaction}: {Time: histOf(500)},
		},
		OOMKills:    map[uint64]uint64{10: 1},
		KswapdWakes: 3,
		Kills: []reclaim.Kill{{Time: killed, Cgroup: 10, PID: 42, Comm: "hog", Limit: 11,
			UsageBytes: 64 << 20, LimitBytes: 64 << 20, TriggerPID: 42, TriggerComm: "hog"}},
		Drops: map[string]uint64{"kill_ring_full": 0},
	}
	tr := &Tracer{res: res, log: slog.New(slog.DiscardHandler), forgetEvery: 100, forgetFill: 1,
		status: map[string]string{},
		sources: []source{{program: ProgramReclaim, controller: "memory", close: func() error { return nil },
			read: func(n namer) ([]series, float64, error) {
				s := reclaimSeries(st, n)
				st.Kills = nil // drained, as the ring is
				return s, 0, nil
			}}}}
	now := time.Unix(1700000100, 0)
	recs, err := collectAll(tr, now)
	if err != nil {
		t.Fatal(err)
	}
	victim := "/nodectl/r/victim"
	memcg := map[string]string{rundir.LabelKind: rundir.ReclaimMemcg}
	if h := one(t, recs, rundir.MetricReclaimStall, victim, memcg).Hist; h.Count != 1 || h.SumNs != 3000 {
		t.Errorf("memcg stalls %+v, want one of 3000 ns", h)
	}
	if v := *one(t, recs, rundir.MetricReclaimPages, victim, memcg).Value; v != 32 {
		t.Errorf("pages %v, want 32", v)
	}
	one(t, recs, rundir.MetricCompactionStall, victim, nil)
	if v := *one(t, recs, rundir.MetricOOMKills, victim, nil).Value; v != 1 {
		t.Errorf("OOM kills %v, want 1", v)
	}
	if v := *one(t, recs, rundir.MetricKswapdWakeups, "", nil).Value; v != 3 {
		t.Errorf("kswapd wakeups %v, want 3", v)
	}
	var events []rundir.Record
	for _, r := range recs {
		if r.Type == rundir.TypeEvent {
			events = append(events, r)
		}
	}
	if len(events) != 1 {
		t.Fatalf("%d events, want 1: %+v", len(events), events)
	}
	e := events[0]
	want := map[string]string{rundir.LabelOOMPID: "42", rundir.LabelOOMComm: "hog", rundir.LabelOOMLimitCgroup: "/nodectl/r",
		rundir.LabelOOMLimit: "67108864", rundir.LabelOOMUsage: "67108864", rundir.LabelOOMTriggerPID: "42", rundir.LabelOOMTriggerComm: "hog"}
	if e.Name != rundir.EventOOMKill || e.Cgroup != victim || !e.Time.Equal(killed) || e.Message == "" {
		t.Errorf("event %+v, want an oom_kill of %s at %v with a message", e, victim, killed)
	}
	for k, v := range want {
		if e.Labels[k] != v {
			t.Errorf("event label %s = %q, want %q", k, e.Labels[k], v)
		}
	}

	again, err := tr.Snapshot(now.Add(time.Second))
	if err != nil || len(again.Events) != 0 {
		t.Errorf("second snapshot: %d events (%v), want none: the kill was drained", len(again.Events), err)
	}
}
