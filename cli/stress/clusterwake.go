package stress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/nodectl/nodectl/api/agent/v1"
	"github.com/nodectl/nodectl/cli/internal/podrun"
	"github.com/nodectl/nodectl/rundir"
	st "github.com/nodectl/nodectl/stress"
)

// A start's phase ends once the node's agent follows the pod's cgroup and has read it wakeTicks
// after the answer (it samples every second), waiting at most wakeSampleWait.
const (
	wakeTicks      = 2500 * time.Millisecond
	wakeSampleWait = 15 * time.Second
)

// clusterWake runs wake as pods on --node (stress.WakeOn on podrun's placement): one start at a
// time at each CPU limit, explained from the node's agent's window: the pods' CFS throttling
// and run-queue waits, read from their cgroups.
func clusterWake(cmd *cobra.Command, rf *runFlags, cfg st.WakeConfig) error {
	ctx, s, finish, err := startPods(cmd, rf, "wake")
	if err != nil {
		return err
	}
	defer finish()
	p := podrun.NewPlacement(s.run, s.rec, s.ncpu, runtimeClass(rf.opts.Runtime, rf.runtimeClass), rundir.ScenarioWake, s.out)
	p.Sampled = s.sampledAfter
	if err := st.WakeOn(ctx, cfg, p); err != nil {
		return err
	}
	rep, err := analyzeRun(p.Run())
	if err != nil {
		return err
	}
	return rf.report(rep, "wake", func() error { return renderWake(cmd, rf, rep) })
}

// sampledAfter waits until the node's agent follows the cgroup (it has a sample of its CPU
// counters since from) and has read it at least twice after t. The agent writes a counter when
// it changed, so the last value written stands at every later tick: the boot's counters are
// those at its return (the sandbox idles after its answer).
func (s *podSession) sampledAfter(ctx context.Context, cg string, from, t time.Time) error {
	deadline := t.Add(wakeSampleWait)
	for {
		followed := false
		stream, err := s.ac.Query(ctx, &agentv1.QueryRequest{From: timestamppb.New(from), To: timestamppb.New(time.Now().Add(time.Second)),
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
		if err := podrun.SleepCtx(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
}
