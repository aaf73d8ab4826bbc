// Package report renders a run's analysis as one self-contained HTML file: the findings first,
// each with its evidence table and a chart of it, then the scenario's charts drawn from the
// run's records at report time (package chart), in light and dark mode and printable, with no
// script, font or request of any kind outside the file.
package report

import (
	"cmp"
	_ "embed"
	"fmt"
	"html/template"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nodectl/nodectl/analyzer"
	"github.com/nodectl/nodectl/internal/atomicfile"
	"github.com/nodectl/nodectl/report/chart"
	"github.com/nodectl/nodectl/rundir"
)

// Page is one report.
type Page struct {
	Title     string
	Subtitle  string
	Generated time.Time
	Findings  []Finding
	Sections  []Section
	Notes     []string
}

// Finding is a finding as the page shows it: its evidence as a table and as charts, one per
// unit.
type Finding struct {
	analyzer.Finding
	Rows   []EvidenceRow
	Charts []template.HTML
}

// EvidenceRow is one evidence line, its numbers written in their unit.
type EvidenceRow struct {
	Metric, Who, Phase, Baseline, Value, Change string
}

// Section is a part of the page: a heading, what it shows, its charts and a table.
type Section struct {
	ID, Title, Intro string
	Charts           []template.HTML
	Table            *Table
}

// Table is a plain table of text.
type Table struct {
	Head []string
	Rows [][]string
}

// FromRun is the report of one analyzed run.
func FromRun(run *rundir.Run, rep *analyzer.Report) *Page {
	p := &Page{
		Title:     fmt.Sprintf("nodectl %s run %s", rep.Run.Scenario, rep.Run.ID),
		Subtitle:  fmt.Sprintf("node %s, kernel %s", rep.Run.Node, rep.Run.Kernel),
		Generated: time.Now().UTC(),
		Notes:     rep.Notes,
	}
	p.Findings = findings(rep.Findings)
	switch rep.Run.Scenario {
	case rundir.ScenarioWake:
		p.Sections = append(p.Sections, wakeSections(rep.Limits)...)
	case rundir.ScenarioDensity:
		if rep.Density != nil {
			p.Sections = append(p.Sections, densitySections(rep.Density)...)
		}
	case rundir.ScenarioFsyncStorm:
		if rep.Storm != nil {
			p.Sections = append(p.Sections, stormSections(rep.Storm)...)
		}
	case rundir.ScenarioAgent:
		p.Sections = append(p.Sections, incidentTimeline(run)...)
		p.Sections = append(p.Sections, timeline(run, rep)...)
	default:
		p.Sections = append(p.Sections, timeline(run, rep)...)
	}
	if rep.Run.Scenario != rundir.ScenarioDensity { // a sweep's sandboxes are its steps' table
		p.Sections = append(p.Sections, summaryTable(rep.Summary))
	}
	return p
}

// findings orders the findings by severity and builds their evidence tables and charts.
func findings(in []analyzer.Finding) []Finding {
	in = slices.Clone(in)
	slices.SortStableFunc(in, func(a, b analyzer.Finding) int {
		return cmp.Compare(analyzer.SeverityRank(b.Severity), analyzer.SeverityRank(a.Severity))
	})
	var out []Finding
	for i, f := range in {
		v := Finding{Finding: f}
		byUnit := map[string]*chart.Bars{}
		var units []string
		for _, e := range f.Evidence {
			who := e.Workload
			if e.Culprit != "" {
				who += " (by " + e.Culprit + ")"
			}
			if e.Device != "" {
				who = strings.TrimSpace(who + " device " + e.Device)
			}
			u := unitOf(e.Unit)
			change := ""
			if e.Baseline > 0 {
				change = fmt.Sprintf("%.1fx", e.Value/e.Baseline)
			}
			v.Rows = append(v.Rows, EvidenceRow{Metric: e.Metric, Who: who, Phase: e.Phase,
				Baseline: chart.Format(e.Baseline, u), Value: chart.Format(e.Value, u), Change: change})
			b, ok := byUnit[e.Unit]
			if !ok {
				b = &chart.Bars{ID: fmt.Sprintf("finding-%d-%s", i, e.Unit), Title: f.ID + ": evidence in " + string(u), YUnit: u,
					Series: []chart.BarSeries{{Name: "baseline"}, {Name: "phase"}}}
				byUnit[e.Unit] = b
				units = append(units, e.Unit)
			}
			cat := e.Metric // the victim's own measure goes by its name alone
			if who != f.Victim {
				cat += " " + who
			}
			b.Categories = append(b.Categories, cat)
			b.Series[0].Values = append(b.Series[0].Values, e.Baseline)
			b.Series[1].Values = append(b.Series[1].Values, e.Value)
		}
		for _, u := range units {
			v.Charts = append(v.Charts, byUnit[u].SVG())
		}
		out = append(out, v)
	}
	return out
}

