// Package collect runs the sources of a recording (the tracer and the samplers) on an interval
// and appends what they return to a run's records.
package collect

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nodectl/nodectl/rundir"
)

// Source returns the samples of one producer at now.
type Source interface {
	Sample(now time.Time) ([]rundir.Record, error)
}

// FullSampler is a Source whose Sample may read part of what it can (a rotating share of many
// cgroups' costlier files); SampleFull reads all of it. Snapshot uses SampleFull, the interval
// ticks Sample, so that the window edges scenarios snapshot at are exact.
type FullSampler interface {
	Source
	SampleFull(now time.Time) ([]rundir.Record, error)
}

// SourceFunc adapts a function to Source.
type SourceFunc func(now time.Time) ([]rundir.Record, error)

// Sample calls f.
func (f SourceFunc) Sample(now time.Time) ([]rundir.Record, error) { return f(now) }

// Appender is where records go (a rundir.Writer).
type Appender interface {
	Append(recs ...rundir.Record) error
}

// Collector samples every source on an interval and on demand.
type Collector struct {
	sources  map[string]Source
	out      Appender
	interval time.Duration
	log      *slog.Logger

	order    []string   // source names in the order they are sampled
	mu       sync.Mutex // serialises snapshots: sources are not safe for concurrent use
	failures map[string]int
	observe  func([]rundir.Record)
	parts    [][]rundir.Record // each source's records in a collection, kept for the next
}

// New returns a collector; observe, if not nil, sees every batch appended (progress display,
// discovering cgroups to sample).
func New(sources map[string]Source, out Appender, interval time.Duration, observe func([]rundir.Record), log *slog.Logger) *Collector {
	return &Collector{sources: sources, order: slices.Sorted(maps.Keys(sources)), out: out, interval: interval, log: log,
		failures: map[string]int{}, observe: observe}
}

// First makes the source named name sample first in every collection, the others following
// in name order, so that what it reads can steer them in the same collection (the tracer
// tells the cgroup sampler which cgroups ran). It returns c.
func (c *Collector) First(name string) *Collector {
	if i := slices.Index(c.order, name); i > 0 {
		c.order = slices.Insert(slices.Delete(c.order, i, i+1), 0, name)
	}
	return c
}

// Snapshot samples every source now and appends the result. A source that fails is logged and
// what it did return is kept, so one bad cgroup or sampler does not stop the recording; only a
// failed append is returned. A FullSampler is read in full.
func (c *Collector) Snapshot(now time.Time) error { return c.collect(now, true) }

// collect samples every source, a FullSampler in full if full.
func (c *Collector) collect(now time.Time, full bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	// Sized exactly, once every source has answered: sized by the last batches, one wave of
	// wakeups (thousands of records between tens) made every batch after it as large.
	parts := c.parts[:0]
	n := 0
	for _, name := range c.order {
		s := c.sources[name]
		sample := s.Sample
		if f, ok := s.(FullSampler); ok && full {
			sample = f.SampleFull
		}
		recs, err := sample(now)
		if err != nil {
			c.failures[name]++
			if c.failures[name] <= 3 { // say it, but do not flood the log every interval
				c.log.Warn("sampling failed", "source", name, "err", err)
			}
		}
		parts = append(parts, recs)
		n += len(recs)
	}
	batch := make([]rundir.Record, 0, n)
	for _, recs := range parts {
		batch = append(batch, recs...)
	}
	clear(parts) // the sources' records are garbage once copied
	c.parts = parts[:0]
	if len(batch) == 0 {
		return nil
	}
	if err := c.out.Append(batch...); err != nil {
		return fmt.Errorf("appending samples: %w", err)
	}
	if c.observe != nil {
		c.observe(batch)
	}
	return nil
}

// Run samples every source on every tick until ctx is done: as Snapshot does, but a FullSampler
// through its Sample.
func (c *Collector) Run(ctx context.Context) error {
	t := time.NewTicker(c.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			if err := c.collect(now, false); err != nil {
				return err
			}
		}
	}
}
