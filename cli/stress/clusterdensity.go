package stress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"

	agentv1 "github.com/nodectl/nodectl/api/agent/v1"
	"github.com/nodectl/nodectl/cli/internal/console"
	"github.com/nodectl/nodectl/cli/internal/podrun"
	"github.com/nodectl/nodectl/cli/internal/remote"
	"github.com/nodectl/nodectl/host/kubeid"
	"github.com/nodectl/nodectl/internal/quantity"
	"github.com/nodectl/nodectl/rundir"
	st "github.com/nodectl/nodectl/stress"
	"github.com/nodectl/nodectl/stress/workload"
)

// densityLocalFlags are density's flags that change this host, not a node of a cluster: the
// node is the one it is, and its swap and sysctls are the tuner's (nodectl tune).
var densityLocalFlags = []string{"swap", "swappiness", "watermark-scale-factor", "binary-size"}

// podPoll is how often a run of sandbox pods reads their status, the Node and its Lease.
const podPoll = 500 * time.Millisecond

// clusterDensity adds sandbox pods to --node in steps until the node collapses, as the local
// sweep does with processes: readiness from the pods' status and their sandboxes' first ready
// line, the kubelet's refusals and evictions, OOM kills, the Node's Ready condition and its
// Lease renewals from the API server, memory pressure from the node's agent. The agent's window
// of the whole sweep, with the steps as phases, is written as a density run and analyzed.
func clusterDensity(cmd *cobra.Command, rf *runFlags, cfg st.DensityConfig) error {
	for _, name := range densityLocalFlags {
		if f := cmd.Flags().Lookup(name); f != nil && f.Changed {
			return fmt.Errorf("--%s: not with --%s (a node's swap and sysctls are set by nodectl tune; its sandboxes map the image's nodectl binary)", name, remote.FlagNode)
		}
	}
	node := remote.FromCommand(cmd).Node
	lease := remote.Permission{Verb: "get", Group: "coordination.k8s.io", Resource: "leases", Namespace: corev1.NamespaceNodeLease}
	ctx, s, finish, err := startPods(cmd, rf, "density", lease)
	if err != nil {
		return err
	}
	defer finish()
	n, err := s.c.Node(ctx, node)
	if err != nil {
		return err
	}
	d := &podDensity{podSession: s, cfg: cfg, class: runtimeClass(rf.opts.Runtime, rf.runtimeClass),
		launched: map[string]time.Time{}, ready: map[string]time.Time{}, ended: map[string]bool{}, cursor: map[string]time.Time{},
		line: st.NewLiveLine(s.progress, console.IsTerminal(os.Stderr))}
	d.config = rundir.DensityConfig{Step: cfg.Step, Max: cfg.Max, CPUs: s.ncpu, SandboxMemoryBytes: cfg.SandboxMemory,
		RequestBytes: cfg.RequestBytes, LimitBytes: cfg.LimitBytes, NodeMemoryBytes: n.Status.Capacity.Memory().Value(),
		Swappiness: -1, WatermarkScaleFactor: -1,
		CriterionReadinessP99: cfg.Criteria.ReadinessP99.Seconds(), CriterionPSIFullShare: cfg.Criteria.PSIFull,
		CriterionOOMKill: cfg.Criteria.OOMKill, CriterionTickGap: cfg.Criteria.TickGap.Seconds(),
		Node: node, CriterionLeaseLate: cfg.Criteria.LeaseLate.Seconds()}
	start := time.Now()
	d.recs = append(d.recs, d.config.Record(start), d.count(start))
	fmt.Fprintf(s.progress, "density on node %s: sandbox pods of %s (request %s, limit %s), %d per step up to %d\n", node,
		quantity.FormatSize(cfg.SandboxMemory), quantity.FormatSize(cfg.RequestBytes), quantity.FormatSize(cfg.LimitBytes), cfg.Step, cfg.Max)
	if err := d.sweep(ctx); err != nil {
		return err
	}
	end := time.Now()
	rep, err := s.finish(ctx, "the sweep", func() (*rundir.Run, error) { return d.collect(ctx, start, end) })
	if err != nil {
		return err
	}
	return rf.report(rep, "density", func() error { return renderDensity(cmd, rf, rep) })
}

// podDensity is a density sweep of sandbox pods under way.
type podDensity struct {
	*podSession
	cfg    st.DensityConfig
	config rundir.DensityConfig
	class  string
	names  []string // the sandbox pods launched, in order

	launched map[string]time.Time // by the CLI's clock, as ready is
	ready    map[string]time.Time
	ended    map[string]bool
	cursor   map[string]time.Time // the last measurement kept of each pod
	recs     []rundir.Record      // the sweep's own: phases, events, readiness, measurements

	worstTick float64 // the step's worst tick lateness
	// renewed is the node Lease's last renewTime seen: the kubelet's stamps are compared with
	// each other, so the CLI's polling and clock do not enter a renewal's gap.
	renewed time.Time
	line    *st.LiveLine
}

