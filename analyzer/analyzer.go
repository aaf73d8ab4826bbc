// Package analyzer explains a recorded run: it compares each victim's stress phase with its
// baseline, names the cgroups that caused a slowdown, and renders the report. The findings and
// their thresholds are documented in docs/findings.md.
package analyzer

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"path"
	"slices"
	"strings"

	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

// Finding ids (extend, never rename).
const (
	IDCPUContention  = "cpu-contention"
	IDCPUThrottling  = "cpu-throttling"
	IDDiskContention = "disk-contention"
)

// Severities.
const (
	SeverityCritical = "critical"
	SeverityWarning  = "warning"
	SeverityInfo     = "info"
)

// SeverityRank orders severities: critical 3, warning 2, info 1, anything else (none) 0.
func SeverityRank(s string) int {
	switch s {
	case SeverityCritical:
		return 3
	case SeverityWarning:
		return 2
	case SeverityInfo:
		return 1
	}
	return 0
}

// Worst is the highest severity of the report's findings, "" without findings.
func (r *Report) Worst() string {
	worst := ""
	for _, f := range r.Findings {
		if SeverityRank(f.Severity) > SeverityRank(worst) {
			worst = f.Severity
		}
	}
	return worst
}

// Evidence units.
const (
	UnitSeconds = "seconds"
	UnitBytes   = "bytes"
	UnitCount   = "count"
	UnitRatio   = "ratio"
)

// Report is the analyzer's output: `nodectl analyze -o json` and findings.json.
type Report struct {
	Run      RunInfo   `json:"run"`
	Findings []Finding `json:"findings"`
	Summary  Summary   `json:"summary"`
	// Notes say what the run is missing: tracer programs that did not attach, events the
	// tracer dropped, a record lost to a crash. Findings are weaker for each of them.
	Notes []string `json:"notes,omitempty"`
	// Limits tabulates a wake run by CPU limit (absent for other scenarios).
	Limits []WakeLimit `json:"limits,omitempty"`
	// Storm tabulates an fsync-storm run by writer and storm (absent for other scenarios).
	Storm *Storm `json:"storm,omitempty"`
	// Density tabulates a density sweep by step, with its collapse and ceiling (absent for
	// other scenarios).
	Density *DensityReport `json:"density,omitempty"`
}

// RunInfo identifies the analyzed run.
type RunInfo struct {
	ID       string `json:"id"`
	Scenario string `json:"scenario"`
	Node     string `json:"node"`
	Kernel   string `json:"kernel"`
}

// Finding is one explained effect.
type Finding struct {
	ID       string   `json:"id"`
	Severity string   `json:"severity"`
	Victim   string   `json:"victim"`
	Culprits []string `json:"culprits"`
	// Affects lists which of the victim's measured operations this cause slowed (cpu_work,
	// write_fsync, fsync): a finding is named by its cause, so an fsync slowed by CPU contention
	// is listed in cpu-contention's, not in disk-contention's. Absent when no probe measure is
	// concerned.
	Affects  []string   `json:"affects,omitempty"`
	Summary  string     `json:"summary"`
	Evidence []Evidence `json:"evidence"`
}

// Evidence is one measured number behind a finding: Value in Phase against Baseline, the same
// measure in the baseline phase.
type Evidence struct {
	Metric   string  `json:"metric"`
	Workload string  `json:"workload"`          // whose measure; empty for a device-wide one
	Culprit  string  `json:"culprit,omitempty"` // the neighbour a per-culprit measure is charged to
	Device   string  `json:"device,omitempty"`  // MAJ:MIN of a device-wide measure
	Phase    string  `json:"phase"`
	Baseline float64 `json:"baseline"`
	Value    float64 `json:"value"`
	Unit     string  `json:"unit"`
	// Histogram is the distribution behind a measure of many events (the reclaim stalls of
	// memory-reclaim), in Phase; absent for other measures.
	Histogram *hist.Log2 `json:"histogram,omitempty"`
}

// analysis holds what every rule needs: the windows to compare and the cgroup names.
type analysis struct {
	run      *rundir.Run
	windows  []rundir.Window // the phases, or the whole run when it has none
	baseline rundir.Window
	stress   rundir.Window
	compare  bool              // both a baseline and a stress phase were recorded
	names    map[string]string // cgroup -> workload name
	victims  map[string]*victimView
}

