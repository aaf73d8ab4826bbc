package analyzer

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"

	"github.com/nodectl/nodectl/rundir/hist"
)

// RenderJSON writes the report as the findings JSON contract (ARCHITECTURE.md).
func RenderJSON(w io.Writer, r *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("rendering report: %w", err)
	}
	return nil
}

// RenderText writes the report for a person in its scenario's form: a density sweep's step
// table or a storm's tables by writer and round, else the summary tables; then each finding
// with its culprits and evidence, and the notes.
func RenderText(w io.Writer, r *Report) error {
	switch {
	case r.Density != nil:
		return densityText(w, r.Density, r)
	case r.Storm != nil:
		return stormText(w, r)
	}
	return reportText(w, r)
}

// reportText writes the run, its summary tables, the findings and the notes.
func reportText(w io.Writer, r *Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	p := func(format string, args ...any) { fmt.Fprintf(tw, format, args...) }

	p("run %s: scenario %s on %s, kernel %s\n", r.Run.ID, r.Run.Scenario, r.Run.Node, r.Run.Kernel)
	if len(r.Limits) > 0 {
		// A wake run's phases are its starts: its table by limit says what they measured.
		wakeTable(p, r.Limits)
	} else {
		summaryTables(p, r)
	}

	if len(r.Findings) == 0 {
		p("\nno findings\n")
	}
	for _, f := range r.Findings {
		p("\n%s %s: %s\n", strings.ToUpper(f.Severity), f.ID, f.Victim)
		p("  %s\n", f.Summary)
		if len(f.Culprits) > 0 {
			p("  culprits: %s\n", strings.Join(f.Culprits, ", "))
		}
		if len(f.Affects) > 0 {
			p("  affects: %s\n", strings.Join(f.Affects, ", "))
		}
		p("  evidence\tworkload\t%s\t%s\tchange\n", baselineOf(f), phaseOf(f))
		for _, e := range f.Evidence {
			who := e.Workload
			switch {
			case e.Culprit != "":
				who += " ← " + e.Culprit
			case who == "" && e.Device != "":
				who = "device " + e.Device
			}
			p("  %s\t%s\t%s\t%s\t%s\n", e.Metric, who, fmtUnit(e.Baseline, e.Unit), fmtUnit(e.Value, e.Unit), change(e))
		}
		for _, e := range f.Evidence {
			if e.Histogram != nil && e.Histogram.Count > 0 {
				p("  %s in %s, by duration: %s\n", e.Metric, e.Phase, fmtHist(*e.Histogram))
			}
		}
	}
	for _, n := range r.Notes {
		p("\nnote: %s\n", n)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("rendering report: %w", err)
	}
	return nil
}

// summaryTables prints the phases, the victim probes, every workload by phase and the rankings.
func summaryTables(p func(string, ...any), r *Report) {
	for _, ph := range r.Summary.Phases {
		p("  %s\t%s\n", ph.Name, fmtSeconds(ph.Seconds()))
	}

	var probes []WorkloadPhase
	for _, wp := range r.Summary.Workloads {
		if wp.Probe != nil {
			probes = append(probes, wp)
		}
	}
	if len(probes) > 0 {
		p("\nvictim probe\tphase\titerations\tcpu work p50\tp95\twrite+fsync p50\tp95\tfsync p95\n")
		for _, wp := range probes {
			pr := wp.Probe
			p("%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", wp.Workload, wp.Phase, pr.Iterations,
				fmtSeconds(pr.CPUWorkP50), fmtSeconds(pr.CPUWorkP95),
				fmtSeconds(pr.WriteFsyncP50), fmtSeconds(pr.WriteFsyncP95), fmtSeconds(pr.FsyncP95))
		}
	}
	if len(r.Summary.Workloads) > 0 {
		p("\nworkload\tphase\tcpu cores\tthrottled\trun-queue p99\trun-queue wait\tblock I/O\n")
		for _, wp := range r.Summary.Workloads {
			p("%s\t%s\t%.2f\t%s\t%s\t%s\t%s\n", wp.Workload, wp.Phase, wp.CPUCores, fmtPercent(wp.ThrottledRatio),
				fmtSeconds(wp.RunqP99), fmtSeconds(wp.RunqWait), fmtBytes(wp.IOBytes))
		}
	}

	rk := r.Summary.Ranking
	for _, list := range []struct {
		title string
		items []Ranked
		value func(Ranked) string
	}{
		{"run-queue wait", rk.RunqWait, func(x Ranked) string { return fmtSeconds(x.Value) }},
		{"fsync p95", rk.Fsync, func(x Ranked) string { return fmt.Sprintf("%s (%d fsyncs)", fmtSeconds(x.Value), x.Count) }},
		{"block I/O", rk.IOBytes, func(x Ranked) string { return fmtBytes(x.Value) }},
	} {
		if len(list.items) == 0 {
			continue
		}
		p("\ntop cgroups by %s in %s\n", list.title, rk.Window)
		for _, x := range list.items {
			name := x.Cgroup
			if x.Workload != "" {
				name = x.Workload + " (" + x.Cgroup + ")"
			}
			p("  %s\t%s\n", name, list.value(x))
		}
	}
}

