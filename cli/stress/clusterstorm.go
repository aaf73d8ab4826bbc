package stress

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodectl/nodectl/analyzer"
	"github.com/nodectl/nodectl/cli/internal/console"
	"github.com/nodectl/nodectl/cli/internal/podrun"
	"github.com/nodectl/nodectl/cli/internal/remote"
	"github.com/nodectl/nodectl/internal/quantity"
	"github.com/nodectl/nodectl/rundir"
	st "github.com/nodectl/nodectl/stress"
	"github.com/nodectl/nodectl/stress/workload"
)

// clusterStorm runs an fsync storm of writer pods on --node: each writer's standard input is
// attached through the API server, so that a storm's go reaches them all at once, as a local
// run's does through their pipes; the device's side comes from the node's agent.
func clusterStorm(cmd *cobra.Command, rf *runFlags, cfg st.StormConfig) error {
	if cfg.Target != "" {
		return fmt.Errorf("--target %s: not with --%s (a writer pod writes to its own emptyDir on the node's disk)", cfg.Target, remote.FlagNode)
	}
	ctx, s, finish, err := startPods(cmd, rf, "fsync-storm", remote.AttachPermissions()...)
	if err != nil {
		return err
	}
	defer finish()
	w := &podStorm{podSession: s, cfg: cfg, events: make(chan stormLine, 64), line: st.NewLiveLine(s.progress, console.IsTerminal(os.Stderr))}
	meta, err := s.rec.Meta(ctx)
	if err != nil {
		return err
	}
	w.interval = time.Duration(meta.Interval)
	class := runtimeClass(rf.opts.Runtime, rf.runtimeClass)
	var specs []podrun.Spec
	for i := range cfg.Writers {
		specs = append(specs, podrun.Spec{Name: rundir.StormWriterName(i), RuntimeClass: class, Stdin: true,
			Args: workload.Command{Run: s.run.ID, Config: &workload.FsyncWriterConfig{Dir: podrun.WorkDir, Bytes: cfg.Bytes}}.Args()})
	}
	fmt.Fprintf(s.progress, "fsync-storm on node %s: %d writer pod(s) × %s, %d storm(s)\n", s.node, cfg.Writers, quantity.FormatSize(cfg.Bytes), cfg.Rounds)
	if err := s.run.LaunchAndWait(ctx, specs...); err != nil {
		return err
	}
	actx, detach := context.WithCancel(ctx)
	defer detach()
	if err := w.attach(actx, specs); err != nil {
		return err
	}
	start := time.Now()
	for n := 1; n <= cfg.Rounds; n++ {
		if n > 1 {
			if err := podrun.SleepCtx(ctx, cfg.Pause); err != nil {
				return err
			}
		}
		if err := w.storm(ctx, n); err != nil {
			return err
		}
	}
	w.line.Done()
	end := time.Now()
	rep, err := s.finish(ctx, "the storms", func() (*rundir.Run, error) { return w.collect(ctx, start, end) })
	if err != nil {
		return err
	}
	return rf.report(rep, "fsync-storm", func() error { return renderStorm(cmd, rf, rep) })
}

// podStorm is an fsync storm of writer pods under way.
type podStorm struct {
	*podSession
	cfg    st.StormConfig
	line   *st.LiveLine
	names  []string
	gos    []*io.PipeWriter // each writer's standard input
	events chan stormLine
	counts map[string][]int // metric -> per writer, how many it emitted
	first  []time.Time      // each writer's first ready, read from its log
	failed chan error       // an attach that ended early
	recs   []rundir.Record
	// interval is the agent's sampling interval.
	interval time.Duration
}

// stormLine is a writer's measurement, as its attached output carries it.
type stormLine struct {
	writer int
	m      workload.Measurement
}

// attach opens each writer's standard input and output through the API server, and waits until
// every writer said it was ready: for the first storm from its log (its first line came before
// the attach), then from its output.
func (w *podStorm) attach(ctx context.Context, specs []podrun.Spec) error {
	w.counts = map[string][]int{}
	w.failed = make(chan error, len(specs))
	for i, s := range specs {
		pr, pw := io.Pipe()
		w.names, w.gos = append(w.names, s.Name), append(w.gos, pw)
		out := &lineWriter{fn: func(line []byte) {
			var m workload.Measurement
			if json.Unmarshal(line, &m) == nil && m.Metric != "" {
				select {
				case w.events <- stormLine{i, m}:
				case <-ctx.Done():
				}
			}
		}}
		go func() {
			err := w.c.Attach(ctx, w.run.Namespace, s.Name, s.Name, pr, out)
			if ctx.Err() == nil {
				w.failed <- fmt.Errorf("writer %s/%s: its attached output ended: %v", w.run.Namespace, s.Name, err)
			}
		}()
	}
	w.first = make([]time.Time, len(w.names))
	for i, name := range w.names {
		for {
			ms, err := w.run.Measurements(ctx, name, time.Time{})
			if err != nil {
				return err
			}
			if j := slices.IndexFunc(ms, func(m workload.Measurement) bool { return m.Metric == workload.MetricStormReady }); j >= 0 {
				w.first[i] = ms[j].T
				break
			}
			if err := podrun.SleepCtx(ctx, 250*time.Millisecond); err != nil {
				return err
			}
		}
		w.count(i, workload.MetricStormReady)
	}
	return nil
}

func (w *podStorm) count(writer int, metric string) {
	if w.counts[metric] == nil {
		w.counts[metric] = make([]int, len(w.names))
	}
	w.counts[metric][writer]++
}