func newAnalysis(run *rundir.Run) *analysis {
	a := &analysis{run: run, windows: run.Phases(), names: map[string]string{}, victims: map[string]*victimView{}}
	if len(a.windows) == 0 {
		a.windows = []rundir.Window{run.Span()}
	}
	for _, w := range run.Meta.Workloads {
		a.names[w.Cgroup] = w.Name
	}
	// An agent window on a Kubernetes node names pods' cgroups after them.
	for _, p := range run.Meta.Pods {
		if _, ok := a.names[p.Cgroup]; !ok {
			a.names[p.Cgroup] = p.Name
		}
	}
	b, okB := run.Phase(rundir.PhaseBaseline)
	s, okS := run.Phase(rundir.PhaseStress)
	if !okS {
		// An agent window examines its window against the quiet one before it.
		s, okS = run.Phase(rundir.PhaseWindow)
	}
	a.baseline, a.stress, a.compare = b, s, okB && okS
	return a
}

// name is how a report calls a cgroup: its workload's name, else its path.
func (a *analysis) name(cgroup string) string {
	if n, ok := a.names[a.owner(cgroup)]; ok {
		return n
	}
	return cgroup
}

// owner is the cgroup of the workload cgroup belongs to: itself, or its nearest ancestor that is
// a workload's (a churned sandbox's cgroup below its hog's, a container's below its pod's); a
// cgroup of no workload is its own owner.
func (a *analysis) owner(cgroup string) string {
	for c := cgroup; c != "/" && c != "." && c != ""; c = path.Dir(c) {
		if _, ok := a.names[c]; ok {
			return c
		}
	}
	return cgroup
}

// within reports whether cgroup is root or one of its descendants.
func within(cgroup, root string) bool {
	return cgroup == root || strings.HasPrefix(cgroup, strings.TrimSuffix(root, "/")+"/")
}

// ratio is value/base; a rise from nothing is infinite, nothing from nothing is zero.
func ratio(value, base float64) float64 {
	if base <= 0 {
		if value > 0 {
			return math.Inf(1)
		}
		return 0
	}
	return value / base
}

// quantile is the q-quantile (0..1) of values by the nearest-rank method, 0 when empty.
func quantile(values []float64, q float64) float64 {
	if len(values) == 0 {
		return 0
	}
	sorted := slices.Clone(values)
	slices.Sort(sorted)
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// severity grades a slowdown factor.
func severity(slowdown float64) string {
	if slowdown >= criticalSlowdown {
		return SeverityCritical
	}
	return SeverityWarning
}

// share is one cgroup's part of a total, for ranking culprits.
type share struct {
	cgroup string
	value  float64
}

// culprits ranks shares by value and keeps the largest and every other holding at least
// culpritMinShare of the total, so that two equal neighbours are both named, a minor one is
// not, and a crowd of small ones still yields a name.
func culprits(shares []share) []share {
	var total float64
	for _, s := range shares {
		total += s.value
	}
	slices.SortFunc(shares, func(x, y share) int {
		return cmp.Or(cmp.Compare(y.value, x.value), strings.Compare(x.cgroup, y.cgroup))
	})
	var out []share
	for i, s := range shares {
		if s.value > 0 && (i == 0 || s.value >= culpritMinShare*total) {
			out = append(out, s)
		}
	}
	return out
}

// notes lists what the run is missing, so a reader knows how far to trust the findings.
func notes(run *rundir.Run) []string {
	var out []string
	for _, p := range slices.Sorted(maps.Keys(run.Meta.Tracer)) {
		if st := run.Meta.Tracer[p]; st != rundir.TracerAttached {
			out = append(out, fmt.Sprintf("tracer program %s did not attach (%s): its evidence is missing", p, st))
		}
	}
	span := run.Span()
	for _, ss := range run.Series(rundir.MetricBPFDrops) {
		if n := ss.Delta(span); n > 0 {
			out = append(out, fmt.Sprintf("tracer program %s dropped %.0f events (%s): its numbers undercount",
				ss.Labels[rundir.LabelProgram], n, ss.Labels[rundir.LabelReason]))
		}
	}
	if run.Torn {
		out = append(out, "the last record was torn (the run was killed mid-write) and was skipped")
	}
	return out
}
