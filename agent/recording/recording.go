// Package recording traces and samples the whole node for a while, with no workloads of its
// own, into a run directory (`nodectl record`): the user runs their own load meanwhile.
package recording

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nodectl/nodectl/agent/cgroup"
	"github.com/nodectl/nodectl/agent/collect"
	"github.com/nodectl/nodectl/agent/sample"
	"github.com/nodectl/nodectl/agent/trace"
	"github.com/nodectl/nodectl/rundir"
)

// Config configures a recording.
type Config struct {
	Duration time.Duration
	Interval time.Duration
	Out      string
	Cgroupfs string
	Procfs   string
	Sysfs    string
	Tracefs  string
	Args     []string
	// MaxCgroups bounds how many cgroups the cgroup sampler follows (those the tracer saw, in
	// order of first appearance), so a node with thousands of cgroups stays cheap.
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
	if cfg.MaxCgroups <= 0 {
		cfg.MaxCgroups = 1000
	}
	layout, err := cgroup.DetectProcfs(cfg.Cgroupfs, cfg.Procfs)
	if err != nil {
		return "", err
	}
	id := fmt.Sprintf("record-%s", time.Now().UTC().Format("20060102-150405"))
	meta := rundir.NewMeta(id, rundir.ScenarioRecord, cfg.Procfs, layout.V1, cfg.Interval, cfg.Args)
	w, err := rundir.Create(cfg.Out, meta)
	if err != nil {
		return "", err
	}
	defer w.Close()
	tr, err := trace.New(trace.Config{CgroupV1: layout.V1, Sysfs: cfg.Sysfs, Tracefs: cfg.Tracefs}, cgroup.NewResolver(layout), cfg.Log.With("component", "trace"))
	if err != nil {
		return cfg.Out, fmt.Errorf("starting the tracer: %w", err)
	}
	defer tr.Close()
	if err := w.UpdateMeta(func(m *rundir.Meta) { m.Tracer = tr.Status() }); err != nil {
		return cfg.Out, err
	}

	// Follow with the cgroup sampler the cgroups the tracer sees.
	var mu sync.Mutex
	var paths []string
	seen := map[string]bool{}
	records := 0
	start := time.Now()
	observe := func(batch []rundir.Record) {
		mu.Lock()
		defer mu.Unlock()
		records += len(batch)
		if cfg.Progress != nil {
			cfg.Progress(time.Since(start), records)
		}
		for _, r := range batch {
			if r.Cgroup == "" || seen[r.Cgroup] || strings.HasPrefix(r.Cgroup, "<") || len(paths) >= cfg.MaxCgroups {
				continue
			}
			seen[r.Cgroup] = true
			paths = append(paths, r.Cgroup)
		}
	}
	cgroupPaths := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(paths)
	}
	sources := map[string]collect.Source{
		"trace":   collect.SourceFunc(tr.Collect),
		"cgroups": sample.NewCgroups(layout, cgroupPaths),
		"system":  sample.NewSystem(cfg.Procfs, cfg.Sysfs, nil),
	}
	c := collect.New(sources, w, cfg.Interval, observe, cfg.Log.With("component", "collect"))
	if err := w.Append(rundir.Record{Type: rundir.TypePhase, Time: start, Name: rundir.PhaseRecord, Event: rundir.EventStart}); err != nil {
		return cfg.Out, err
	}
	if err := c.Snapshot(start); err != nil {
		return cfg.Out, err
	}
	rctx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	if err := c.Run(rctx); err != nil {
		return cfg.Out, err
	}
	end := time.Now()
	if err := c.Snapshot(end); err != nil {
		return cfg.Out, err
	}
	if err := w.Append(rundir.Record{Type: rundir.TypePhase, Time: end, Name: rundir.PhaseRecord, Event: rundir.EventEnd}); err != nil {
		return cfg.Out, err
	}
	return cfg.Out, w.Close()
}
