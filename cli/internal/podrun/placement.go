package podrun

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nodectl/nodectl/agent/recorded"
	agentv1 "github.com/nodectl/nodectl/api/agent/v1"
	"github.com/nodectl/nodectl/internal/badvalue"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/stress"
	"github.com/nodectl/nodectl/stress/workload"
)

// Placement runs a scenario's workloads as pods of the run on its node, recorded by the node's
// agent (stress.Placement, for --node): each workload a pod with its limits as requests and
// limits, writing below its emptyDir; the phases marked as they pass; at the end the agent's
// window of the run pulled once, the pods' own measurements added, and the run directory
// written once as a run of its scenario, which Run returns for the analyzer.
type Placement struct {
	run      *Run
	rec      recorded.Recorder
	ac       agentv1.AgentClient // the node's agent, whose recorder rec is
	ncpu     int
	class    string // the pods' RuntimeClass
	scenario string
	out      string
	// sandboxImage, when set, is the image of a density sweep's sandbox pods, and
	// sandboxBinary the file of it each sandbox maps (SandboxImage).
	sandboxImage, sandboxBinary string

	workloads []stress.Planned
	phases    []rundir.Record
	woken     []rundir.Workload // the wake starts so far, as the run lists them (Wake)
	recs      []rundir.Record   // the run's own records: wake times, a sweep's readiness, its pods' ends, ...
	storm     stormPods         // an fsync storm's writers (Arm)
	sweep     sweepPods         // a density sweep's node and sandboxes (Add)
	start     time.Time         // when the workloads were placed: the window read starts here
	result    *rundir.Run
}

// NewPlacement places a run of scenario on run's node, whose agent ac reaches (rec its flight
// recorder) and which has ncpu CPUs; its pods run with RuntimeClass class ("" for the default),
// and its run directory goes to out (new, or empty).
func NewPlacement(run *Run, ac agentv1.AgentClient, rec recorded.Recorder, ncpu int, class, scenario, out string) *Placement {
	return &Placement{run: run, ac: ac, rec: rec, ncpu: ncpu, class: class, scenario: scenario, out: out}
}

func (p *Placement) ID() string { return p.run.ID }

func (p *Placement) CPUs() int { return p.ncpu }

// Run is the run written by Finish, nil before.
func (p *Placement) Run() *rundir.Run { return p.result }

// Place gives the workloads that write (the victim, disk and fsync hogs, a storm's writers)
// their pod's emptyDir, as the local placement gives them a directory, and reads a sweep's
// Node. A heartbeat (it stands in for a node daemon, which a pod is not) and a hog's own
// target= (a pod writes to its emptyDir) are refused.
func (p *Placement) Place(ctx context.Context, planned []stress.Planned) ([]stress.Planned, error) {
	if p.start.IsZero() {
		p.start = time.Now()
	}
	for i := range planned {
		w := &planned[i]
		if w.Kind == rundir.KindHeartbeat {
			return nil, badvalue.Errorf(stress.FieldHeartbeat, "", "not on a node of a cluster: the heartbeat stands in for a node daemon, which a pod is not (the node's agent follows its daemons)")
		}
		if w.Hog.Target != "" {
			return nil, badvalue.Errorf(stress.FieldHogs, w.Hog.Kind+",target="+w.Hog.Target, "not on a node of a cluster: a pod writes to its own emptyDir on the node's disk")
		}
		switch w.Kind {
		case rundir.KindVictim, rundir.KindDisk, rundir.KindFsync, rundir.KindStormWriter:
			w.Target = WorkDir
		case rundir.KindNode:
			if err := p.placeNode(ctx); err != nil {
				return nil, err
			}
		}
	}
	p.workloads = planned
	return slices.Clone(planned), nil
}

// Start creates the workloads' pods and waits until they run.
func (p *Placement) Start(ctx context.Context, ws ...stress.Planned) error {
	if p.start.IsZero() {
		p.start = time.Now()
	}
	var specs []Spec
	for _, w := range ws {
		specs = append(specs, Spec{Name: w.Name, CPULimitMilli: w.Limits.CPUMilli, CPURequestMilli: w.Limits.CPURequestMilli,
			MemoryLimit: w.Limits.MemoryBytes, RuntimeClass: p.class, Args: workload.Command{Run: p.run.ID, Config: w.Config}.Args()})
	}
	return p.run.LaunchAndWait(ctx, specs...)
}

