package analyzer

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/nodectl/nodectl/internal/human"
	"github.com/nodectl/nodectl/rundir"
)

// DiffReport compares two runs, A and B: `nodectl diff RUN_A RUN_B -o json`.
type DiffReport struct {
	A               DiffRun         `json:"a"`
	B               DiffRun         `json:"b"`
	Workloads       []WorkloadDiff  `json:"workloads"`
	FindingsChanged []FindingChange `json:"findings_changed"`
	// Density compares two density sweeps (absent otherwise): e.g. without and with swap.
	Density *DensityDiff `json:"density,omitempty"`
	// Notes say where the two runs are not measured alike, so ratios mislead.
	Notes []string `json:"notes,omitempty"`
}

// DiffRun is one side of a diff: the run, the window its measures cover and its findings.
type DiffRun struct {
	Run      RunInfo       `json:"run"`
	Window   rundir.Window `json:"window"` // the stress phase, else the whole run
	Findings []Finding     `json:"findings"`
	Notes    []string      `json:"notes,omitempty"`
}

// WorkloadDiff is one workload's measures in both runs. Stress runs match workloads by name,
// record-mode runs match cgroups by path.
type WorkloadDiff struct {
	Workload string       `json:"workload"`
	In       string       `json:"in,omitempty"` // "a" or "b" when only that run has it
	Metrics  []MetricDiff `json:"metrics"`
}

// MetricDiff is one measure in run A and run B. A side is absent when its run lacks the
// workload or the measure; Ratio is absent when either side is, or A is zero.
type MetricDiff struct {
	Metric string   `json:"metric"`
	Unit   string   `json:"unit"`
	A      *float64 `json:"a,omitempty"`
	B      *float64 `json:"b,omitempty"`
	Ratio  *float64 `json:"ratio,omitempty"` // B/A
}

// FindingChange is a finding, by id and victim, that only one run has: "a" means it is gone
// in B, "b" that it appeared in B.
type FindingChange struct {
	ID     string `json:"id"`
	Victim string `json:"victim"`
	In     string `json:"in"`
}

// Sides of a diff, as WorkloadDiff.In and FindingChange.In name them.
const (
	SideA = "a"
	SideB = "b"
)

// UnitCores measures CPU time used per second of a window.
const UnitCores = "cores"

// diffMetrics are the measures a diff compares, in order. value reports false when the row
// has no such measure (a workload without a probe has no CPU-work timings).
var diffMetrics = []struct {
	name, unit, label string
	value             func(WorkloadPhase) (float64, bool)
}{
	{"cpu_work_p50_seconds", UnitSeconds, "cpu work p50", probeRow(func(p *ProbeStats) float64 { return p.CPUWorkP50 })},
	{"cpu_work_p95_seconds", UnitSeconds, "cpu work p95", probeRow(func(p *ProbeStats) float64 { return p.CPUWorkP95 })},
	{"cpu_cores", UnitCores, "cpu cores", anyRow(func(wp WorkloadPhase) float64 { return wp.CPUCores })},
	{"runq_p99_seconds", UnitSeconds, "run-queue p99", anyRow(func(wp WorkloadPhase) float64 { return wp.RunqP99 })},
	{"runq_wait_seconds", UnitSeconds, "run-queue wait", anyRow(func(wp WorkloadPhase) float64 { return wp.RunqWait })},
	{"throttled_seconds", UnitSeconds, "throttled time", anyRow(func(wp WorkloadPhase) float64 { return wp.ThrottledSeconds })},
	{"throttled_ratio", UnitRatio, "throttled periods", anyRow(func(wp WorkloadPhase) float64 { return wp.ThrottledRatio })},
	{"fsync_p95_seconds", UnitSeconds, "fsync p95", fsyncEither},
	{"write_fsync_p95_seconds", UnitSeconds, "write+fsync p95", probeRow(func(p *ProbeStats) float64 { return p.WriteFsyncP95 })},
	{"io_bytes", UnitBytes, "block I/O", anyRow(func(wp WorkloadPhase) float64 { return wp.IOBytes })},
	{"heartbeat_lateness_p99_seconds", UnitSeconds, "heartbeat late p99", positive(func(wp WorkloadPhase) float64 { return wp.HeartbeatLatenessP99 })},
	{"heartbeat_lateness_max_seconds", UnitSeconds, "heartbeat late max", positive(func(wp WorkloadPhase) float64 { return wp.HeartbeatLatenessMax })},
}

