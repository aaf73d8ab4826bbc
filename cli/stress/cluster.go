package stress

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodectl/nodectl/agent/recorded"
	"github.com/nodectl/nodectl/analyzer"
	agentv1 "github.com/nodectl/nodectl/api/agent/v1"
	"github.com/nodectl/nodectl/cli/internal/console"
	"github.com/nodectl/nodectl/cli/internal/interrupt"
	"github.com/nodectl/nodectl/cli/internal/podrun"
	"github.com/nodectl/nodectl/cli/internal/remote"
	"github.com/nodectl/nodectl/internal/quantity"
	"github.com/nodectl/nodectl/rundir"
	st "github.com/nodectl/nodectl/stress"
	"github.com/nodectl/nodectl/stress/launch"
	"github.com/nodectl/nodectl/stress/workload"
)

// Flags of a local run that mean nothing for a run of pods on --node: the node's agent traces
// and samples, and the kubelet makes the cgroups.
var localOnlyFlags = []string{"node-memory", "heartbeat", "daemons", "interval", "runsc-platform", "cgroupfs", "procfs", "sysfs", "tracefs", "scratch-dir", "state-dir"}

// checkClusterFlags refuses the flags that do not apply to a run of pods.
func checkClusterFlags(cmd *cobra.Command) error {
	for _, name := range localOnlyFlags {
		if f := cmd.Flags().Lookup(name); f != nil && f.Changed {
			return fmt.Errorf("--%s: not with --%s (the node's agent records the run, and the kubelet makes its cgroups)", name, remote.FlagNode)
		}
	}
	return nil
}

// runtimeClass is the RuntimeClass of the workload pods: --runtime-class, else GKE's name of
// gVisor's for --runtime runsc, else the cluster's default runtime.
func runtimeClass(rt launch.Runtime, class string) string {
	if class == "" && rt == launch.RuntimeRunsc {
		return "gvisor"
	}
	return class
}

// podSession is a run of pods on --node under way: the cluster, the node's agent, the run's
// namespace, and the run directory it will write.
type podSession struct {
	node     string
	c        *remote.Cluster
	ac       agentv1.AgentClient
	rec      recorded.Recorder // the node agent's flight recorder, through ac
	run      *podrun.Run
	out      string
	ncpu     int
	progress io.Writer
}

// startPods checks the flags of a run of pods, reaches the node's agent (a run it cannot record
// is not started) and makes the run's namespace. The context ends on Ctrl-C; the function
// returned deletes the run's pods and namespace, and must run on every path.
func startPods(cmd *cobra.Command, rf *runFlags, scenario string, extra ...remote.Permission) (context.Context, *podSession, func(), error) {
	if err := checkClusterFlags(cmd); err != nil {
		return nil, nil, nil, err
	}
	s := &podSession{node: remote.FromCommand(cmd).Node, progress: cmd.ErrOrStderr()}
	id := st.NewRunID(scenario)
	s.out = rf.opts.Out
	if s.out == "" {
		s.out = filepath.Join(os.TempDir(), "nodectl-runs", id)
	}
	// Checked now, not after the run: a run directory is made new (or in an empty directory).
	if entries, err := os.ReadDir(s.out); err == nil && len(entries) > 0 {
		return nil, nil, nil, fmt.Errorf("--out %s: not empty", s.out)
	}
	var err error
	if s.c, err = remote.Connect(remote.FromCommand(cmd)); err != nil {
		return nil, nil, nil, err
	}
	ctx, stop := interrupt.SignalContext(cmd.Context(), cmd.ErrOrStderr())
	var closer io.Closer
	fail := func(err error) (context.Context, *podSession, func(), error) {
		if closer != nil {
			closer.Close()
		}
		stop()
		return nil, nil, nil, err
	}
	if s.ac, closer, err = s.c.DialAgent(ctx, s.node); err != nil {
		return fail(err)
	}
	s.rec = recorded.FromAgent(s.ac, nil)
	if s.ncpu, err = s.c.NodeCPUs(ctx, s.node); err != nil {
		return fail(err)
	}
	if s.run, err = podrun.Start(ctx, s.c, s.node, id, s.progress, extra...); err != nil {
		return fail(err)
	}
	finish := func() {
		// Ctrl-C or a failure ended ctx: the pods still go, with a context of their own.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Minute)
		defer cancel()
		if derr := s.run.Delete(dctx); derr != nil {
			fmt.Fprintf(s.progress, "nodectl: %v\n", derr)
		}
		closer.Close()
		stop()
	}
	return ctx, s, finish, nil
}