// unitOf is the chart unit of an evidence unit.
func unitOf(u string) chart.Unit {
	switch u {
	case analyzer.UnitSeconds:
		return chart.Seconds
	case analyzer.UnitBytes:
		return chart.Bytes
	case analyzer.UnitRatio:
		return chart.Ratio
	}
	return chart.Count
}

func wakeSections(limits []analyzer.WakeLimit) []Section {
	b := chart.Bars{ID: "wake-per-limit", Title: "wake p50 per CPU limit: throttled and the rest", YUnit: chart.Seconds, Stacked: true,
		Series: []chart.BarSeries{{Name: "throttled"}, {Name: "not throttled"}}}
	p95 := chart.Bars{ID: "wake-p50-p95", Title: "wake p50 and p95 per CPU limit", YUnit: chart.Seconds,
		Series: []chart.BarSeries{{Name: "p50"}, {Name: "p95"}}}
	t := &Table{Head: []string{"CPU limit", "starts", "wake p50", "wake p95", "throttled share", "boot p50", "CPU used p50", "run-queue wait p50"}}
	for _, l := range limits {
		throttled := l.WakeP50 * min(l.ThrottledShare, 1)
		b.Categories = append(b.Categories, l.CPU)
		b.Series[0].Values = append(b.Series[0].Values, throttled)
		b.Series[1].Values = append(b.Series[1].Values, l.WakeP50-throttled)
		p95.Categories = append(p95.Categories, l.CPU)
		p95.Series[0].Values = append(p95.Series[0].Values, l.WakeP50)
		p95.Series[1].Values = append(p95.Series[1].Values, l.WakeP95)
		t.Rows = append(t.Rows, []string{l.CPU, fmt.Sprint(l.Starts), chart.Format(l.WakeP50, chart.Seconds), chart.Format(l.WakeP95, chart.Seconds),
			chart.Format(l.ThrottledShare, chart.Ratio), chart.Format(l.BootP50, chart.Seconds), chart.Format(l.CPUUsageP50, chart.Seconds),
			chart.Format(l.RunqWaitP50, chart.Seconds)})
	}
	return []Section{{ID: "wake", Title: "Wake time per CPU limit",
		Intro:  "Each bar is a limit's median start, from the launch to the sandbox's answer; its throttled part is the wake time times the share of it the cgroup's quota held the start throttled.",
		Charts: []template.HTML{b.SVG(), p95.SVG()}, Table: t}}
}

func densitySections(d *analyzer.DensityReport) []Section {
	var marks []chart.Mark
	intro := fmt.Sprintf("Highest stable density: %d sandboxes.", d.MaxStable)
	if d.Collapse != nil {
		marks = []chart.Mark{{X: float64(d.Collapse.Density), Label: "collapse: " + d.Collapse.Signal}}
		intro += fmt.Sprintf(" Collapse at %d (%s).", d.Collapse.Density, d.Collapse.Signal)
	}
	if d.Ceiling != nil {
		intro += " Ceiling: " + d.Ceiling.Resource + ". " + d.Ceiling.Explanation
	}
	x := make([]float64, len(d.Steps))
	col := func(f func(analyzer.DensityStep) float64) []float64 {
		out := make([]float64, len(d.Steps))
		for i, s := range d.Steps {
			out[i] = f(s)
		}
		return out
	}
	for i, s := range d.Steps {
		x[i] = float64(s.Density)
	}
	line := func(id, title string, u chart.Unit, series ...chart.Series) template.HTML {
		for i := range series {
			series[i].X = x
		}
		return chart.Line{ID: id, Title: title, XLabel: "sandboxes", XUnit: chart.Count, YUnit: u, Series: series, Marks: marks, Points: true, StepsAsLabels: true}.SVG()
	}
	charts := []template.HTML{
		line("density-readiness", "readiness per step", chart.Seconds,
			chart.Series{Name: "p50", Y: col(func(s analyzer.DensityStep) float64 { return s.ReadinessP50 })},
			chart.Series{Name: "p99", Y: col(func(s analyzer.DensityStep) float64 { return s.ReadinessP99 })}),
		line("density-psi", "memory PSI full, share of the step", chart.Ratio,
			chart.Series{Name: "node cgroup", Y: col(func(s analyzer.DensityStep) float64 { return s.PSIMemoryFull })},
			chart.Series{Name: "host", Y: col(func(s analyzer.DensityStep) float64 { return s.HostPSIMemFull })}),
		line("density-memory", "memory and swap at each step", chart.Bytes,
			chart.Series{Name: "working set", Y: col(func(s analyzer.DensityStep) float64 { return s.WorkingSet })},
			chart.Series{Name: "swap used", Y: col(func(s analyzer.DensityStep) float64 { return max(s.SwapUsed, s.SwapFileUsed) })}),
		line("density-swap-io", "swap in and out", chart.Bytes,
			chart.Series{Name: "in per second", Y: col(func(s analyzer.DensityStep) float64 { return s.SwapIn })},
			chart.Series{Name: "out per second", Y: col(func(s analyzer.DensityStep) float64 { return s.SwapOut })}),
	}
	t := &Table{Head: []string{"sandboxes", "ready", "readiness p99", "tick lateness p99", "PSI memory full", "working set", "swap used", "OOM kills", "signals"}}
	for _, s := range d.Steps {
		t.Rows = append(t.Rows, []string{fmt.Sprint(s.Density), fmt.Sprint(s.Ready), chart.Format(s.ReadinessP99, chart.Seconds),
			chart.Format(s.TickLatenessP99, chart.Seconds), chart.Format(s.PSIMemoryFull, chart.Ratio), chart.Format(s.WorkingSet, chart.Bytes),
			chart.Format(max(s.SwapUsed, s.SwapFileUsed), chart.Bytes), fmt.Sprint(s.OOMKills), strings.Join(s.Signals, ", ")})
	}
	return []Section{{ID: "density", Title: "Density sweep", Intro: intro, Charts: charts, Table: t}}
}