// Mark records the phase's edge now; it replaces the agent's own phases in the run. A density
// step's worst tick counts from its start.
func (p *Placement) Mark(phase, event string) error {
	if event == rundir.EventStart {
		p.sweep.worstTick, p.sweep.tickAt = 0, time.Time{}
	}
	p.phases = append(p.phases, rundir.Record{Type: rundir.TypePhase, Time: time.Now(), Name: phase, Event: event})
	return nil
}

// Hold lets the phase run, checking that no pod failed.
func (p *Placement) Hold(ctx context.Context, phase string, d time.Duration) error {
	return p.run.Hold(ctx, phase, d)
}

// Finish lets the agent's last samples of the run land (within an interval or two), pulls its
// window of the run once, and writes the run directory: each pod a workload named as the agent
// names it, with its cgroup and, for one that writes, the device its cgroup wrote the most to;
// the agent's daemons; the pods' own measurements; the phases marked. A half-written run is no
// run: out is removed again when this fails.
func (p *Placement) Finish(ctx context.Context) (err error) {
	if p.storm.detach != nil {
		p.storm.detach()
	}
	if err := SleepCtx(ctx, 3*time.Second); err != nil {
		return err
	}
	fmt.Fprintf(p.run.progress, "collecting the window and the pods' measurements from the node's agent into %s\n", p.out)
	defer func() {
		if err != nil {
			os.RemoveAll(p.out)
		}
	}()
	got, err := PullSpan(ctx, p.rec, p.start, time.Now())
	if err != nil {
		return err
	}
	var workloads []rundir.Workload
	recs := append(slices.Clone(p.phases), p.recs...)
	for _, w := range p.workloads {
		if i := slices.IndexFunc(p.woken, func(s rundir.Workload) bool { return s.Name == w.Name }); i >= 0 {
			workloads = append(workloads, p.woken[i])
			continue
		}
		if w.Kind == rundir.KindNode {
			workloads = append(workloads, p.sweepWorkloads(w.Workload, got.Meta)...)
			continue
		}
		cg, ok := p.run.CgroupOf(got.Meta, w.Name)
		if !ok {
			return fmt.Errorf("the node's agent does not know pod %s/%s: is it the agent of this version, on Kubernetes (--kubeconfig or in a pod)?", p.run.Namespace, w.Name)
		}
		wl := w.Workload
		wl.Name, wl.Cgroup, wl.Runtime = p.run.Workload(w.Name), cg, p.class
		if wl.Target != "" {
			wl.Device = got.Series(rundir.MetricBlkBytes).CgroupIn(cg).Busiest(rundir.LabelDevice,
				func(ss rundir.SeriesSet) float64 { return ss.Delta(got.Span()) })
		}
		workloads = append(workloads, wl)
		ms, err := p.run.Measurements(ctx, w.Name, time.Time{})
		if err != nil {
			return err
		}
		for _, m := range ms {
			if workload.Recorded(m) {
				recs = append(recs, MeasurementRecord(m, cg, wl.Name))
			}
		}
	}
	for _, d := range got.Meta.Workloads {
		// A wake run follows its starts only: each is summed over its own boot.
		if d.Kind == rundir.KindDaemon && len(p.woken) == 0 {
			workloads = append(workloads, d)
		}
	}
	p.result, err = WriteScenario(p.out, p.run.ID, got, p.scenario, workloads, recs)
	if err == nil {
		fmt.Fprintf(p.run.progress, "run directory: %s\n", p.out)
	}
	return err
}

// Workload is the workload name of a run's pod: the agent's namespace/pod/container.
func (r *Run) Workload(pod string) string { return r.Namespace + "/" + pod + "/" + pod }

// CgroupOf is the cgroup the node's agent, by its meta, knows a run's pod by: its container's,
// or for a gVisor pod, whose containers the host cannot tell apart, the pod's.
func (r *Run) CgroupOf(agent rundir.Meta, pod string) (string, bool) {
	byName := map[string]string{}
	for _, p := range agent.Pods {
		byName[p.Name] = p.Cgroup
	}
	if cg, ok := byName[r.Workload(pod)]; ok {
		return cg, true
	}
	cg, ok := byName[r.Namespace+"/"+pod]
	return cg, ok
}

