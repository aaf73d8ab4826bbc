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

	agentv1 "github.com/nodectl/nodectl/api/agent/v1"
	"github.com/nodectl/nodectl/cli/internal/console"
	"github.com/nodectl/nodectl/cli/internal/podrun"
	"github.com/nodectl/nodectl/internal/quantity"
	"github.com/nodectl/nodectl/rundir"
	st "github.com/nodectl/nodectl/stress"
	"github.com/nodectl/nodectl/stress/workload"
)

// A start's phase ends once the node's agent follows the pod's cgroup and has read it wakeTicks
// after the answer (it samples every second), waiting at most wakeSampleWait.
const (
	wakeTicks      = 2500 * time.Millisecond
	wakeSampleWait = 15 * time.Second
)

// clusterWake starts the wake sandbox as a pod at each CPU limit on --node, one start at a
// time, and explains the wake times from the node's agent's window: the pods' CFS throttling
// and run-queue waits, read from their cgroups.
func clusterWake(cmd *cobra.Command, rf *runFlags, cfg st.WakeConfig) error {
	ctx, s, finish, err := startPods(cmd, rf, "wake")
	if err != nil {
		return err
	}
	defer finish()
	if cfg.BootRounds == 0 {
		cfg.BootRounds = workload.DefaultBootRounds
	}
	w := &podWake{podSession: s, cfg: cfg, class: runtimeClass(rf.opts.Runtime, rf.runtimeClass),
		line: st.NewLiveLine(s.progress, console.IsTerminal(os.Stderr))}
	start := time.Now()
	// The limits take turns, as in a local run: a slow spell of the node touches them alike.
	for i := range cfg.Count {
		for _, m := range cfg.CPULimits {
			if err := w.start(ctx, rundir.WakeName(quantity.FormatCPU(m), i), m); err != nil {
				return err
			}
		}
	}
	w.line.Done()
	end := time.Now()
	rep, err := s.finish(ctx, "the starts", func() (*rundir.Run, error) { return w.collect(ctx, start, end) })
	if err != nil {
		return err
	}
	return rf.report(rep, "wake", func() error { return renderWake(cmd, rf, rep) })
}

// podWake is a wake run of pods under way.
type podWake struct {
	*podSession
	cfg       st.WakeConfig
	class     string
	line      *st.LiveLine
	workloads []rundir.Workload
	recs      []rundir.Record // phases, wake times and the pods' measurements
}

// start runs one start: the pod with the limit (requested as much, as a Guaranteed pod's
// CPU), its answer awaited, its cgroup learnt from the agent while it runs, the phase held until
// the agent sampled it past the answer, then the pod deleted.
func (w *podWake) start(ctx context.Context, name string, milli int64) error {
	cpu := quantity.FormatCPU(milli)
	spec := podrun.Spec{Name: name, CPULimitMilli: milli, CPURequestMilli: milli, RuntimeClass: w.class,
		Args: workload.Command{Run: w.run.ID, Config: &workload.WakeConfig{BootRounds: w.cfg.BootRounds, Pending: true}}.Args()}
	created := time.Now()
	w.recs = append(w.recs, rundir.Record{Type: rundir.TypePhase, Time: created, Name: name, Event: rundir.EventStart})
	if err := w.run.Launch(ctx, spec); err != nil {
		return err
	}
	answer, ms, err := w.await(ctx, name, created)
	if err != nil {
		return err
	}
	cg, err := w.cgroupOf(ctx, name)
	if err != nil {
		return err
	}
	// By the node's clock from nodectl's create call: the pod's start (the runtime, a gVisor
	// sandbox's boot) and the workload's boot, as a request waits for a pod woken for it.
	wake := answer.T.Sub(created).Seconds()
	w.recs = append(w.recs, rundir.Record{Type: rundir.TypeSample, Time: answer.T, Metric: rundir.MetricWake, Cgroup: cg, Workload: name, Value: &wake})
	for _, m := range ms {
		w.recs = append(w.recs, podrun.MeasurementRecord(m, cg, name))
	}
	w.workloads = append(w.workloads, rundir.Workload{Name: name, Kind: rundir.KindWake, Cgroup: cg, CPU: cpu, CPURequest: cpu, Runtime: w.class})
	sampled, err := w.sampledAfter(ctx, cg, created, answer.T)
	if err != nil {
		return err
	}
	w.recs = append(w.recs, rundir.Record{Type: rundir.TypePhase, Time: sampled, Name: name, Event: rundir.EventEnd})
	w.line.Update(fmt.Sprintf("wake %-14s %6s (boot %s)", name, time.Duration(wake*float64(time.Second)).Round(10*time.Millisecond),
		time.Duration(answer.Value*float64(time.Second)).Round(10*time.Millisecond)))
	// Gone before the next start: the kubelet admits a pod only once the last one's CPU
	// request is free (a 1-CPU start after a 1-CPU start on a 2-CPU node is refused).
	return w.run.DeletePodWait(ctx, name, 1)
}

