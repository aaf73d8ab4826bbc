package report

import (
	"cmp"
	"fmt"
	"html/template"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/nodectl/nodectl/analyzer"
	"github.com/nodectl/nodectl/report/chart"
	"github.com/nodectl/nodectl/rundir"
)

// topCulprits is how many culprits a stacked chart names; the rest are "others".
const topCulprits = 5

// examined are the workloads whose slowdown a run explains: victims, or the cgroups an agent
// window examined.
func examined(run *rundir.Run) []rundir.Workload {
	var out []rundir.Workload
	for _, w := range run.Meta.Workloads {
		if w.Kind == rundir.KindVictim || w.Kind == rundir.KindObserved {
			out = append(out, w)
		}
	}
	return out
}

// timeline is the charts of a run in phases (noisy, record, an agent window): the victim's own
// measurements over time, its run-queue wait per phase split by culprit, the throttling of its
// cgroup, the node's PSI, and the busiest device's queue against service time.
func timeline(run *rundir.Run, rep *analyzer.Report) []Section {
	span := run.Span()
	phases := run.Phases()
	rel := func(t time.Time) float64 { return t.Sub(span.Start).Seconds() }
	var bands []chart.Band
	for _, p := range phases {
		bands = append(bands, chart.Band{From: rel(p.Start), To: rel(p.End), Label: p.Name})
	}
	line := func(id, title string, u chart.Unit, series []chart.Series) template.HTML {
		return chart.Line{ID: id, Title: title, XLabel: "time since the run's start", XUnit: chart.Seconds, YUnit: u, Series: series, Bands: bands}.SVG()
	}
	names := map[string]string{}
	for _, w := range run.Meta.Workloads {
		names[w.Cgroup] = w.Name
	}
	var sections []Section
	for _, v := range examined(run) {
		var probe []chart.Series
		for _, m := range []string{rundir.MetricProbeCPUWork, rundir.MetricProbeWrite, rundir.MetricProbeFsync} {
			if s := samples(run.Series(m).Cgroup(v.Cgroup), span, rel); len(s.X) > 0 {
				s.Name = m
				probe = append(probe, s)
			}
		}
		charts := []template.HTML{}
		if len(probe) > 0 {
			charts = append(charts, line("probe-"+v.Name, v.Name+": the probe's own timings per iteration", chart.Seconds, probe))
		}
		charts = append(charts, culpritBars(run, v, phases, names), fsyncBars(rep.Summary, v.Name))
		throttled := rate(run.Series(rundir.MetricCPUThrottledTime).Cgroup(v.Cgroup), span, rel)
		throttled.Name = "throttled share of time"
		charts = append(charts, line("throttled-"+v.Name, v.Name+": time its CPU quota held it throttled", chart.Ratio, []chart.Series{throttled}))
		sections = append(sections, Section{ID: "victim-" + v.Name, Title: "Victim " + v.Name,
			Intro:  "Its own measurements against the run's phases, the run-queue wait its tasks had per phase charged to what ran instead of them, and its throttling.",
			Charts: charts})
	}
	var psi []chart.Series
	pressure := run.Series(rundir.MetricSystemPressure)
	for _, rk := range [][2]string{{"cpu", "some"}, {"memory", "full"}, {"io", "full"}} {
		s := rate(pressure.Label(rundir.LabelResource, rk[0]).Label(rundir.LabelKind, rk[1]), span, rel)
		s.Name = rk[0] + " " + rk[1]
		psi = append(psi, s)
	}
	node := Section{ID: "node", Title: "The node", Intro: "Pressure stall information of the whole node (share of time some or all tasks stalled), and the busiest disk's requests per phase: time waiting in the queue against time the device served them.",
		Charts: []template.HTML{line("psi", "node PSI", chart.Ratio, psi), deviceBars(run, phases)}}
	return append(sections, node)
}

// samples are a gauge's readings (a probe's per-iteration timings) at their times.
func samples(ss rundir.SeriesSet, span rundir.Window, rel func(time.Time) float64) chart.Series {
	var s chart.Series
	span.Start = span.Start.Add(-time.Nanosecond) // Samples is after Start: the first reading too
	for _, r := range ss.Samples(span) {
		s.X, s.Y = append(s.X, rel(r.Time)), append(s.Y, *r.Value)
	}
	return s
}

