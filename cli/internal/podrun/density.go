package podrun

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"

	agentv1 "github.com/nodectl/nodectl/api/agent/v1"
	"github.com/nodectl/nodectl/host/kubeid"
	"github.com/nodectl/nodectl/internal/quantity"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/stress"
	"github.com/nodectl/nodectl/stress/workload"
)

// sweepPods is what the pods placement keeps of a density sweep's sandbox pods
// (stress.Sweeper): readiness from the pods' status and their sandboxes' first ready line, the
// kubelet's refusals and evictions, OOM kills, the Node's Ready condition and its Lease
// renewals from the API server, memory pressure from the node's agent.
type sweepPods struct {
	nodeMemory int64 // the Node's allocatable memory: what its pods may book
	names      []string
	limit      int64 // each sandbox's memory limit, as the run lists it

	launched  map[string]time.Time // by the CLI's clock, as ready is
	ready     map[string]time.Duration
	ended     map[string]string
	cursor    map[string]time.Time // the last measurement kept of each pod
	worstTick float64              // the step's worst tick lateness
	tickAt    time.Time
	settled   time.Time
	// renewed is the node Lease's last renewTime seen: the kubelet's stamps are compared with
	// each other, so the CLI's polling and clock do not enter a renewal's gap.
	renewed time.Time
}

// placeNode reads the Node whose sandboxes the sweep adds: its memory is what the kubelet lets
// pods have of it (allocatable: capacity less its reservations and eviction threshold).
func (p *Placement) placeNode(ctx context.Context) error {
	n, err := p.run.c.Node(ctx, p.run.Node)
	if err != nil {
		return err
	}
	p.sweep = sweepPods{nodeMemory: n.Status.Allocatable.Memory().Value(), launched: map[string]time.Time{}, ready: map[string]time.Duration{},
		ended: map[string]string{}, cursor: map[string]time.Time{}}
	return nil
}

// SandboxImage makes a density sweep's sandboxes pods of image, each mapping binary, a file of
// that image (its page cache shared by all, through the image's layer), as a browser sandbox
// maps its browser; nodectl runs in them from the agent's image (Spec.Image).
func (p *Placement) SandboxImage(image, binary string) {
	p.sandboxImage, p.sandboxBinary = image, binary
}

// Describe gives the Node's name and memory and the sandboxes' image if the user chose one; its
// swap and sysctls are the tuner's, left as they are.
func (p *Placement) Describe(c *rundir.DensityConfig) {
	c.Node, c.NodeMemoryBytes = p.run.Node, p.sweep.nodeMemory
	c.Image, c.ImageBinary = p.sandboxImage, p.sandboxBinary
}

// Note keeps the sweep's records for the run.
func (p *Placement) Note(recs ...rundir.Record) error {
	p.recs = append(p.recs, recs...)
	return nil
}

// Add creates the sandbox's pod with its memory request and limit, mapping the image's own
// binary (the agent's nodectl, or the file of the user's image SandboxImage names): the page
// cache of one file, which every sandbox of the node maps from the image's shared layer, as
// browsers of one image share theirs.
func (p *Placement) Add(ctx context.Context, w stress.Planned) (time.Time, error) {
	body, ok := w.Config.(*workload.SandboxConfig)
	if !ok {
		return time.Time{}, fmt.Errorf("%s: not a sandbox", w.Name)
	}
	sandbox := *body
	sandbox.Binary = "/proc/self/exe"
	if p.sandboxImage != "" {
		sandbox.Binary = p.sandboxBinary
	}
	spec := Spec{Name: w.Name, MemoryLimit: w.Limits.MemoryBytes, MemoryRequest: w.MemoryRequest,
		CPULimitMilli: w.Limits.CPUMilli, CPURequestMilli: w.Limits.CPURequestMilli, RuntimeClass: p.class,
		Image: p.sandboxImage, Args: workload.Command{Run: p.run.ID, Config: &sandbox}.Args()}
	at := time.Now()
	if err := p.run.Launch(ctx, spec); err != nil {
		return time.Time{}, err
	}
	s := &p.sweep
	s.launched[w.Name], s.limit = at, w.Limits.MemoryBytes
	s.names = append(s.names, w.Name)
	return at, nil
}