// clusterNoisy runs noisy's victim and hogs as pods on --node, has the node's agent record
// them, pulls the window to a run directory and explains it.
func clusterNoisy(cmd *cobra.Command, rf *runFlags, cfg st.NoisyConfig) error {
	for _, h := range cfg.Hogs {
		if h.Target != "" {
			return fmt.Errorf("--hog %s,target=%s: not with --%s (a pod writes to its own emptyDir on the node's disk)", h.Kind, h.Target, remote.FlagNode)
		}
	}
	ctx, s, finish, err := startPods(cmd, rf, "noisy")
	if err != nil {
		return err
	}
	defer finish()
	run, node, ncpu, progress := s.run, s.node, s.ncpu, s.progress
	class := runtimeClass(rf.opts.Runtime, rf.runtimeClass)
	if cfg.VictimWorkRounds == 0 {
		cfg.VictimWorkRounds = workload.DefaultWorkRounds
	}
	if cfg.VictimWriteBytes == 0 {
		cfg.VictimWriteBytes = workload.DefaultWriteBytes
	}
	cfg.Interval = time.Second
	victim := podrun.Spec{Name: rundir.KindVictim, CPULimitMilli: cfg.VictimCPUMilli, CPURequestMilli: cfg.VictimCPURequestMilli,
		MemoryLimit: cfg.VictimMemBytes, RuntimeClass: class,
		Args: workload.Command{Run: run.ID, Config: st.NoisyWorkload(cfg, rundir.KindVictim, st.HogSpec{}, podrun.WorkDir, ncpu)}.Args()}
	var hogs []podrun.Spec
	kinds := map[string]string{victim.Name: rundir.KindVictim}
	n := map[string]int{}
	for _, h := range cfg.Hogs {
		for range h.Count {
			name := fmt.Sprintf("%s-hog-%d", h.Kind, n[h.Kind])
			n[h.Kind]++
			kinds[name] = h.Kind
			hogs = append(hogs, podrun.Spec{Name: name, CPULimitMilli: h.CPUMilli, CPURequestMilli: h.CPURequestMilli, MemoryLimit: h.MemBytes, RuntimeClass: class,
				Args: workload.Command{Run: run.ID, Config: st.NoisyWorkload(cfg, h.Kind, h, podrun.WorkDir, ncpu)}.Args()})
		}
	}

	fmt.Fprintf(progress, "noisy on node %s: victim alone %s, then next to %d hog pod(s) %s\n", node, cfg.Baseline, len(hogs), cfg.Duration)
	if err := launchAndWait(ctx, run, victim); err != nil {
		return err
	}
	baselineFrom := time.Now()
	if err := hold(ctx, run, cfg.Baseline, "baseline"); err != nil {
		return err
	}
	if err := launchAndWait(ctx, run, hogs...); err != nil {
		return err
	}
	from := time.Now()
	if err := hold(ctx, run, cfg.Duration, "stress"); err != nil {
		return err
	}
	to := time.Now()
	w := recorded.Window{BaselineFrom: baselineFrom, From: from, To: to}
	rep, err := s.finish(ctx, "the window and the pods' measurements", func() (*rundir.Run, error) {
		return s.collectNoisy(ctx, w, append([]podrun.Spec{victim}, hogs...), kinds)
	})
	if err != nil {
		return err
	}
	return rf.report(rep, "noisy", func() error { return console.Render(cmd.OutOrStdout(), rep, rf.output) })
}

