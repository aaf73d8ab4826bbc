package report

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/nodectl/nodectl/analyzer"
	"github.com/nodectl/nodectl/internal/human"
	"github.com/nodectl/nodectl/rundir/hist"
)

// Text writes the report for a person in its scenario's form: a density sweep's step
// table or a storm's tables by writer and round, else the summary tables; then each finding
// with its culprits and evidence, and the notes.
func Text(w io.Writer, r *analyzer.Report) error {
	switch {
	case r.Density != nil:
		return densityText(w, r.Density, r)
	case r.Storm != nil:
		return stormText(w, r)
	}
	return reportText(w, r)
}

// reportText writes the run, its summary tables, the findings and the notes.
func reportText(w io.Writer, r *analyzer.Report) error {
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
func summaryTables(p func(string, ...any), r *analyzer.Report) {
	for _, ph := range r.Summary.Phases {
		p("  %s\t%s\n", ph.Name, human.Seconds(ph.Seconds()))
	}

	var probes []analyzer.WorkloadPhase
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
				human.Seconds(pr.CPUWorkP50), human.Seconds(pr.CPUWorkP95),
				human.Seconds(pr.WriteFsyncP50), human.Seconds(pr.WriteFsyncP95), human.Seconds(pr.FsyncP95))
		}
	}
	if len(r.Summary.Workloads) > 0 {
		p("\nworkload\tphase\tcpu cores\tthrottled\trun-queue p99\trun-queue wait\tblock I/O\n")
		for _, wp := range r.Summary.Workloads {
			p("%s\t%s\t%.2f\t%s\t%s\t%s\t%s\n", wp.Workload, wp.Phase, wp.CPUCores, human.Percent(wp.ThrottledRatio),
				human.Seconds(wp.RunqP99), human.Seconds(wp.RunqWait), human.Bytes(wp.IOBytes))
		}
	}

	rk := r.Summary.Ranking
	for _, list := range []struct {
		title string
		items []analyzer.Ranked
		value func(analyzer.Ranked) string
	}{
		{"run-queue wait", rk.RunqWait, func(x analyzer.Ranked) string { return human.Seconds(x.Value) }},
		{"fsync p95", rk.Fsync, func(x analyzer.Ranked) string { return fmt.Sprintf("%s (%d fsyncs)", human.Seconds(x.Value), x.Count) }},
		{"block I/O", rk.IOBytes, func(x analyzer.Ranked) string { return human.Bytes(x.Value) }},
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
func phaseOf(f analyzer.Finding) string {
	if len(f.Evidence) > 0 && f.Evidence[0].Phase != "" {
		return f.Evidence[0].Phase
	}
	return "value" //rundir:other
}

// baselineOf names what a finding's evidence is compared with: the baseline phase, or in a wake
// run the fastest CPU limit.
func baselineOf(f analyzer.Finding) string {
	if phaseOf(f) == analyzer.PhaseWake {
		return "fastest limit"
	}
	return "baseline" //rundir:other: a word of the report
}

// change is how Value compares with Baseline: a factor, or blank when it says nothing.
func change(e analyzer.Evidence) string {
	if e.Unit == analyzer.UnitRatio || e.Baseline <= 0 || e.Value <= 0 {
		return ""
	}
	return human.Factor(e.Value / e.Baseline)
}

func fmtUnit(v float64, unit string) string {
	switch unit {
	case analyzer.UnitSeconds:
		return human.Seconds(v)
	case analyzer.UnitBytes:
		return human.Bytes(v)
	case analyzer.UnitRatio:
		return human.Percent(v)
	}
	return fmt.Sprintf("%.0f", v)
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
		parts = append(parts, fmt.Sprintf("[%s, %s) %d", human.Seconds(lo), human.Seconds(math.Ldexp(1, i+1)/1e9), n))
	}
	return strings.Join(parts, ", ")
}

// wakeTable prints the wake run's limits, one row each.
func wakeTable(p func(string, ...any), limits []analyzer.WakeLimit) {
	p("\ncpu limit\tstarts\twake p50\tp95\tthrottled share\tthrottled p50\tcpu used p50\trun-queue wait p50\tboot p50 (inside)\n")
	for _, l := range limits {
		if l.Starts == 0 {
			p("%s\t0\t-\t-\t-\t-\t-\t-\t-\n", l.CPU)
			continue
		}
		p("%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s (%s)\t%s\n", l.CPU, l.Starts, human.Seconds(l.WakeP50), human.Seconds(l.WakeP95),
			human.Percent(l.ThrottledShare), human.Seconds(l.ThrottledP50), human.Seconds(l.CPUUsageP50),
			human.Seconds(l.RunqWaitP50), l.RunqWaitSource, human.Seconds(l.BootP50))
	}
}