// Watch reads the run's pods (ready, refused, evicted, OOM-killed), the Node's Ready condition
// and its Lease; with full, also the ready pods' measurements since the step began (their
// ticks and bursts).
func (p *Placement) Watch(ctx context.Context, full bool) (stress.SweepState, error) {
	s := &p.sweep
	var st stress.SweepState
	now := time.Now()
	pods, err := p.run.Pods(ctx)
	if err != nil {
		return st, err
	}
	for i := range pods {
		pod := &pods[i]
		if _, ok := s.launched[pod.Name]; !ok || s.ended[pod.Name] != "" {
			continue
		}
		if end, reason, msg := Ending(pod); end != "" {
			c, err := p.ended(now, pod, end, reason, msg)
			if err != nil {
				return st, err
			}
			st.Crossings = append(st.Crossings, c)
			continue
		}
		if _, ok := s.ready[pod.Name]; ok || !Ready(pod) {
			continue
		}
		// Running: ready once its sandbox said so (its heap allocated, its loop ticking).
		ms, err := p.run.Measurements(ctx, pod.Name, time.Time{})
		if err != nil {
			return st, err
		}
		if !slices.ContainsFunc(ms, func(m workload.Measurement) bool { return m.Metric == rundir.MetricSandboxReady }) {
			continue
		}
		s.ready[pod.Name] = now.Sub(s.launched[pod.Name])
		p.keep(pod.Name, ms)
		secs := s.ready[pod.Name].Seconds()
		p.recs = append(p.recs, rundir.Record{Type: rundir.TypeSample, Time: now, Metric: rundir.MetricSandboxReadiness, Workload: p.run.Workload(pod.Name), Value: &secs})
	}
	node, err := p.run.c.Node(ctx, p.run.Node)
	if err != nil {
		return st, err
	}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
			st.Crossings = append(st.Crossings, stress.Crossing{Signal: rundir.SignalNotReady, Value: 1, At: now})
		}
	}
	late, err := p.leaseLate(ctx, now)
	if err != nil {
		return st, err
	}
	st.Crossings = append(st.Crossings, late...)
	if full {
		if err := p.readMeasurements(ctx); err != nil {
			return st, err
		}
	}
	st.Ready, st.Ended, st.WorstTick, st.TickAt = maps.Clone(s.ready), maps.Clone(s.ended), s.worstTick, s.tickAt
	return st, nil
}

// ended records a sandbox pod that ended, and the collapse signal its end is; an end that is
// none (an error of the workload) fails the run.
func (p *Placement) ended(now time.Time, pod *corev1.Pod, end, reason, msg string) (stress.Crossing, error) {
	c := stress.Crossing{Value: 1, At: now}
	switch end {
	case rundir.PodEndRefused:
		c.Signal = rundir.SignalAdmission
	case rundir.PodEndEvicted:
		c.Signal = rundir.SignalEvicted
	case rundir.PodEndOOM:
		c.Signal = rundir.SignalOOMKill
	default:
		return c, fmt.Errorf("sandbox pod %s/%s ended: %s %s", pod.Namespace, pod.Name, reason, msg)
	}
	p.sweep.ended[pod.Name] = fmt.Sprintf("%s %s %s", end, reason, msg)
	p.recs = append(p.recs, rundir.PodEnded{End: end, Reason: reason}.Record(now, p.run.Workload(pod.Name), msg))
	return c, nil
}

// leaseLate reads the node's Lease and returns how late past the renew interval a renewal came,
// or has not come yet (a kubelet that stopped), for the sweep to rate against its criterion.
func (p *Placement) leaseLate(ctx context.Context, now time.Time) ([]stress.Crossing, error) {
	s := &p.sweep
	l, err := p.run.c.NodeLease(ctx, p.run.Node)
	if err != nil {
		return nil, err
	}
	if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return nil, nil
	}
	renew := l.Spec.RenewTime.Time
	// The kubelet renews every quarter of the Lease's duration.
	interval := time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second / 4
	var out []stress.Crossing
	if !s.renewed.IsZero() && renew.After(s.renewed) {
		if late := renew.Sub(s.renewed) - interval; late > 0 {
			out = append(out, stress.Crossing{Signal: rundir.SignalLeaseLate, Value: late.Seconds(), At: now})
		}
	}
	if renew.After(s.renewed) {
		s.renewed = renew
	}
	if late := now.Sub(s.renewed) - interval; late > 0 {
		out = append(out, stress.Crossing{Signal: rundir.SignalLeaseLate, Value: late.Seconds(), At: now})
	}
	return out, nil
}