func stormSections(s *analyzer.Storm) []Section {
	b := chart.Bars{ID: "storm-durable", Title: "time to durable per writer, per storm", YUnit: chart.Seconds}
	for _, r := range s.Rounds {
		b.Series = append(b.Series, chart.BarSeries{Name: r.Name})
	}
	for _, w := range s.Writers {
		b.Categories = append(b.Categories, w.Name)
		for i := range b.Series {
			v := math.NaN() // a writer whose fsync did not return in that storm has no bar
			if i < len(w.DurableSeconds) {
				v = w.DurableSeconds[i]
			}
			b.Series[i].Values = append(b.Series[i].Values, v)
		}
	}
	dev := chart.Bars{ID: "storm-device", Title: "the device per storm: mean queue and service time per request", YUnit: chart.Seconds, Stacked: true,
		Series: []chart.BarSeries{{Name: "queue"}, {Name: "service"}}}
	t := &Table{Head: []string{"storm", "writers", "durable p50", "durable max", "start skew", "device", "queue share", "explanation"}}
	for _, r := range s.Rounds {
		dev.Categories = append(dev.Categories, r.Name)
		dev.Series[0].Values = append(dev.Series[0].Values, r.QueueMean)
		dev.Series[1].Values = append(dev.Series[1].Values, r.ServiceMean)
		t.Rows = append(t.Rows, []string{r.Name, fmt.Sprint(r.Writers), chart.Format(r.DurableP50, chart.Seconds), chart.Format(r.DurableMax, chart.Seconds),
			chart.Format(r.StartSkew, chart.Seconds), r.Device, chart.Format(r.QueueShare, chart.Ratio), r.Explanation})
	}
	return []Section{{ID: "storm", Title: "fsync storms", Intro: "Each writer's time from its first write to its fsync's return, in every storm, and the device's side of each storm.",
		Charts: []template.HTML{b.SVG(), dev.SVG()}, Table: t}}
}

// summaryRows bounds the workloads table: an agent window of a dense node has hundreds.
const summaryRows = 400

// summaryTable is every workload in every phase, the first summaryRows of them.
func summaryTable(s analyzer.Summary) Section {
	intro := ""
	if len(s.Workloads) > summaryRows {
		intro = fmt.Sprintf("The first %d of %d rows; nodectl analyze -o json has them all.", summaryRows, len(s.Workloads))
		s.Workloads = s.Workloads[:summaryRows]
	}
	t := &Table{Head: []string{"workload", "kind", "phase", "CPU cores", "throttled", "run-queue wait", "run-queue p99", "block I/O", "fsync p95"}}
	for _, w := range s.Workloads {
		t.Rows = append(t.Rows, []string{w.Workload, w.Kind, w.Phase, fmt.Sprintf("%.2f", w.CPUCores), chart.Format(w.ThrottledRatio, chart.Ratio),
			chart.Format(w.RunqWait, chart.Seconds), chart.Format(w.RunqP99, chart.Seconds), chart.Format(w.IOBytes, chart.Bytes), chart.Format(w.FsyncP95, chart.Seconds)})
	}
	return Section{ID: "workloads", Title: "Workloads per phase", Intro: intro, Table: t}
}

//go:embed page.html.tmpl
var pageTemplate string

var page = template.Must(template.New("page").Funcs(template.FuncMap{
	"time": func(t time.Time) string { return t.Format(time.RFC3339) },
}).Parse(pageTemplate))

// Write writes the page as one HTML document.
func (p *Page) Write(w io.Writer) error {
	if err := page.Execute(w, p); err != nil {
		return fmt.Errorf("rendering the report: %w", err)
	}
	return nil
}

// WriteFile writes the page to path whole or not at all (internal/atomicfile).
func WriteFile(path string, p *Page) error {
	dir := filepath.Dir(path)
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return fmt.Errorf("writing the report %s: its directory %s does not exist", path, dir)
	}
	f, err := atomicfile.Create(path, 0o644)
	if err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	defer f.Abort()
	if err := p.Write(f); err != nil {
		return err
	}
	if err := f.Commit(); err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	return nil
}