// sweep runs the steps until one collapses or Max is reached.
func (d *podDensity) sweep(ctx context.Context) error {
	n := 0
	for n < d.cfg.Max {
		next := min(n+d.cfg.Step, d.cfg.Max)
		c, err := d.step(ctx, n, next)
		if err != nil {
			return err
		}
		n = next
		d.line.Done()
		if c != nil {
			msg := fmt.Sprintf("density %d collapsed: %s %.3g over its bound %.3g", next, c.signal, c.value, c.bound)
			fmt.Fprintln(d.progress, msg)
			d.recs = append(d.recs, rundir.Collapse{Density: next, Signal: c.signal, Value: c.value, Bound: c.bound}.Record(c.at, msg))
			return nil
		}
	}
	fmt.Fprintf(d.progress, "no collapse up to %d sandbox pods\n", n)
	return nil
}

// crossing is a collapse criterion crossed, and when it was seen.
type crossing struct {
	signal       string
	value, bound float64
	at           time.Time
}

// step brings the density from n to next sandbox pods (paced), waits until they are ready,
// holds the density for StepDuration and says which criterion it crossed first, if any.
func (d *podDensity) step(ctx context.Context, n, next int) (*crossing, error) {
	name := rundir.StepPhase(next)
	start := time.Now()
	d.recs = append(d.recs, rundir.Record{Type: rundir.TypePhase, Time: start, Name: name, Event: rundir.EventStart})
	d.worstTick = 0
	var found []crossing
	cross := func(c crossing) {
		if !slices.ContainsFunc(found, func(f crossing) bool { return f.signal == c.signal }) {
			found = append(found, c)
		}
	}
	var stepNames []string
	for i := n; i < next; i++ {
		if i > n && d.cfg.Pace > 0 {
			if err := d.hold(ctx, name, start, d.cfg.Pace, cross, nil); err != nil {
				return nil, err
			}
		}
		pod, err := d.launch(ctx, i)
		if err != nil {
			return nil, err
		}
		stepNames = append(stepNames, pod)
	}
	stop := func() bool { return len(found) > 0 }
	ready := func() bool {
		for _, p := range stepNames {
			if _, ok := d.ready[p]; !ok && !d.ended[p] {
				return false
			}
		}
		return true
	}
	readyBy := time.Now().Add(d.cfg.ReadyTimeout)
	for !ready() && !stop() && time.Now().Before(readyBy) {
		if err := d.hold(ctx, name, start, podPoll, cross, nil); err != nil {
			return nil, err
		}
	}
	// Pressure counts over the second half of the hold, as in a local sweep: a new sandbox's
	// start-up reclaim settles; pressure that stays is the collapse.
	settle := d.cfg.StepDuration / 2
	if !stop() {
		if err := d.hold(ctx, name, start, settle, cross, stop); err != nil {
			return nil, err
		}
	}
	settled := time.Now()
	d.recs = append(d.recs, rundir.HoldRecord(settled, name))
	if !stop() {
		if err := d.hold(ctx, name, start, d.cfg.StepDuration-settle, cross, stop); err != nil {
			return nil, err
		}
	}
	end := time.Now()
	if err := d.readMeasurements(ctx, start); err != nil {
		return nil, err
	}
	crit := d.cfg.Criteria
	if crit.TickGap > 0 && d.worstTick > crit.TickGap.Seconds() {
		cross(crossing{rundir.SignalTickGap, d.worstTick, crit.TickGap.Seconds(), end})
	}
	if crit.ReadinessP99 > 0 {
		var secs []float64
		for _, p := range stepNames {
			if at, ok := d.ready[p]; ok {
				secs = append(secs, at.Sub(d.launched[p]).Seconds())
			} else if !d.ended[p] {
				secs = append(secs, end.Sub(d.launched[p]).Seconds()) // never ready: at least this long
			}
		}
		if p99 := st.P99(secs); p99 > crit.ReadinessP99.Seconds() {
			cross(crossing{rundir.SignalReadiness, p99, crit.ReadinessP99.Seconds(), end})
		}
	}
	if crit.PSIFull > 0 {
		share, ok, err := d.memoryFullShare(ctx, settled, end)
		if err != nil {
			return nil, err
		}
		if ok && share > crit.PSIFull {
			cross(crossing{rundir.SignalPSIFull, share, crit.PSIFull, end})
		}
	}
	d.recs = append(d.recs, rundir.Record{Type: rundir.TypePhase, Time: end, Name: name, Event: rundir.EventEnd})
	if len(found) == 0 {
		return nil, nil
	}
	slices.SortStableFunc(found, func(a, b crossing) int { return a.at.Compare(b.at) })
	return &found[0], nil
}