// storm runs storm n: once every writer is ready, the go to all of them at once, then the wait
// until each writer's fsync returned.
func (w *podStorm) storm(ctx context.Context, n int) error {
	phase := rundir.RoundPhase(n)
	if err := w.await(ctx, phase, workload.MetricStormReady, n); err != nil {
		return err
	}
	w.recs = append(w.recs, rundir.Record{Type: rundir.TypePhase, Time: time.Now(), Name: phase, Event: rundir.EventStart})
	// Each pipe's write returns once its stream took the line: all of them at once.
	var wg sync.WaitGroup
	errs := make([]error, len(w.gos))
	for i, pw := range w.gos {
		wg.Go(func() { _, errs[i] = io.WriteString(pw, workload.StormGo) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return fmt.Errorf("releasing %s: %w", w.names[i], err)
		}
	}
	if err := w.await(ctx, phase, rundir.MetricStormDurable, n); err != nil {
		return err
	}
	// The agent reads the device's and the cgroups' counters every interval, not at the storm's
	// edges as a local run does: the phase ends past its first read after the last fsync, so
	// that a storm shorter than an interval still has its I/O inside (and reads that long).
	if err := podrun.SleepCtx(ctx, w.interval*3/2); err != nil {
		return err
	}
	w.recs = append(w.recs, rundir.Record{Type: rundir.TypePhase, Time: time.Now(), Name: phase, Event: rundir.EventEnd})
	return nil
}

// await waits until every writer has emitted metric n times in all, keeping the measurements
// as they come, failing on --timeout, a writer whose output ended, or a pod that failed.
func (w *podStorm) await(ctx context.Context, phase, metric string, n int) error {
	timeout := time.NewTimer(w.cfg.Timeout)
	defer timeout.Stop()
	check := time.NewTicker(2 * time.Second)
	defer check.Stop()
	started := time.Now()
	done := func() int {
		k := 0
		for _, c := range w.counts[metric] {
			if c >= n {
				k++
			}
		}
		return k
	}
	for done() < len(w.names) {
		select {
		case ev := <-w.events:
			if ev.m.Metric == workload.MetricStormReady && !ev.m.T.After(w.first[ev.writer]) {
				continue // the first ready, counted from the log, also came through an early attach
			}
			w.count(ev.writer, ev.m.Metric)
			if ev.m.Metric != workload.MetricStormReady {
				w.recs = append(w.recs, podrun.MeasurementRecord(ev.m, "", w.names[ev.writer]))
			}
		case err := <-w.failed:
			return err
		case <-check.C:
			if err := w.run.Check(ctx); err != nil {
				return fmt.Errorf("during %s: %w", phase, err)
			}
		case <-ctx.Done():
			return fmt.Errorf("%w during %s: %v", st.ErrInterrupted, phase, context.Cause(ctx))
		case <-timeout.C:
			return fmt.Errorf("%s: %d of %d writers did not finish within --timeout %s: %w", phase, len(w.names)-done(), len(w.names), w.cfg.Timeout, st.ErrTimeout)
		}
		w.line.Update(fmt.Sprintf("%-8s %6s | %d of %d writers %s", phase, time.Since(started).Round(100*time.Millisecond), done(), len(w.names), metric))
	}
	return nil
}

// collect writes the storms as an fsync-storm run: the agent's window of them (its phases
// replaced by the storms'), each writer a workload with its pod's cgroup, on the device its
// cgroups wrote the most to.
func (w *podStorm) collect(ctx context.Context, start, end time.Time) (*rundir.Run, error) {
	got, err := podrun.PullSpan(ctx, w.rec, start, end)
	if err != nil {
		return nil, err
	}
	var writers []rundir.Workload
	var cgs []string
	for _, name := range w.names {
		cg, ok := w.run.CgroupOf(got.Meta, name)
		if !ok {
			return nil, fmt.Errorf("the node's agent does not know pod %s/%s: is it the agent of this version, on Kubernetes?", w.run.Namespace, name)
		}
		cgs = append(cgs, cg)
		writers = append(writers, rundir.Workload{Name: name, Kind: rundir.KindStormWriter, Cgroup: cg, Target: podrun.WorkDir})
	}
	dev := writersDevice(got, cgs)
	for i := range writers {
		writers[i].Device = dev
	}
	return podrun.WriteScenario(w.out, w.run.ID, got, rundir.ScenarioFsyncStorm, writers, w.recs)
}

// writersDevice is the disk under the writer pods' emptyDirs: the device their cgroups wrote the
// most bytes to in the run (the block tracer's counters).
func writersDevice(run *rundir.Run, cgroups []string) string {
	return run.Series(rundir.MetricBlkBytes).CgroupIn(cgroups...).Busiest(rundir.LabelDevice,
		func(ss rundir.SeriesSet) float64 { return ss.Delta(run.Span()) })
}

// lineWriter calls fn with each complete line written to it.
type lineWriter struct {
	buf []byte
	fn  func([]byte)
}

func (l *lineWriter) Write(p []byte) (int, error) {
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		l.fn(l.buf[:i])
		l.buf = l.buf[i+1:]
	}
}

// renderStorm prints an fsync-storm run's report: with -o json its writers, rounds and findings.
func renderStorm(cmd *cobra.Command, rf *runFlags, rep *analyzer.Report) error {
	if rf.output == "json" {
		return analyzer.RenderStormJSON(cmd.OutOrStdout(), rep)
	}
	return analyzer.RenderText(cmd.OutOrStdout(), rep)
}