// finish lets the agent's last samples of the run land (within an interval or two), writes the
// run directory with collect (what of them) and analyzes the run collect wrote, as it holds it.
// A half-written run is no run: out was new or empty, and is removed again when collect fails.
func (s *podSession) finish(ctx context.Context, what string, collect func() (*rundir.Run, error)) (*analyzer.Report, error) {
	if err := sleepCtx(ctx, 3*time.Second); err != nil {
		return nil, err
	}
	fmt.Fprintf(s.progress, "collecting %s from the node's agent into %s\n", what, s.out)
	run, err := collect()
	if err != nil {
		os.RemoveAll(s.out)
		return nil, err
	}
	fmt.Fprintf(s.progress, "run directory: %s\n", s.out)
	return analyzeRun(run)
}

// launchAndWait creates the pods and waits until they run (at most podStartTimeout).
func launchAndWait(ctx context.Context, run *podrun.Run, specs ...podrun.Spec) error {
	if len(specs) == 0 {
		return nil
	}
	var names []string
	for _, s := range specs {
		if err := run.Launch(ctx, s); err != nil {
			return err
		}
		names = append(names, s.Name)
	}
	wctx, cancel := context.WithTimeout(ctx, podStartTimeout)
	defer cancel()
	start := time.Now()
	if err := run.WaitRunning(wctx, names...); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%w: %v", st.ErrInterrupted, context.Cause(ctx))
		}
		return err
	}
	fmt.Fprintf(run.Progress(), "running: %s (%s)\n", strings.Join(names, ", "), time.Since(start).Round(100*time.Millisecond))
	return nil
}

// podStartTimeout bounds a pod's start: an image pull included.
const podStartTimeout = 3 * time.Minute

// hold lets a phase run for d, checking every few seconds that no pod failed.
func hold(ctx context.Context, run *podrun.Run, d time.Duration, phase string) error {
	fmt.Fprintf(run.Progress(), "%s: %s\n", phase, d)
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w during %s: %v", st.ErrInterrupted, phase, context.Cause(ctx))
		case <-time.After(min(2*time.Second, time.Until(end))):
		}
		if err := run.Check(ctx); err != nil {
			return fmt.Errorf("during %s: %w", phase, err)
		}
	}
	return nil
}

// cleanNode deletes what runs of pods left on node.
func cleanNode(cmd *cobra.Command, node string, ids []string, output string) error {
	if len(ids) > 0 {
		return fmt.Errorf("RUN_ID with --%s: it removes every run of pods left on the node", remote.FlagNode)
	}
	for _, name := range []string{"all", "cgroupfs", "procfs", "sysfs", "tracefs", "scratch-dir", "state-dir"} {
		if f := cmd.Flags().Lookup(name); f != nil && f.Changed {
			return fmt.Errorf("--%s: not with --%s", name, remote.FlagNode)
		}
	}
	c, err := remote.Connect(remote.FromCommand(cmd))
	if err != nil {
		return err
	}
	removed, err := podrun.Clean(cmd.Context(), c, node, cmd.ErrOrStderr())
	if output == "json" {
		if removed == nil {
			removed = []string{}
		}
		if jerr := json.NewEncoder(cmd.OutOrStdout()).Encode(map[string][]string{"removed": removed}); jerr != nil {
			return errors.Join(err, jerr)
		}
		return err
	}
	for _, ns := range removed {
		fmt.Fprintf(cmd.OutOrStdout(), "removed namespace %s\n", ns)
	}
	if len(removed) == 0 && err == nil {
		fmt.Fprintln(cmd.OutOrStdout(), "nothing to clean")
	}
	return err
}