// launch creates sandbox pod i.
func (d *podDensity) launch(ctx context.Context, i int) (string, error) {
	name := rundir.SandboxName(i)
	sandbox := workload.DefaultSandboxConfig()
	// The image's own binary, mapped by every sandbox of the node from the image's shared
	// layer: the page cache of one file, as browsers of one image share theirs.
	sandbox.HeapBytes, sandbox.Binary = d.cfg.SandboxMemory, "/proc/self/exe"
	if d.cfg.HotShare > 0 {
		sandbox.HotShare = d.cfg.HotShare
	}
	if d.cfg.Activity > 0 {
		sandbox.Activity = d.cfg.Activity
	}
	spec := podrun.Spec{Name: name, MemoryLimit: d.cfg.LimitBytes, MemoryRequest: d.cfg.RequestBytes, RuntimeClass: d.class,
		Args: workload.Command{Run: d.run.ID, Config: &sandbox}.Args()}
	at := time.Now()
	if err := d.run.Launch(ctx, spec); err != nil {
		return "", err
	}
	d.launched[name] = at
	d.names = append(d.names, name)
	d.recs = append(d.recs, d.count(at))
	return name, nil
}

// count is the sandbox count sample at t.
func (d *podDensity) count(t time.Time) rundir.Record {
	v := float64(len(d.names))
	return rundir.Record{Type: rundir.TypeSample, Time: t, Metric: rundir.MetricDensitySandboxes, Value: &v}
}

// hold waits dur, reading the pods, the Node and its Lease every podPoll, until done says so.
func (d *podDensity) hold(ctx context.Context, step string, start time.Time, dur time.Duration, cross func(crossing), done func() bool) error {
	end := time.Now().Add(dur)
	for {
		if err := d.poll(ctx, cross); err != nil {
			return err
		}
		d.line.Update(fmt.Sprintf("%-10s %5s | %d sandbox pods, %d ready, %d ended", step, time.Since(start).Round(time.Second), len(d.names), len(d.ready), len(d.ended)))
		left := time.Until(end)
		if left <= 0 || done != nil && done() {
			return nil
		}
		select {
		case <-ctx.Done():
			d.line.Done()
			return fmt.Errorf("%w during %s: %v", st.ErrInterrupted, step, context.Cause(ctx))
		case <-time.After(min(podPoll, left)):
		}
	}
}

// poll reads the run's pods (ready, refused, evicted, OOM-killed), the Node's Ready condition
// and its Lease, and reports what crosses a criterion.
func (d *podDensity) poll(ctx context.Context, cross func(crossing)) error {
	now := time.Now()
	pods, err := d.run.Pods(ctx)
	if err != nil {
		return err
	}
	for i := range pods {
		p := &pods[i]
		if _, ok := d.launched[p.Name]; !ok || d.ended[p.Name] {
			continue
		}
		if end, reason, msg := podrun.Ending(p); end != "" {
			d.ended[p.Name] = true
			wl := d.run.Workload(p.Name)
			d.recs = append(d.recs, rundir.PodEnded{End: end, Reason: reason}.Record(now, wl, msg))
			d.line.Done()
			fmt.Fprintf(d.progress, "pod %s/%s ended: %s %s %s\n", p.Namespace, p.Name, end, reason, msg)
			switch end {
			case rundir.PodEndRefused:
				cross(crossing{rundir.SignalAdmission, 1, 0, now})
			case rundir.PodEndEvicted:
				cross(crossing{rundir.SignalEvicted, 1, 0, now})
			case rundir.PodEndOOM:
				if d.cfg.Criteria.OOMKill {
					cross(crossing{rundir.SignalOOMKill, 1, 0, now})
				}
			default:
				return fmt.Errorf("sandbox pod %s/%s ended: %s %s", p.Namespace, p.Name, reason, msg)
			}
			continue
		}
		if _, ok := d.ready[p.Name]; ok || !podrun.Ready(p) {
			continue
		}
		// Running: ready once its sandbox said so (its heap allocated, its loop ticking).
		ms, err := d.run.Measurements(ctx, p.Name, time.Time{})
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(ms, func(m workload.Measurement) bool { return m.Metric == rundir.MetricSandboxReady }) {
			continue
		}
		d.ready[p.Name] = now
		d.keep(p.Name, ms)
		secs := now.Sub(d.launched[p.Name]).Seconds()
		d.recs = append(d.recs, rundir.Record{Type: rundir.TypeSample, Time: now, Metric: rundir.MetricSandboxReadiness, Workload: d.run.Workload(p.Name), Value: &secs})
	}
	node, err := d.c.Node(ctx, d.node)
	if err != nil {
		return err
	}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
			cross(crossing{rundir.SignalNotReady, 1, 0, now})
		}
	}
	return d.pollLease(ctx, now, cross)
}