// rate is a counter of seconds (or anything) per second of wall time, between consecutive
// readings of the set.
func rate(ss rundir.SeriesSet, span rundir.Window, rel func(time.Time) float64) chart.Series {
	var times []time.Time
	for _, s := range ss {
		for _, r := range s.Samples {
			times = append(times, r.Time)
		}
	}
	slices.SortFunc(times, time.Time.Compare)
	times = slices.Compact(times)
	var out chart.Series
	for i := 1; i < len(times); i++ {
		w := rundir.Window{Start: times[i-1], End: times[i]}
		if w.Seconds() <= 0 || w.End.Before(span.Start) {
			continue
		}
		out.X = append(out.X, rel(w.End))
		out.Y = append(out.Y, ss.Delta(w)/w.Seconds())
	}
	return out
}

// culpritBars is the victim's run-queue wait per phase, stacked by what ran instead of it (the
// tracer's preemptor label: after a preemption, or a wakeup onto a busy CPU).
func culpritBars(run *rundir.Run, v rundir.Workload, phases []rundir.Window, names map[string]string) template.HTML {
	waits := append(run.Series(rundir.MetricRunqPreemptWait).Cgroup(v.Cgroup), run.Series(rundir.MetricRunqWakeupWait).Cgroup(v.Cgroup)...)
	byCulprit := waits.ByLabel(rundir.LabelPreemptor)
	total := map[string]float64{}
	for c, ss := range byCulprit {
		for _, p := range phases {
			total[c] += ss.Delta(p)
		}
	}
	culprits := slices.SortedFunc(maps.Keys(total), func(a, b string) int { return cmp.Compare(total[b], total[a]) })
	b := chart.Bars{ID: "culprits-" + v.Name, Title: v.Name + ": run-queue wait per phase, by what ran instead", YUnit: chart.Seconds, Stacked: true}
	for _, p := range phases {
		b.Categories = append(b.Categories, p.Name)
	}
	others := chart.BarSeries{Name: "others", Values: make([]float64, len(phases))}
	for i, c := range culprits {
		vals := make([]float64, len(phases))
		for j, p := range phases {
			vals[j] = byCulprit[c].Delta(p)
		}
		if i >= topCulprits {
			for j := range vals {
				others.Values[j] += vals[j]
			}
			continue
		}
		name := names[c]
		if name == "" {
			name = c
		}
		b.Series = append(b.Series, chart.BarSeries{Name: name, Values: vals})
	}
	if len(culprits) > topCulprits {
		b.Series = append(b.Series, others)
	}
	return b.SVG()
}

// fsyncBars is the victim's sync latency per phase: the fsync tracer's p95 of its cgroup's
// calls, and its probe's own write+fsync p95.
func fsyncBars(s analyzer.Summary, victim string) template.HTML {
	b := chart.Bars{ID: "fsync-" + victim, Title: victim + ": fsync latency p95 per phase", YUnit: chart.Seconds,
		Series: []chart.BarSeries{{Name: "traced fsync"}, {Name: "probe write+fsync"}}}
	for _, w := range s.Workloads {
		if w.Workload != victim {
			continue
		}
		probe := math.NaN()
		if w.Probe != nil && w.Probe.Iterations > 0 {
			probe = w.Probe.WriteFsyncP95
		}
		traced := w.FsyncP95
		if traced == 0 { // no fsync traced in the phase: no bar, not a bar of zero
			traced = math.NaN()
		}
		b.Categories = append(b.Categories, w.Phase)
		b.Series[0].Values = append(b.Series[0].Values, traced)
		b.Series[1].Values = append(b.Series[1].Values, probe)
	}
	return b.SVG()
}

// deviceBars is the busiest device's mean queue and service time per request, per phase.
func deviceBars(run *rundir.Run, phases []rundir.Window) template.HTML {
	bytes := run.Series(rundir.MetricBlkBytes).ByLabel(rundir.LabelDevice)
	dev, most := "", 0.0
	for d, ss := range bytes {
		if v := ss.Delta(run.Span()); v > most || (v == most && d < dev) {
			dev, most = d, v
		}
	}
	b := chart.Bars{ID: "device", Title: fmt.Sprintf("device %s: mean time per request", dev), YUnit: chart.Seconds,
		Series: []chart.BarSeries{{Name: "queue"}, {Name: "service"}}}
	if dev == "" {
		b.Title = "block devices: mean time per request"
		return b.SVG()
	}
	queue := run.Series(rundir.MetricBlkQueue).Label(rundir.LabelDevice, dev)
	service := run.Series(rundir.MetricBlkService).Label(rundir.LabelDevice, dev)
	for _, p := range phases {
		b.Categories = append(b.Categories, p.Name)
		q, s := queue.HistDelta(p), service.HistDelta(p)
		b.Series[0].Values = append(b.Series[0].Values, q.Mean())
		b.Series[1].Values = append(b.Series[1].Values, s.Mean())
	}
	return b.SVG()
}
