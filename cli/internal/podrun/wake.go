package podrun

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/nodectl/nodectl/api/agent/v1"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/stress"
	"github.com/nodectl/nodectl/stress/workload"
)

// Wake launches a wake start as a pod with its limit (stress.Waker), the request pending from
// the start (a pod's standard input is no one's), waits for its answer, learns its cgroup from
// the node's agent while it runs, and keeps the wake time (by the node's clock from the create
// call: the pod's start, a gVisor sandbox's boot and the workload's, as a request waits for a
// pod woken for it) with the pod's measurements. It returns once the agent sampled the cgroup
// past the answer (sampledAfter): the boot's counters are the agent's then.
func (p *Placement) Wake(ctx context.Context, w stress.Planned, timeout time.Duration) error {
	body, ok := w.Config.(*workload.WakeConfig)
	if !ok {
		return fmt.Errorf("%s: not a wake start", w.Name)
	}
	pending := *body
	pending.Pending = true
	spec := Spec{Name: w.Name, CPULimitMilli: w.Limits.CPUMilli, CPURequestMilli: w.Limits.CPURequestMilli, RuntimeClass: p.class,
		Args: workload.Command{Run: p.run.ID, Config: &pending}.Args()}
	created := time.Now()
	if p.start.IsZero() {
		p.start = created
	}
	if err := p.run.Launch(ctx, spec); err != nil {
		return err
	}
	answer, ms, err := p.awaitAnswer(ctx, w.Name, created, timeout)
	if err != nil {
		return err
	}
	cg, err := p.cgroupOf(ctx, w.Name)
	if err != nil {
		return err
	}
	wake := answer.T.Sub(created).Seconds()
	p.recs = append(p.recs, rundir.Record{Type: rundir.TypeSample, Time: answer.T, Metric: rundir.MetricWake, Cgroup: cg, Workload: w.Name, Value: &wake})
	for _, m := range ms {
		p.recs = append(p.recs, MeasurementRecord(m, cg, w.Name))
	}
	// Named as the start, as its phase is, with the cgroup learnt while it ran: its pod is gone
	// by the time the run is written.
	wl := w.Workload
	wl.Cgroup, wl.Runtime = cg, p.class
	p.woken = append(p.woken, wl)
	if err := p.sampledAfter(ctx, cg, created, answer.T); err != nil {
		return err
	}
	fmt.Fprintf(p.run.progress, "%-14s woke in %s (its boot %s)\n", w.Name, time.Duration(wake*float64(time.Second)).Round(10*time.Millisecond),
		time.Duration(answer.Value*float64(time.Second)).Round(10*time.Millisecond))
	return nil
}

// Remove deletes the start's pod and waits until it is gone: the kubelet admits a pod only once
// the last one's CPU request is free (a 1-CPU start after a 1-CPU start on a 2-CPU node is
// refused).
func (p *Placement) Remove(ctx context.Context, w stress.Planned) error {
	return p.run.DeletePodWait(ctx, w.Name, 1)
}

// awaitAnswer waits for the pod's answer (its wake_boot_seconds line) and returns it with the
// pod's measurements, failing when the pod ends first or timeout passes.
func (p *Placement) awaitAnswer(ctx context.Context, name string, created time.Time, timeout time.Duration) (workload.Measurement, []workload.Measurement, error) {
	for {
		pods, err := p.run.Pods(ctx)
		if err != nil {
			return workload.Measurement{}, nil, err
		}
		for i := range pods {
			pod := &pods[i]
			if pod.Name != name {
				continue
			}
			if end, reason, msg := Ending(pod); end != "" {
				return workload.Measurement{}, nil, fmt.Errorf("pod %s/%s ended before answering: %s %s %s", pod.Namespace, name, end, reason, msg)
			}
			if !Ready(pod) {
				continue
			}
			ms, err := p.run.Measurements(ctx, name, time.Time{})
			if err != nil {
				return workload.Measurement{}, nil, err
			}
			if i := slices.IndexFunc(ms, func(m workload.Measurement) bool { return m.Metric == rundir.MetricWakeBoot }); i >= 0 {
				return ms[i], ms, nil
			}
		}
		if time.Since(created) > timeout {
			return workload.Measurement{}, nil, fmt.Errorf("%w: pod %s/%s did not answer within --timeout %s", stress.ErrTimeout, p.run.Namespace, name, timeout)
		}
		if err := SleepCtx(ctx, 250*time.Millisecond); err != nil {
			return workload.Measurement{}, nil, err
		}
	}
}

// cgroupOf is the cgroup the node's agent knows the pod by, waited for: the agent names a new
// pod once the runtime lists its container (docs/agent.md, "On Kubernetes").
func (p *Placement) cgroupOf(ctx context.Context, pod string) (string, error) {
	for deadline := time.Now().Add(15 * time.Second); ; {
		meta, err := p.rec.Meta(ctx)
		if err != nil {
			return "", err
		}
		if cg, ok := p.run.CgroupOf(meta, pod); ok {
			return cg, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("the node's agent does not know pod %s/%s after 15 s: is it the agent of this version, on Kubernetes?", p.run.Namespace, pod)
		}
		if err := SleepCtx(ctx, 500*time.Millisecond); err != nil {
			return "", err
		}
	}
}

// A start's phase ends once the node's agent follows the pod's cgroup and has read it wakeTicks
// after the answer (it samples every second), waiting at most wakeSampleWait.
const (
	wakeTicks      = 2500 * time.Millisecond
	wakeSampleWait = 15 * time.Second
)

// sampledAfter waits until the node's agent follows the cgroup (it has a sample of its CPU
// counters since from) and has read it at least twice after t. The agent writes a counter when
// it changed, so the last value written stands at every later tick: the boot's counters are
// those at its return (the sandbox idles after its answer).
func (p *Placement) sampledAfter(ctx context.Context, cg string, from, t time.Time) error {
	deadline := t.Add(wakeSampleWait)
	for {
		followed := false
		stream, err := p.ac.Query(ctx, &agentv1.QueryRequest{From: timestamppb.New(from), To: timestamppb.New(time.Now().Add(time.Second)),
			Metric: rundir.MetricCPUUsage, CgroupPrefix: cg})
		if err != nil {
			return err
		}
		for {
			chunk, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return fmt.Errorf("reading the samples of %s from the node's agent: %w", cg, err)
			}
			followed = followed || slices.ContainsFunc(chunk.GetRecords(), func(r *agentv1.Record) bool { return r.GetCgroup() == cg })
		}
		now := time.Now()
		if followed && now.After(t.Add(wakeTicks)) {
			return nil
		}
		if now.After(deadline) {
			return fmt.Errorf("the node's agent took no sample of %s within %s of its answer", cg, wakeSampleWait)
		}
		if err := SleepCtx(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
}