// pollLease reads the node's Lease: a renewal later than the renew interval by more than the
// bound crosses it, and so does a renewal that has not come that long (a kubelet that stopped).
func (d *podDensity) pollLease(ctx context.Context, now time.Time, cross func(crossing)) error {
	bound := d.cfg.Criteria.LeaseLate.Seconds()
	l, err := d.c.NodeLease(ctx, d.node)
	if err != nil {
		return err
	}
	if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return nil
	}
	renew := l.Spec.RenewTime.Time
	// The kubelet renews every quarter of the Lease's duration.
	interval := time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second / 4
	if !d.renewed.IsZero() && renew.After(d.renewed) {
		if late := (renew.Sub(d.renewed) - interval).Seconds(); bound > 0 && late > bound {
			cross(crossing{rundir.SignalLeaseLate, late, bound, now})
		}
	}
	if renew.After(d.renewed) {
		d.renewed = renew
	}
	if late := (now.Sub(d.renewed) - interval).Seconds(); bound > 0 && late > bound {
		cross(crossing{rundir.SignalLeaseLate, late, bound, now})
	}
	return nil
}

// readMeasurements reads the sandbox pods' measurements since the step began (tick lateness,
// bursts) and keeps the step's worst tick.
func (d *podDensity) readMeasurements(ctx context.Context, start time.Time) error {
	for _, p := range d.names {
		if d.ended[p] {
			continue
		}
		if _, ok := d.ready[p]; !ok {
			continue
		}
		ms, err := d.run.Measurements(ctx, p, start.Add(-time.Second))
		if err != nil {
			return err
		}
		d.keep(p, ms)
	}
	return nil
}

// keep records a pod's measurements newer than those it has, and the worst tick among them.
func (d *podDensity) keep(pod string, ms []workload.Measurement) {
	for _, m := range ms {
		if !m.T.After(d.cursor[pod]) {
			continue
		}
		d.cursor[pod] = m.T
		if m.Metric == rundir.MetricSandboxTickLateness {
			d.worstTick = max(d.worstTick, m.Value)
		}
		d.recs = append(d.recs, podrun.MeasurementRecord(m, "", d.run.Workload(pod)))
	}
}

// memoryFullShare is the node's memory PSI full over [from, to] as a share of it, from the
// agent's samples of the host's pressure; ok is false when the agent has none.
func (d *podDensity) memoryFullShare(ctx context.Context, from, to time.Time) (float64, bool, error) {
	stream, err := d.ac.Query(ctx, &agentv1.QueryRequest{From: timestamppb.New(from.Add(-5 * time.Second)), To: timestamppb.New(to.Add(time.Second)), Metric: rundir.MetricSystemPressure})
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

// collect writes the sweep as a density run: the agent's window of it, the sandbox pods as
// workloads named as the agent names them, the node as the kubelet's pods' cgroup, and the
// sweep's own records (steps, readiness, the pods that ended, the collapse).
func (d *podDensity) collect(ctx context.Context, start, end time.Time) (*rundir.Run, error) {
	got, err := podrun.PullSpan(ctx, d.rec, start, end)
	if err != nil {
		return nil, err
	}
	nodeCg := ""
	var sandboxes []rundir.Workload
	for _, p := range d.names {
		cg, _ := d.run.CgroupOf(got.Meta, p)
		if cg != "" && nodeCg == "" {
			nodeCg = kubeid.Kubepods(cg)
		}
		sandboxes = append(sandboxes, rundir.Workload{Name: d.run.Workload(p), Kind: rundir.KindSandbox, Cgroup: cg,
			Memory: quantity.FormatSize(d.cfg.LimitBytes), Runtime: d.class})
	}
	workloads := append([]rundir.Workload{{Name: rundir.WorkloadNode, Kind: rundir.KindNode, Cgroup: nodeCg,
		Memory: quantity.FormatSize(d.config.NodeMemoryBytes)}}, sandboxes...)
	for _, w := range got.Meta.Workloads {
		if w.Kind == rundir.KindDaemon {
			workloads = append(workloads, w)
		}
	}
	return podrun.WriteScenario(d.out, d.run.ID, got, rundir.ScenarioDensity, workloads, d.recs)
}
