package report

import (
	"fmt"
	"html/template"
	"strings"
	"time"

	"github.com/nodectl/nodectl/analyzer"
	"github.com/nodectl/nodectl/report/chart"
	"github.com/nodectl/nodectl/rundir"
)

// FromDiff is the report of two runs compared: the findings that appeared or went, each
// workload's measures in A and B with their ratio, then each run's charts side by side, A on
// the left and B on the right.
func FromDiff(a, b *rundir.Run, d *analyzer.DiffReport) (*Page, error) {
	var reps [2]*analyzer.Report
	for i, run := range []*rundir.Run{a, b} {
		rep, err := analyzer.Analyze(run)
		if err != nil {
			return nil, err
		}
		reps[i] = rep
	}
	p := &Page{
		Title:     fmt.Sprintf("nodectl diff: %s (A) against %s (B)", d.A.Run.ID, d.B.Run.ID),
		Subtitle:  fmt.Sprintf("A: %s on %s · B: %s on %s", d.A.Run.Scenario, d.A.Run.Node, d.B.Run.Scenario, d.B.Run.Node),
		Generated: time.Now().UTC(),
		Notes:     d.Notes,
	}
	// The findings of B first (the run after the change), then those gone from A.
	p.Findings = findings(d.B.Findings)
	changed := &Table{Head: []string{"finding", "victim", "change"}}
	for _, c := range d.FindingsChanged {
		what := "appeared in B"
		if c.In == analyzer.SideA {
			what = "gone in B"
		}
		changed.Rows = append(changed.Rows, []string{c.ID, c.Victim, what})
	}
	p.Sections = append(p.Sections, Section{ID: "changes", Title: "Findings that changed", Table: changed})
	if dd := d.Density; dd != nil {
		t := &Table{Head: []string{"", "A", "B"}, Rows: [][]string{
			{"highest stable density", fmt.Sprint(dd.MaxStableA), fmt.Sprint(dd.MaxStableB)},
			{"ceiling", dd.CeilingA, dd.CeilingB},
		}}
		gain := ""
		if dd.Gain != nil {
			gain = fmt.Sprintf("B holds %.2fx A's density.", *dd.Gain)
		}
		p.Sections = append(p.Sections, Section{ID: "density-gain", Title: "Density", Intro: gain, Table: t})
	}
	measures := &Table{Head: []string{"workload", "measure", "A", "B", "B/A"}}
	for _, w := range d.Workloads {
		for _, m := range w.Metrics {
			if m.A == nil && m.B == nil {
				continue
			}
			ratio := ""
			if m.Ratio != nil {
				ratio = fmt.Sprintf("%.2f", *m.Ratio)
			}
			measures.Rows = append(measures.Rows, []string{w.Workload, m.Metric, side(m.A, m.Unit), side(m.B, m.Unit), ratio})
		}
	}
	p.Sections = append(p.Sections, Section{ID: "measures", Title: "Each workload in A and B", Table: measures})
	sa, sb := FromRun(a, reps[0]).Sections, FromRun(b, reps[1]).Sections
	for i := range min(len(sa), len(sb)) {
		s := Section{ID: "ab-" + sa[i].ID, Title: sa[i].Title + ": A (left), B (right)"}
		for j := range max(len(sa[i].Charts), len(sb[i].Charts)) {
			s.Charts = append(s.Charts, prefixed("a-", at(sa[i].Charts, j)), prefixed("b-", at(sb[i].Charts, j)))
		}
		if len(s.Charts) > 0 {
			p.Sections = append(p.Sections, s)
		}
	}
	return p, nil
}

func side(v *float64, unit string) string {
	if v == nil {
		return "—"
	}
	if unit == "cores" {
		return fmt.Sprintf("%.2f cores", *v)
	}
	return chart.Format(*v, unitOf(unit))
}

// prefixed gives a chart of one side its own id: both runs draw charts of the same ids.
func prefixed(p string, c template.HTML) template.HTML {
	return template.HTML(strings.Replace(string(c), ` id="`, ` id="`+p, 1))
}

// at is the chart at i, or an empty cell where one side has fewer.
func at(charts []template.HTML, i int) template.HTML {
	if i < len(charts) {
		return charts[i]
	}
	return template.HTML(`<p class="nodata">not in this run</p>`)
}