func anyRow(f func(WorkloadPhase) float64) func(WorkloadPhase) (float64, bool) {
	return func(wp WorkloadPhase) (float64, bool) { return f(wp), true }
}

// probeRow reads a probe timing; zero means the probe took no such reading, as no real timing is.
func probeRow(f func(*ProbeStats) float64) func(WorkloadPhase) (float64, bool) {
	return func(wp WorkloadPhase) (float64, bool) {
		if wp.Probe == nil {
			return 0, false
		}
		v := f(wp.Probe)
		return v, v > 0
	}
}

// positive reads a measure only some workloads have: zero means this one has none.
func positive(f func(WorkloadPhase) float64) func(WorkloadPhase) (float64, bool) {
	return func(wp WorkloadPhase) (float64, bool) {
		v := f(wp)
		return v, v > 0
	}
}

// fsyncEither is the probe's fsync p95, else the tracer's: the probe times every fsync itself.
func fsyncEither(wp WorkloadPhase) (float64, bool) {
	if wp.Probe != nil && wp.Probe.FsyncP95 > 0 {
		return wp.Probe.FsyncP95, true
	}
	return wp.FsyncP95, wp.FsyncP95 > 0
}

// windowLengthTolerance: windows whose lengths differ by more than this share make totals
// (run-queue wait, throttled time, block I/O) incomparable.
const windowLengthTolerance = 0.10

// Diff analyzes both runs and compares them workload by workload, over each run's stress
// phase (or the whole run when it has none), and lists the findings only one of them has.
func Diff(a, b *rundir.Run) (*DiffReport, error) {
	if a == nil || b == nil {
		return nil, errors.New("diffing runs: no run")
	}
	sa, err := newDiffSide(a)
	if err != nil {
		return nil, fmt.Errorf("analyzing run A: %w", err)
	}
	sb, err := newDiffSide(b)
	if err != nil {
		return nil, fmt.Errorf("analyzing run B: %w", err)
	}
	d := &DiffReport{
		A: sa.DiffRun, B: sb.DiffRun,
		Workloads:       []WorkloadDiff{},
		FindingsChanged: findingsChanged(sa.Findings, sb.Findings),
		Notes:           windowNotes(sa.Window, sb.Window),
	}
	if a.Meta.Scenario == rundir.ScenarioDensity && b.Meta.Scenario == rundir.ScenarioDensity {
		d.Density = densityDiff(newAnalysis(a).densityTable(), newAnalysis(b).densityTable())
	}
	keys := slices.Clone(sa.keys)
	for _, k := range sb.keys {
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		ra, okA := sa.row(k)
		rb, okB := sb.row(k)
		wd := WorkloadDiff{Workload: k, Metrics: []MetricDiff{}}
		switch {
		case !okB:
			wd.In = SideA
		case !okA:
			wd.In = SideB
		}
		for _, m := range diffMetrics {
			md := MetricDiff{Metric: m.name, Unit: m.unit, A: diffValue(m.value, ra, okA), B: diffValue(m.value, rb, okB)}
			if md.A == nil && md.B == nil {
				continue
			}
			if md.A != nil && md.B != nil && *md.A > 0 {
				if r := *md.B / *md.A; !math.IsInf(r, 0) {
					md.Ratio = &r
				}
			}
			wd.Metrics = append(wd.Metrics, md)
		}
		d.Workloads = append(d.Workloads, wd)
	}
	return d, nil
}

// DensityDiff is the density gain from sweep A to sweep B: the highest stable density of each,
// where and why each collapsed, and which resource bounded it.
type DensityDiff struct {
	MaxStableA int              `json:"max_stable_a"`
	MaxStableB int              `json:"max_stable_b"`
	Gain       *float64         `json:"gain,omitempty"` // MaxStableB / MaxStableA; absent when A held none
	CollapseA  *DensityCollapse `json:"collapse_a"`
	CollapseB  *DensityCollapse `json:"collapse_b"`
	CeilingA   string           `json:"ceiling_a,omitempty"`
	CeilingB   string           `json:"ceiling_b,omitempty"`
}

func densityDiff(a, b *DensityReport) *DensityDiff {
	d := &DensityDiff{MaxStableA: a.MaxStable, MaxStableB: b.MaxStable, CollapseA: a.Collapse, CollapseB: b.Collapse}
	if a.MaxStable > 0 {
		g := float64(b.MaxStable) / float64(a.MaxStable)
		d.Gain = &g
	}
	if a.Ceiling != nil {
		d.CeilingA = a.Ceiling.Resource
	}
	if b.Ceiling != nil {
		d.CeilingB = b.Ceiling.Resource
	}
	return d
}

