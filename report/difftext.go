package report

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/nodectl/nodectl/analyzer"
	"github.com/nodectl/nodectl/internal/human"
)

// DiffText writes the diff for a person: both runs, each workload's measures side by
// side with B/A, and the findings of both runs. Measures that are zero in both runs are left
// out of the table.
func DiffText(w io.Writer, d *analyzer.DiffReport) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	p := func(format string, args ...any) { fmt.Fprintf(tw, format, args...) }

	for _, side := range []struct {
		name string
		run  analyzer.DiffRun
	}{{"A", d.A}, {"B", d.B}} {
		r := side.run.Run
		p("%s: run %s: scenario %s on %s, kernel %s; %s %s\n", side.name, r.ID, r.Scenario, r.Node, r.Kernel,
			side.run.Window.Name, human.Seconds(side.run.Window.Seconds()))
	}

	if dd := d.Density; dd != nil {
		collapse := func(c *analyzer.DensityCollapse) string {
			if c == nil {
				return "no collapse"
			}
			return fmt.Sprintf("collapsed at %d (%s)", c.Density, c.Signal)
		}
		gain := "-"
		if dd.Gain != nil {
			gain = fmtRatio(*dd.Gain)
		}
		p("\ndensity\tA\tB\tB/A\n")
		p("max stable\t%d\t%d\t%s\n", dd.MaxStableA, dd.MaxStableB, gain)
		p("collapse\t%s\t%s\t\n", collapse(dd.CollapseA), collapse(dd.CollapseB))
		p("ceiling\t%s\t%s\t\n", orDash(dd.CeilingA), orDash(dd.CeilingB))
	}
	if len(d.Workloads) > 0 {
		p("\nworkload\tmeasure\tA\tB\tB/A\n")
	}
	for _, wd := range d.Workloads {
		name := wd.Workload
		if wd.In != "" {
			name += " (" + strings.ToUpper(wd.In) + " only)"
		}
		shown := 0
		for _, m := range wd.Metrics {
			if orZero(m.A) == 0 && orZero(m.B) == 0 {
				continue
			}
			ratio := ""
			if m.Ratio != nil {
				ratio = fmtRatio(*m.Ratio)
			}
			p("%s\t%s\t%s\t%s\t%s\n", name, analyzer.MetricLabel(m.Metric), fmtDiff(m.A, m.Unit), fmtDiff(m.B, m.Unit), ratio)
			name = ""
			shown++
		}
		if shown == 0 {
			p("%s\t(nothing measured)\n", name)
		}
	}

	p("\n")
	if len(d.A.Findings) == 0 && len(d.B.Findings) == 0 {
		p("no findings in either run\n")
	} else {
		p("finding\tvictim\tA\tB\tchange\n")
	}
	all := slices.Clone(d.A.Findings)
	for _, f := range d.B.Findings {
		if !slices.ContainsFunc(all, analyzer.SameFinding(f)) {
			all = append(all, f)
		}
	}
	for _, f := range all {
		change := ""
		for _, c := range d.FindingsChanged {
			if c.ID == f.ID && c.Victim == f.Victim {
				change = map[string]string{analyzer.SideA: "gone", analyzer.SideB: "appeared"}[c.In]
			}
		}
		p("%s\t%s\t%s\t%s\t%s\n", f.ID, f.Victim, findingCell(d.A.Findings, f), findingCell(d.B.Findings, f), change)
	}

	for _, side := range []struct {
		name  string
		notes []string
	}{{"A", d.A.Notes}, {"B", d.B.Notes}, {"", d.Notes}} {
		for _, n := range side.notes {
			if side.name != "" {
				n = "run " + side.name + ": " + n
			}
			p("\nnote: %s\n", n)
		}
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("rendering diff: %w", err)
	}
	return nil
}

// findingCell is how a run's list shows finding f: its severity and culprits, or "-".
func findingCell(list []analyzer.Finding, f analyzer.Finding) string {
	i := slices.IndexFunc(list, analyzer.SameFinding(f))
	if i < 0 {
		return "-"
	}
	if len(list[i].Culprits) == 0 {
		return list[i].Severity
	}
	return list[i].Severity + ": " + strings.Join(list[i].Culprits, ", ")
}

func orZero(v *float64) float64 {
	if v == nil {
		return 0
	}
	return *v
}

// fmtRatio prints B/A as a factor, with two significant digits below 1 so that a drop to a
// few percent does not read as 0.
func fmtRatio(r float64) string {
	if r < 1 {
		return fmt.Sprintf("%.2gx", r)
	}
	return human.Factor(r)
}

func fmtDiff(v *float64, unit string) string {
	switch {
	case v == nil:
		return "-"
	case unit == analyzer.UnitCores:
		return fmt.Sprintf("%.2f", *v)
	}
	return fmtUnit(*v, unit)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
