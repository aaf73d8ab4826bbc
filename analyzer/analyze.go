package analyzer

import (
	"errors"

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

// registry picks the rules by scenario. Every scenario also gets commonRules: memory trouble
// and swap thrashing can hit any run. A scenario missing here (a newer writer's) gets only
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
	}, run: []runRule{(*analysis).observedRule, (*analysis).leaseLate, (*analysis).bookingCeiling}},
}

var commonRules = []runRule{
	func(a *analysis, rep *Report) { rep.Findings = append(rep.Findings, a.memory()...) },
	func(a *analysis, rep *Report) { rep.Findings = append(rep.Findings, a.swapThrashing()...) },
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
	return rep, nil
}

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
