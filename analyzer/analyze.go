package analyzer

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/nodectl/nodectl/rundir"
)

// workloadRule explains one workload's effect, or returns nil.
type workloadRule func(a *analysis, w rundir.Workload) *Finding

// runRule adds to the report what it finds over the whole run: findings, a scenario's table,
// notes.
type runRule func(a *analysis, rep *Report)

// scenarioRules are the rules of one scenario: by the kind of workload they explain, then over
// the whole run.
type scenarioRules struct {
	byKind map[string][]workloadRule
	run    []runRule
}

// registry picks the rules by scenario. Every scenario also gets commonRules: memory trouble,
// swap thrashing and a full swap limit can hit any run. A scenario missing here (a newer writer's) gets only
// those.
var registry = map[string]scenarioRules{
	rundir.ScenarioNoisy: {byKind: map[string][]workloadRule{
		rundir.KindVictim:    {(*analysis).cpuThrottling, (*analysis).cpuContention, (*analysis).diskContention},
		rundir.KindHeartbeat: {(*analysis).systemDaemonStarvation},
		rundir.KindDaemon:    {(*analysis).daemonStarvation},
	}},
	rundir.ScenarioRecord:     {},
	rundir.ScenarioWake:       {run: []runRule{(*analysis).wakeRule}},
	rundir.ScenarioFsyncStorm: {run: []runRule{(*analysis).storm}},
	// A sweep of pods holds the agent's bookings of the node too.
	rundir.ScenarioDensity: {run: []runRule{(*analysis).densityRule, (*analysis).bookingCeiling}},
	rundir.ScenarioAgent: {byKind: map[string][]workloadRule{
		rundir.KindObserved: observedRules,
		rundir.KindDaemon:   {(*analysis).daemonStarvation},
	}, run: []runRule{(*analysis).observedRule, (*analysis).leaseLate, (*analysis).bookingCeiling, (*analysis).nodeCollapse}},
}

var commonRules = []runRule{
	func(a *analysis, rep *Report) { rep.Findings = append(rep.Findings, a.memory()...) },
	func(a *analysis, rep *Report) { rep.Findings = append(rep.Findings, a.swapThrashing()...) },
	func(a *analysis, rep *Report) { rep.Findings = append(rep.Findings, a.swapLimits()...) },
}

// Analyze applies the run's scenario's rules and summarises it.
func Analyze(run *rundir.Run) (*Report, error) {
	if run == nil {
		return nil, errors.New("analyzing run: no run")
	}
	a := newAnalysis(run)
	rep := &Report{
		Run: RunInfo{ID: run.Meta.ID, Scenario: run.Meta.Scenario, Node: run.Meta.Node, Kernel: run.Meta.Kernel},
		// Never null in JSON: an empty list says "nothing found".
		Findings: []Finding{},
		Summary:  a.summary(),
		Notes:    notes(run),
	}
	rules := registry[run.Meta.Scenario]
	for _, w := range run.Meta.Workloads {
		for _, rule := range rules.byKind[w.Kind] {
			if f := rule(a, w); f != nil {
				rep.Findings = append(rep.Findings, *f)
			}
		}
	}
	for _, rule := range commonRules {
		rule(a, rep)
	}
	for _, rule := range rules.run {
		rule(a, rep)
	}
	rep.Notes = append(rep.Notes, a.unexplained(rep.Findings)...)
	rep.Notes = append(rep.Notes, finiteEvidence(rep.Findings)...)
	return rep, nil
}

// finiteEvidence leaves out of the findings any evidence that is not a finite number (a rule's
// ratio over nothing), which no JSON can hold and which would lose the whole report, and says
// so in a note: a rule's bug shows, and the rest of the report stands.
func finiteEvidence(findings []Finding) []string {
	var notes []string
	for i := range findings {
		f := &findings[i]
		f.Evidence = slices.DeleteFunc(f.Evidence, func(e Evidence) bool {
			if finite(e.Baseline) && finite(e.Value) {
				return false
			}
			notes = append(notes, fmt.Sprintf("%s of %s: evidence %s (%v against %v) is not a finite number and was left out",
				f.ID, f.Victim, e.Metric, e.Value, e.Baseline))
			return true
		})
	}
	return notes
}

func finite(v float64) bool { return !math.IsInf(v, 0) && !math.IsNaN(v) }

// wakeRule tabulates a wake run by CPU limit, with its findings and the starts that never
// answered.
func (a *analysis) wakeRule(rep *Report) {
	var found []Finding
	var missing []string
	rep.Limits, found, missing = a.wake()
	rep.Findings = append(rep.Findings, found...)
	rep.Notes = append(rep.Notes, missing...)
}

// densityRule tabulates a density sweep and explains its collapse.
func (a *analysis) densityRule(rep *Report) {
	rep.Density = a.densityTable()
	if f := a.memoryCollapse(rep.Density); f != nil {
		rep.Findings = append(rep.Findings, *f)
	}
}