// await waits for the pod's answer (its wake_boot_seconds line), failing when the pod ends
// first or --timeout passes.
func (w *podWake) await(ctx context.Context, name string, created time.Time) (workload.Measurement, []workload.Measurement, error) {
	for {
		pods, err := w.run.Pods(ctx)
		if err != nil {
			return workload.Measurement{}, nil, err
		}
		for i := range pods {
			p := &pods[i]
			if p.Name != name {
				continue
			}
			if end, reason, msg := podrun.Ending(p); end != "" {
				return workload.Measurement{}, nil, fmt.Errorf("pod %s/%s ended before answering: %s %s %s", p.Namespace, name, end, reason, msg)
			}
			if !podrun.Ready(p) {
				continue
			}
			ms, err := w.run.Measurements(ctx, name, time.Time{})
			if err != nil {
				return workload.Measurement{}, nil, err
			}
			if i := slices.IndexFunc(ms, func(m workload.Measurement) bool { return m.Metric == rundir.MetricWakeBoot }); i >= 0 {
				return ms[i], ms, nil
			}
		}
		if time.Since(created) > w.cfg.Timeout {
			return workload.Measurement{}, nil, fmt.Errorf("%w: pod %s/%s did not answer within --timeout %s", st.ErrTimeout, w.run.Namespace, name, w.cfg.Timeout)
		}
		w.line.Update(fmt.Sprintf("wake %-14s %6s", name, time.Since(created).Round(100*time.Millisecond)))
		if err := podrun.SleepCtx(ctx, 250*time.Millisecond); err != nil {
			return workload.Measurement{}, nil, err
		}
	}
}

// cgroupOf is the cgroup the node's agent knows the pod by, waited for: the agent names a new
// pod once the runtime lists its container (docs/agent.md, "On Kubernetes").
func (w *podWake) cgroupOf(ctx context.Context, pod string) (string, error) {
	for deadline := time.Now().Add(15 * time.Second); ; {
		meta, err := w.rec.Meta(ctx)
		if err != nil {
			return "", err
		}
		if cg, ok := w.run.CgroupOf(meta, pod); ok {
			return cg, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("the node's agent does not know pod %s/%s after 15 s: is it the agent of this version, on Kubernetes?", w.run.Namespace, pod)
		}
		if err := podrun.SleepCtx(ctx, 500*time.Millisecond); err != nil {
			return "", err
		}
	}
}

// sampledAfter waits until the node's agent follows the cgroup (it has a sample of its CPU
// counters since from) and has read it at least twice after t, and returns the time then. The
// agent writes a counter when it changed, so the last value written stands at every later tick:
// the boot's counters are those at the returned time (the sandbox idles after its answer).
func (w *podWake) sampledAfter(ctx context.Context, cg string, from, t time.Time) (time.Time, error) {
	deadline := t.Add(wakeSampleWait)
	for {
		followed := false
		stream, err := w.ac.Query(ctx, &agentv1.QueryRequest{From: timestamppb.New(from), To: timestamppb.New(time.Now().Add(time.Second)),
			Metric: rundir.MetricCPUUsage, CgroupPrefix: cg})
		if err != nil {
			return time.Time{}, err
		}
		for {
			chunk, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return time.Time{}, fmt.Errorf("reading the samples of %s from the node's agent: %w", cg, err)
			}
			followed = followed || slices.ContainsFunc(chunk.GetRecords(), func(r *agentv1.Record) bool { return r.GetCgroup() == cg })
		}
		now := time.Now()
		if followed && now.After(t.Add(wakeTicks)) {
			return now, nil
		}
		if now.After(deadline) {
			return time.Time{}, fmt.Errorf("the node's agent took no sample of %s within %s of its answer", cg, wakeSampleWait)
		}
		if err := podrun.SleepCtx(ctx, 500*time.Millisecond); err != nil {
			return time.Time{}, err
		}
	}
}

// collect writes the starts as a wake run: the agent's window of them (its phases replaced by
// the starts'), each start a wake workload with the pod's cgroup.
func (w *podWake) collect(ctx context.Context, start, end time.Time) (*rundir.Run, error) {
	got, err := podrun.PullSpan(ctx, w.rec, start, end)
	if err != nil {
		return nil, err
	}
	return podrun.WriteScenario(w.out, w.run.ID, got, rundir.ScenarioWake, w.workloads, w.recs)
}
