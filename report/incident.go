package report

import (
	"html/template"
	"time"

	"github.com/nodectl/nodectl/report/chart"
	"github.com/nodectl/nodectl/rundir"
)

// incidentTimeline is the timeline of a window of the agent's flight recorder (a post-mortem):
// the node's Lease renewals and the gaps between them, the run-queue wait of the cgroup that
// renews it (the kubelet's), and the OOM kills, marked where they happened.
func incidentTimeline(run *rundir.Run) []Section {
	span := run.Span()
	rel := func(t time.Time) float64 { return t.Sub(span.Start).Seconds() }
	var bands []chart.Band
	for _, p := range run.Phases() {
		bands = append(bands, chart.Band{From: rel(p.Start), To: rel(p.End), Label: p.Name})
	}
	var marks []chart.Mark
	gaps := chart.Series{Name: "gap since the previous renewal"}
	kubelet := ""
	for _, r := range run.Records {
		switch {
		case r.Type == rundir.TypeEvent && r.Name == rundir.EventOOMKill:
			marks = append(marks, chart.Mark{X: rel(r.Time), Label: "OOM kill"})
		case r.Type == rundir.TypeEvent && r.Name == rundir.EventLeaseRenewal:
			l, ok := rundir.ParseLeaseRenewal(r)
			if !ok || l.Gap <= 0 {
				continue
			}
			gaps.X, gaps.Y = append(gaps.X, rel(r.Time)), append(gaps.Y, l.Gap.Seconds())
			if r.Cgroup != "" {
				kubelet = r.Cgroup
			}
		}
	}
	line := func(id, title string, u chart.Unit, s ...chart.Series) template.HTML {
		return chart.Line{ID: id, Title: title, XLabel: "time since the window's start", XUnit: chart.Seconds, YUnit: u,
			Series: s, Bands: bands, Marks: marks, Points: true}.SVG()
	}
	charts := []template.HTML{line("lease-gaps", "the node's Lease: time between renewals", chart.Seconds, gaps)}
	if kubelet != "" {
		waits := append(run.Series(rundir.MetricRunqPreemptWait).Cgroup(kubelet), run.Series(rundir.MetricRunqWakeupWait).Cgroup(kubelet)...)
		w := rate(waits, span, rel)
		w.Name = "run-queue wait, seconds per second"
		charts = append(charts, line("kubelet-runq", "the kubelet's run-queue wait ("+kubelet+")", chart.Ratio, w))
	}
	return []Section{{ID: "incident", Title: "Incident timeline",
		Intro:  "The node's heartbeat as the API server holds it (the Lease the kubelet renews, every 10 s by default), the waits of the cgroup that renews it, and OOM kills marked where they happened; the findings above name the culprits.",
		Charts: charts}}
}