// MeasurementRecord is a workload pod's measurement as a sample of the run.
func MeasurementRecord(m workload.Measurement, cgroup, name string) rundir.Record {
	v := m.Value
	return rundir.Record{Type: rundir.TypeSample, Time: m.T, Metric: m.Metric, Cgroup: cgroup, Workload: name, Value: &v}
}

// LaunchAndWait creates the pods and waits until they run (at most podStartTimeout).
func (r *Run) LaunchAndWait(ctx context.Context, specs ...Spec) error {
	if len(specs) == 0 {
		return nil
	}
	var names []string
	for _, s := range specs {
		if err := r.Launch(ctx, s); err != nil {
			return err
		}
		names = append(names, s.Name)
	}
	wctx, cancel := context.WithTimeout(ctx, podStartTimeout)
	defer cancel()
	start := time.Now()
	if err := r.WaitRunning(wctx, names...); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%w: %v", stress.ErrInterrupted, context.Cause(ctx))
		}
		return err
	}
	fmt.Fprintf(r.progress, "running: %s (%s)\n", strings.Join(names, ", "), time.Since(start).Round(100*time.Millisecond))
	return nil
}

// podStartTimeout bounds a pod's start: an image pull included.
const podStartTimeout = 3 * time.Minute

// Hold lets phase run for d, checking every few seconds that no pod failed.
func (r *Run) Hold(ctx context.Context, phase string, d time.Duration) error {
	fmt.Fprintf(r.progress, "%s: %s\n", phase, d)
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w during %s: %v", stress.ErrInterrupted, phase, context.Cause(ctx))
		case <-time.After(min(2*time.Second, time.Until(end))):
		}
		if err := r.Check(ctx); err != nil {
			return fmt.Errorf("during %s: %w", phase, err)
		}
	}
	return nil
}

// PullWindow reads a window of the node's agent's flight recorder into memory, once, at every
// tick the agent recorded; its meta is the agent's as it is now, with the pods it knows.
func PullWindow(ctx context.Context, rec recorded.Recorder, w recorded.Window) (*rundir.Run, error) {
	meta, err := rec.Meta(ctx)
	if err != nil {
		return nil, err
	}
	w.Ticks = recorded.AllTicks
	return w.Run(rec.Source(ctx), meta)
}

// PullSpan reads the node's agent's window of a run of pods, from start to end: a short
// baseline gives every series its value as the run began.
func PullSpan(ctx context.Context, rec recorded.Recorder, start, end time.Time) (*rundir.Run, error) {
	return PullWindow(ctx, rec, recorded.Window{BaselineFrom: start.Add(-2 * time.Second), From: start, To: end})
}

// WriteScenario writes run id of pods as a run of its scenario into out: the agent's window with
// its phases (baseline, window) replaced by the run's own in recs, the run's workloads, and each
// of recs without a cgroup given its workload's. It returns the run as written.
func WriteScenario(out, id string, got *rundir.Run, scenario string, workloads []rundir.Workload, recs []rundir.Record) (*rundir.Run, error) {
	meta := got.Meta
	meta.Scenario, meta.ID, meta.Args, meta.Workloads = scenario, id, os.Args, workloads
	cgroups := map[string]string{}
	for _, w := range workloads {
		cgroups[w.Name] = w.Cgroup
	}
	all := slices.DeleteFunc(got.Records, func(r rundir.Record) bool { return r.Type == rundir.TypePhase })
	for _, r := range recs {
		if r.Workload != "" && r.Cgroup == "" {
			r.Cgroup = cgroups[r.Workload]
		}
		all = append(all, r)
	}
	return rundir.Write(out, meta, all)
}

// SleepCtx sleeps d, or less if ctx ends (then an interrupted error).
func SleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	select {
	case <-ctx.Done():
		return fmt.Errorf("%w: %v", stress.ErrInterrupted, context.Cause(ctx))
	case <-time.After(d):
		return nil
	}
}