// densityText writes the sweep's table (density × readiness × memory signals), its collapse
// and ceiling, then the findings and notes of the report.
func densityText(w io.Writer, dr *analyzer.DensityReport, rep *analyzer.Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "density\tready\treadiness p50\tp99\ttick late max\tPSI mem some\tfull\tworking set\tswap used\tswap in/s\tout/s\trefaults/s\treclaim stall\tOOM kills\tcpu\tsignals\t\n")
	for _, s := range dr.Steps {
		fmt.Fprintf(tw, "%d\t%d/%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.0f\t%s\t%.0f\t%.2f\t%s\t\n", s.Density, s.Ready, s.Started,
			human.Seconds(s.ReadinessP50), human.Seconds(s.ReadinessP99), human.Seconds(s.TickLatenessMax),
			human.Percent(s.PSIMemorySome), human.Percent(s.PSIMemoryFull), human.Bytes(s.WorkingSet), human.Bytes(s.SwapUsed),
			human.Bytes(s.SwapIn), human.Bytes(s.SwapOut), s.RefaultsFile+s.RefaultsAnon, human.Seconds(s.ReclaimStall), s.OOMKills, s.CPUCores, strings.Join(s.Signals, ","))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if dr.Collapse != nil {
		fmt.Fprintf(w, "\ncollapse at %d sandboxes: %s (%s); max stable %d\n", dr.Collapse.Density, dr.Collapse.Signal,
			dr.Collapse.Crossing(), dr.MaxStable)
	} else {
		fmt.Fprintf(w, "\nno collapse up to %d sandboxes\n", dr.MaxStable)
	}
	if dr.Ceiling != nil {
		fmt.Fprintf(w, "ceiling: %s: %s\n\n", dr.Ceiling.Resource, dr.Ceiling.Explanation)
	}
	// The per-workload summary of every sandbox in every step would bury the table.
	short := *rep
	short.Summary = analyzer.Summary{}
	return reportText(w, &short)
}

// stormText writes the storm's tables and each round's explanation, then the findings and
// notes.
func stormText(w io.Writer, r *analyzer.Report) error {
	if r.Storm != nil {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		p := func(format string, args ...any) { fmt.Fprintf(tw, format, args...) }
		traced := slices.ContainsFunc(r.Storm.Rounds, func(rd analyzer.StormRound) bool { return rd.QueueMean+rd.ServiceMean > 0 })
		p("writer\tdurable per storm\tp50\tmax\twrite p50\tfsync p50\tblock I/O\tqueue mean\tservice mean\n")
		for _, sw := range r.Storm.Writers {
			var each []string
			for _, d := range sw.DurableSeconds {
				each = append(each, human.Seconds(d))
			}
			blk, queue, service := "-", "-", "-" // untraced: unknown, not zero
			if traced {
				blk, queue, service = human.Bytes(sw.Bytes), human.Seconds(sw.QueueMean), human.Seconds(sw.ServiceMean)
			}
			p("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", sw.Name, strings.Join(each, " "), human.Seconds(sw.DurableP50), human.Seconds(sw.DurableMax),
				human.Seconds(sw.WriteP50), human.Seconds(sw.FsyncP50), blk, queue, service)
		}
		p("\nstorm\twriters\tdurable p50\tmax\tslowest\tstart skew\tqueue share\tqueue mean\tservice mean\tdirty peak\n")
		for _, rd := range r.Storm.Rounds {
			share, queue, service := "-", "-", "-"
			if traced {
				share, queue, service = human.Percent(rd.QueueShare), human.Seconds(rd.QueueMean), human.Seconds(rd.ServiceMean)
			}
			p("%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", rd.Name, rd.Writers, human.Seconds(rd.DurableP50), human.Seconds(rd.DurableMax),
				rd.Slowest, human.Seconds(rd.StartSkew), share, queue, service, human.Bytes(rd.DirtyPeak))
		}
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("rendering report: %w", err)
		}
		for _, rd := range r.Storm.Rounds {
			fmt.Fprintf(w, "\n%s: %s\n", rd.Name, rd.Explanation)
		}
		fmt.Fprintln(w)
	}
	rest := *r
	rest.Summary = analyzer.Summary{} // the storm's tables say what the summary's would, per storm
	return reportText(w, &rest)
}