// collectNoisy writes the run directory: the agent's window, with the victim under examination
// (an observed workload), and the workload pods' own measurements (the victim probe's), each
// pod a workload of the run named as the agent names it (namespace/pod/container), the hogs of
// their kind.
func (s *podSession) collectNoisy(ctx context.Context, w recorded.Window, specs []podrun.Spec, kinds map[string]string) (*rundir.Run, error) {
	run := s.run
	got, err := s.pullWindow(ctx, w)
	if err != nil {
		return nil, err
	}
	cgroups := podCgroups(got.Meta)
	var workloads []rundir.Workload
	for _, s := range specs {
		cg, ok := podCgroup(cgroups, run, s.Name)
		if !ok {
			return nil, fmt.Errorf("the node's agent does not know pod %s/%s: is it the agent of this version, on Kubernetes (--kubeconfig or in a pod)?", run.Namespace, s.Name)
		}
		name := podWorkload(run, s.Name)
		kind := kinds[s.Name]
		if kind == rundir.KindVictim {
			// Examined as the agent examines a pod, from the kernel's side: the probe's
			// readings are kept beside it, but the victim rules' baselines assume a run's
			// own cgroups and phases, not an agent window's.
			kind = rundir.KindObserved
		}
		workloads = append(workloads, podSpecWorkload(s, name, kind, cg))
	}
	meta := got.Meta
	meta.ID, meta.Args = run.ID, os.Args
	for _, d := range got.Meta.Workloads {
		if d.Kind == rundir.KindDaemon {
			workloads = append(workloads, d)
		}
	}
	meta.Workloads = workloads
	recs := got.Records
	for i, spec := range specs {
		ms, err := run.Measurements(ctx, spec.Name, time.Time{})
		if err != nil {
			return nil, err
		}
		for _, m := range ms {
			recs = append(recs, measurementRecord(m, workloads[i].Cgroup, workloads[i].Name))
		}
	}
	return rundir.Write(s.out, meta, recs)
}

// podWorkload is the workload name of a run's pod: the agent's namespace/pod/container.
func podWorkload(run *podrun.Run, pod string) string { return run.Namespace + "/" + pod + "/" + pod }

// podCgroup is the cgroup the node's agent knows a run's pod by: its container's, or for a
// gVisor pod, whose containers the host cannot tell apart, the pod's.
func podCgroup(cgroups map[string]string, run *podrun.Run, pod string) (string, bool) {
	if cg, ok := cgroups[podWorkload(run, pod)]; ok {
		return cg, true
	}
	cg, ok := cgroups[run.Namespace+"/"+pod]
	return cg, ok
}

// podSpecWorkload describes a workload pod as a workload of the run.
func podSpecWorkload(s podrun.Spec, name, kind, cgroup string) rundir.Workload {
	return rundir.Workload{Name: name, Kind: kind, Cgroup: cgroup, CPU: quantity.FormatCPU(s.CPULimitMilli),
		CPURequest: quantity.FormatCPU(s.CPURequestMilli), Memory: quantity.FormatSize(s.MemoryLimit), Runtime: s.RuntimeClass}
}

func measurementRecord(m workload.Measurement, cgroup, name string) rundir.Record {
	v := m.Value
	return rundir.Record{Type: rundir.TypeSample, Time: m.T, Metric: m.Metric, Cgroup: cgroup, Workload: name, Value: &v}
}

// podCgroups maps the names of the pods the node's agent knows (namespace/pod/container), by
// its meta, to their cgroups.
func podCgroups(agent rundir.Meta) map[string]string {
	cgroups := map[string]string{}
	for _, p := range agent.Pods {
		cgroups[p.Name] = p.Cgroup
	}
	return cgroups
}

// pullWindow reads a window of the node's agent's flight recorder into memory, once, at every
// tick the agent recorded; its meta is the agent's as it is now, with the pods it knows.
func (s *podSession) pullWindow(ctx context.Context, w recorded.Window) (*rundir.Run, error) {
	meta, err := s.rec.Meta(ctx)
	if err != nil {
		return nil, err
	}
	w.Ticks = recorded.AllTicks
	return w.Run(s.rec.Source(ctx), meta)
}

// pullSpan reads the node's agent's window of a run of pods, from start to end: a short
// baseline gives every series its value as the run began.
func (s *podSession) pullSpan(ctx context.Context, start, end time.Time) (*rundir.Run, error) {
	return s.pullWindow(ctx, recorded.Window{BaselineFrom: start.Add(-2 * time.Second), From: start, To: end})
}

// writeScenario writes a run of pods as a run of its scenario: the agent's window with its
// phases (baseline, window) replaced by the run's own in recs, the run's workloads, and each of
// recs without a cgroup given its workload's.
func (s *podSession) writeScenario(got *rundir.Run, scenario string, workloads []rundir.Workload, recs []rundir.Record) (*rundir.Run, error) {
	meta := got.Meta
	meta.Scenario, meta.ID, meta.Args, meta.Workloads = scenario, s.run.ID, os.Args, workloads
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
	return rundir.Write(s.out, meta, all)
}
