package recorded

import (
	"slices"
	"testing"
	"time"

	"github.com/nodectl/nodectl/agent/flightrec"
	"github.com/nodectl/nodectl/rundir"
)

// A window names the pods the flight recorder's pod_info samples name in it, also once the
// agent no longer does (the pod deleted), and not those whose series the recorder had
// forgotten by then; the agent's current names win; the samples are not among the records.
func TestWindowNamesThePodsOfItsTime(t *testing.T) {
	const (
		gone = "/kubepods/burstable/poda/c1" // deleted at 4 min
		live = "/kubepods/burstable/podb/c2"
	)
	partial := rundir.Pod{Cgroup: gone, Name: "shop/web-0/app", Kind: "container", Namespace: "shop", Pod: "web-0", Container: "app"}
	full := partial
	full.UID, full.QoS, full.Owner, full.CPURequest = "uid-a", "burstable", "StatefulSet/web", "500m"
	current := rundir.Pod{Cgroup: live, Name: "shop/api-0/app", Kind: "container", Namespace: "shop", Pod: "api-0", Container: "app", QoS: "guaranteed"}
	stale := current
	stale.Pod, stale.Name = "api-old", "shop/api-old/app"

	// A minute's segments, series forgotten after two minutes without a sample; the agent
	// records each pod again every minute while it lives, as startKube is told.
	st, err := flightrec.Open(flightrec.Options{Dir: t.TempDir(), SegmentSpan: time.Minute, SeriesIdle: 2 * time.Minute,
		Now: func() time.Time { return tick(600) }})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for i := range 600 {
		var recs []rundir.Record
		cpu := func(cg string) {
			v := float64(i)
			recs = append(recs, rundir.Record{Type: rundir.TypeSample, Time: tick(i), Metric: rundir.MetricCPUUsage, Cgroup: cg, Value: &v})
		}
		if i < 240 {
			cpu(gone)
			switch {
			case i == 0:
				recs = append(recs, partial.Record(tick(i)))
			case i == 3 || i%60 == 0:
				recs = append(recs, full.Record(tick(i)))
			}
		}
		cpu(live)
		if i%60 == 0 {
			recs = append(recs, stale.Record(tick(i)))
		}
		if err := st.Append(tick(i), recs); err != nil {
			t.Fatal(err)
		}
	}
	agent := rundir.Meta{Interval: rundir.Duration(time.Second), Pods: []rundir.Pod{current}}

	cases := []struct {
		name string
		w    Window
		want []rundir.Pod
	}{
		{"while_both_lived", Window{BaselineFrom: tick(120), From: tick(150), To: tick(230)}, []rundir.Pod{current, full}},
		{"the_first_seconds", Window{BaselineFrom: tick(0), From: tick(1), To: tick(2)}, []rundir.Pod{current, partial}},
		{"long_after", Window{BaselineFrom: tick(480), From: tick(500), To: tick(560)}, []rundir.Pod{current}},
		{"focus", Window{BaselineFrom: tick(120), From: tick(150), To: tick(230), Cgroups: map[string]bool{gone: true}}, []rundir.Pod{full}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			run, err := c.w.Run(st, agent)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(run.Meta.Pods, c.want) {
				t.Errorf("pods %+v\nwant %+v", run.Meta.Pods, c.want)
			}
			for _, r := range run.Records {
				if r.Metric == rundir.MetricPodInfo {
					t.Fatalf("a pod_info sample among the window's records: %+v", r)
				}
			}
		})
	}

	t.Run("export", func(t *testing.T) {
		dir := t.TempDir() + "/run"
		if err := (Window{BaselineFrom: tick(120), From: tick(150), To: tick(230)}).Export(st, agent, dir); err != nil {
			t.Fatal(err)
		}
		run, err := rundir.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		if want := []rundir.Pod{current, full}; !slices.Equal(run.Meta.Pods, want) {
			t.Errorf("exported pods %+v\nwant %+v", run.Meta.Pods, want)
		}
		if len(run.Series(rundir.MetricPodInfo)) != 0 {
			t.Error("pod_info samples among the exported records")
		}
		if len(run.Series(rundir.MetricCPUUsage).Cgroup(gone)) == 0 {
			t.Error("the deleted pod's samples are not exported")
		}
	})
}