// phaseOf names the phase a finding's evidence measures.
func phaseOf(f Finding) string {
	if len(f.Evidence) > 0 && f.Evidence[0].Phase != "" {
		return f.Evidence[0].Phase
	}
	return "value" //rundir:other
}

// baselineOf names what a finding's evidence is compared with: the baseline phase, or in a wake
// run the fastest CPU limit.
func baselineOf(f Finding) string {
	if phaseOf(f) == phaseWake {
		return "fastest limit"
	}
	return "baseline" //rundir:other: a word of the report
}

// change is how Value compares with Baseline: a factor, or blank when it says nothing.
func change(e Evidence) string {
	if e.Unit == UnitRatio || e.Baseline <= 0 || e.Value <= 0 {
		return ""
	}
	return factor(e.Value / e.Baseline)
}

func fmtUnit(v float64, unit string) string {
	switch unit {
	case UnitSeconds:
		return fmtSeconds(v)
	case UnitBytes:
		return fmtBytes(v)
	case UnitRatio:
		return fmtPercent(v)
	}
	return fmt.Sprintf("%.0f", v)
}

// factor prints a ratio as "5.7x".
func factor(r float64) string {
	if math.IsInf(r, 1) {
		return "from nothing"
	}
	if r >= 10 {
		return fmt.Sprintf("%.0fx", r)
	}
	return fmt.Sprintf("%.1fx", r)
}

func fmtSeconds(s float64) string {
	switch {
	case s == 0:
		return "0"
	case s >= 1:
		return fmt.Sprintf("%.2fs", s)
	case s >= 1e-3:
		return fmt.Sprintf("%.3gms", s*1e3)
	default:
		return fmt.Sprintf("%.3gµs", s*1e6)
	}
}

func fmtBytes(b float64) string {
	for _, u := range []struct {
		name string
		size float64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if b >= u.size {
			return fmt.Sprintf("%.1f %s", b/u.size, u.name)
		}
	}
	return fmt.Sprintf("%.0f B", b)
}

// fmtPercent prints a ratio as a percentage, small ones (a p-value) with two significant digits.
func fmtPercent(r float64) string {
	switch {
	case r == 0 || r >= 0.01:
		return fmt.Sprintf("%.0f%%", r*100)
	case r >= 1e-6:
		return fmt.Sprintf("%.2g%%", r*100)
	}
	return "<0.0001%"
}

// fmtHist lists a log2 histogram's non-empty buckets: "[1.05ms, 2.1ms) 40, [2.1ms, 4.19ms) 3".
func fmtHist(h hist.Log2) string {
	var parts []string
	for i, n := range h.Buckets {
		if n == 0 {
			continue
		}
		lo := 0.0
		if i > 0 {
			lo = math.Ldexp(1, i) / 1e9
		}
		parts = append(parts, fmt.Sprintf("[%s, %s) %d", fmtSeconds(lo), fmtSeconds(math.Ldexp(1, i+1)/1e9), n))
	}
	return strings.Join(parts, ", ")
}
