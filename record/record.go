// Package recording traces and samples the whole node for a while, with no workloads of its
// own, into a run directory (`nodectl record`): the user runs their own load meanwhile.
package record

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nodectl/nodectl/host"
	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/record/session"
	"github.com/nodectl/nodectl/rundir"
)

// Config configures a recording.
type Config struct {
	Duration time.Duration
	Interval time.Duration
	Out      string
	Host     host.FS
	Args     []string
	// MaxCgroups bounds how many cgroups the cgroup sampler follows (those the tracer saw, in
	// order of first appearance), so a node with thousands of cgroups stays cheap; 0 means
	// session.DefaultMaxCgroups.
	MaxCgroups int
	Progress   func(elapsed time.Duration, records int)
	Log        *slog.Logger
}

// Run records until cfg.Duration has passed or ctx is done (an interrupted recording is kept:
// it is the user's data). It returns the run directory.
func Run(ctx context.Context, cfg Config) (string, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	layout, err := cgroup.DetectProcfs(cfg.Host.Cgroupfs, cfg.Host.Procfs)
	if err != nil {
		return "", err
	}
	id := fmt.Sprintf("record-%s", time.Now().UTC().Format("20060102-150405"))
	meta := rundir.NewMeta(id, rundir.ScenarioRecord, cfg.Host.Procfs, layout.V1, cfg.Interval, cfg.Args)
	w, err := rundir.Create(cfg.Out, meta)
	if err != nil {
		return "", err
	}
	defer w.Close()
	records := 0
	start := time.Now()
	sess, err := session.New(session.Config{
		Host: cfg.Host, Layout: layout, Interval: cfg.Interval,
		Trace: true, MaxCgroups: cfg.MaxCgroups, Log: cfg.Log,
		Observe: func(batch []rundir.Record) {
			records += len(batch) // batches come one at a time
			if cfg.Progress != nil {
				cfg.Progress(time.Since(start), records)
			}
		},
	}, w)
	if err != nil {
		return cfg.Out, err
	}
	defer sess.Close()
	if err := w.UpdateMeta(func(m *rundir.Meta) { m.Tracer = sess.TracerStatus() }); err != nil {
		return cfg.Out, err
	}
	if err := w.Append(rundir.Record{Type: rundir.TypePhase, Time: start, Name: rundir.PhaseRecord, Event: rundir.EventStart}); err != nil {
		return cfg.Out, err
	}
	if err := sess.Snapshot(start); err != nil {
		return cfg.Out, err
	}
	rctx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	if err := sess.Run(rctx); err != nil {
		return cfg.Out, err
	}
	end := time.Now()
	if err := sess.Snapshot(end); err != nil {
		return cfg.Out, err
	}
	if err := w.Append(rundir.Record{Type: rundir.TypePhase, Time: end, Name: rundir.PhaseRecord, Event: rundir.EventEnd}); err != nil {
		return cfg.Out, err
	}
	return cfg.Out, w.Close()
}