// diffValue is a row's value of a measure, nil when the row or the measure is missing or the
// value is not finite (JSON has no Inf or NaN).
func diffValue(value func(WorkloadPhase) (float64, bool), wp WorkloadPhase, ok bool) *float64 {
	if !ok {
		return nil
	}
	v, has := value(wp)
	if !has || math.IsInf(v, 0) || math.IsNaN(v) {
		return nil
	}
	return &v
}

// diffSide is one analyzed run and how to find its workloads.
type diffSide struct {
	DiffRun
	analysis *analysis
	keys     []string                   // its workloads, in the order to show them
	byName   map[string]rundir.Workload // a stress run's workloads
	cgroups  map[string]bool            // a record-mode run: every cgroup it has samples of
}

func newDiffSide(run *rundir.Run) (*diffSide, error) {
	rep, err := Analyze(run)
	if err != nil {
		return nil, err
	}
	a := newAnalysis(run)
	s := &diffSide{
		DiffRun:  DiffRun{Run: rep.Run, Window: a.focus(), Findings: rep.Findings, Notes: rep.Notes},
		analysis: a,
		byName:   map[string]rundir.Workload{},
	}
	for _, wl := range run.Meta.Workloads {
		s.byName[wl.Name] = wl
		s.keys = append(s.keys, wl.Name)
	}
	if len(run.Meta.Workloads) > 0 {
		return s, nil
	}
	// A record-mode run has no roles: compare the cgroups that stood out, by path.
	s.cgroups = map[string]bool{}
	for _, r := range run.Records {
		if r.Type == rundir.TypeSample && r.Cgroup != "" {
			s.cgroups[r.Cgroup] = true
		}
	}
	rk := rep.Summary.Ranking
	for _, list := range [][]Ranked{rk.RunqWait, rk.Fsync, rk.IOBytes} {
		for _, r := range list {
			s.keys = append(s.keys, r.Cgroup)
		}
	}
	slices.Sort(s.keys)
	s.keys = slices.Compact(s.keys)
	return s, nil
}

// row measures the workload named key (a cgroup path in record mode) over the side's window;
// false when the run does not have it.
func (s *diffSide) row(key string) (WorkloadPhase, bool) {
	wl, ok := s.byName[key]
	if !ok && s.cgroups[key] {
		wl, ok = rundir.Workload{Name: key, Cgroup: key}, true
	}
	if !ok {
		return WorkloadPhase{}, false
	}
	return s.analysis.workloadPhase(wl, s.Window), true
}

// findingsChanged lists the findings, by id and victim, that only one run has: A's first.
func findingsChanged(a, b []Finding) []FindingChange {
	out := []FindingChange{}
	for _, side := range []struct {
		in          string
		list, other []Finding
	}{{SideA, a, b}, {SideB, b, a}} {
		for _, f := range side.list {
			if !slices.ContainsFunc(side.other, SameFinding(f)) {
				out = append(out, FindingChange{ID: f.ID, Victim: f.Victim, In: side.in})
			}
		}
	}
	return out
}

// sameFinding matches findings of the same id about the same victim.
func SameFinding(f Finding) func(Finding) bool {
	return func(g Finding) bool { return g.ID == f.ID && g.Victim == f.Victim }
}

// windowNotes says when the compared windows differ in kind or length.
func windowNotes(a, b rundir.Window) []string {
	var out []string
	if a.Name != b.Name {
		out = append(out, fmt.Sprintf("run A is measured over its %s window and run B over its %s window", a.Name, b.Name))
	}
	if la, lb := a.Seconds(), b.Seconds(); math.Abs(la-lb) > windowLengthTolerance*max(la, lb) {
		out = append(out, fmt.Sprintf("the windows differ in length (A %s, B %s): totals such as run-queue wait, "+
			"throttled time and block I/O grow with it", human.Seconds(la), human.Seconds(lb)))
	}
	return out
}

// MetricLabel is how a person reads a diff's metric: "cpu work p50" for cpu_work_p50_seconds.
func MetricLabel(metric string) string {
	for _, m := range diffMetrics {
		if m.name == metric {
			return m.label
		}
	}
	return metric
}