// readMeasurements reads the ready sandbox pods' measurements since the step began (tick
// lateness, bursts) and keeps the step's worst tick.
func (p *Placement) readMeasurements(ctx context.Context) error {
	s := &p.sweep
	for _, name := range s.names {
		if _, ok := s.ready[name]; !ok || s.ended[name] != "" {
			continue
		}
		since := s.cursor[name] // set when it became ready
		if !since.IsZero() {
			since = since.Add(-time.Second) // the kubelet's resolution is the second
		}
		ms, err := p.run.Measurements(ctx, name, since)
		if err != nil {
			return err
		}
		p.keep(name, ms)
	}
	return nil
}

// keep records a pod's measurements newer than those it has, and the worst tick among them.
func (p *Placement) keep(pod string, ms []workload.Measurement) {
	s := &p.sweep
	for _, m := range ms {
		if !m.T.After(s.cursor[pod]) {
			continue
		}
		s.cursor[pod] = m.T
		if m.Metric == rundir.MetricSandboxTickLateness && m.Value > s.worstTick {
			s.worstTick, s.tickAt = m.Value, m.T
		}
		p.recs = append(p.recs, MeasurementRecord(m, "", p.run.Workload(pod)))
	}
}

// Settled records the step's hold: its pressure window begins.
func (p *Placement) Settled(step string) error {
	p.sweep.settled = time.Now()
	p.recs = append(p.recs, rundir.HoldRecord(p.sweep.settled, step))
	return nil
}

// MemoryFullShare is the node's memory PSI full since the step settled, from the agent's
// samples of the host's pressure; ok is false when the agent has none.
func (p *Placement) MemoryFullShare(ctx context.Context, to time.Time) (float64, bool, error) {
	from := p.sweep.settled
	stream, err := p.ac.Query(ctx, &agentv1.QueryRequest{From: timestamppb.New(from.Add(-5 * time.Second)), To: timestamppb.New(to.Add(time.Second)), Metric: rundir.MetricSystemPressure})
	if err != nil {
		return 0, false, err
	}
	var first, last *agentv1.Record
	for {
		chunk, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return 0, false, fmt.Errorf("reading the node's memory pressure from its agent: %w", err)
		}
		for _, r := range chunk.GetRecords() {
			if r.GetLabels()[rundir.LabelResource] != rundir.ResourceMemory || r.GetLabels()[rundir.LabelKind] != rundir.PressureFull {
				continue
			}
			if first == nil || !r.GetTime().AsTime().After(from) {
				first = r
			}
			last = r
		}
	}
	if first == nil || last == first {
		return 0, first != nil, nil
	}
	return (last.GetValue() - first.GetValue()) / max(to.Sub(from).Seconds(), 1e-9), true, nil
}

// sweepWorkloads are a sweep's node and sandboxes as the run lists them: the sandbox pods named
// as the agent names them, the node as the kubelet's pods' cgroup. A pod the kubelet refused
// never ran, and has no cgroup.
func (p *Placement) sweepWorkloads(node rundir.Workload, agent rundir.Meta) []rundir.Workload {
	s := &p.sweep
	var sandboxes []rundir.Workload
	for _, name := range s.names {
		cg, _ := p.run.CgroupOf(agent, name)
		if cg != "" && node.Cgroup == "" {
			node.Cgroup = kubeid.Kubepods(cg)
		}
		sandboxes = append(sandboxes, rundir.Workload{Name: p.run.Workload(name), Kind: rundir.KindSandbox, Cgroup: cg,
			Memory: quantity.FormatSize(s.limit), Runtime: p.class})
	}
	node.Memory = quantity.FormatSize(s.nodeMemory)
	return append([]rundir.Workload{node}, sandboxes...)
}
