package report

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/nodectl/nodectl/analyzer"
	"github.com/nodectl/nodectl/rundir"
)

// JSON writes the report as the findings JSON contract (ARCHITECTURE.md).
func JSON(w io.Writer, r *analyzer.Report) error { return encode(w, r) }

// ScenarioJSON writes what `nodectl stress <scenario> -o json` prints: a wake run's limits, a
// sweep's steps, collapse and ceiling, a storm's writers and rounds, each with the findings;
// for any other run (noisy) the whole report.
func ScenarioJSON(w io.Writer, r *analyzer.Report) error {
	switch r.Run.Scenario {
	case rundir.ScenarioWake:
		return wakeJSON(w, r)
	case rundir.ScenarioDensity:
		return densityJSON(w, r)
	case rundir.ScenarioFsyncStorm:
		return stormJSON(w, r)
	}
	return JSON(w, r)
}

// wakeJSON writes the limits and findings of a wake run's report.
func wakeJSON(w io.Writer, r *analyzer.Report) error {
	limits := r.Limits
	if limits == nil {
		limits = []analyzer.WakeLimit{}
	}
	return encode(w, analyzer.WakeReport{Limits: limits, Findings: r.Findings})
}

// densityJSON writes a density run's steps, collapse, ceiling and findings.
func densityJSON(w io.Writer, r *analyzer.Report) error {
	dr := r.Density
	if dr == nil {
		dr = &analyzer.DensityReport{Steps: []analyzer.DensityStep{}}
	}
	return encode(w, struct {
		*analyzer.DensityReport
		Findings []analyzer.Finding `json:"findings"`
	}{dr, r.Findings})
}

// stormJSON writes the writers, rounds and findings of an fsync-storm run's report.
func stormJSON(w io.Writer, r *analyzer.Report) error {
	out := analyzer.StormReport{Writers: []analyzer.StormWriter{}, Rounds: []analyzer.StormRound{}, Findings: r.Findings}
	if r.Storm != nil {
		out.Writers, out.Rounds = r.Storm.Writers, r.Storm.Rounds
	}
	return encode(w, out)
}

// DiffJSON writes the diff as `nodectl diff -o json` (docs/run-format.md).
func DiffJSON(w io.Writer, d *analyzer.DiffReport) error { return encode(w, d) }

// encode writes v indented, its text as it is (no HTML escapes: a culprit "a ← b" stays so).
func encode(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("rendering report: %w", err)
	}
	return nil
}
