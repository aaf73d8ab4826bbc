// Package watch is the tuner's DaemonSet mode: at agent start-up it applies the mounted
// profile, then re-verifies it on an interval, logging the settings that drift and who may
// have changed them, and exporting drift as Prometheus metrics.
package watch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nodectl/nodectl/tuner"
)

// Config says what to watch and how often.
type Config struct {
	// Engine holds the profile's settings and the state file.
	Engine *tuner.Engine
	// Interval is the time between verifications.
	Interval time.Duration
	// ApplyOnStart applies the profile once before the first verification. A failed apply
	// (already rolled back by the engine) is logged and counted, not fatal: verification
	// then reports what does not hold.
	ApplyOnStart bool
	Log          *slog.Logger
}

// Run applies the profile when cfg.ApplyOnStart says so, then verifies it at once and every
// cfg.Interval until ctx is done, when it returns nil. It logs a setting when it starts to
// drift (and again when it drifts to another value) and when it holds again. m may be nil
// for no metrics. The error is only for a bad Config.
func Run(ctx context.Context, cfg Config, m *Metrics) error {
	if cfg.Engine == nil {
		return errors.New("tune watch: no engine")
	}
	if cfg.Interval <= 0 {
		return fmt.Errorf("tune watch: interval %s: want a positive duration", cfg.Interval)
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w := &watcher{e: cfg.Engine, m: m, log: log.With("component", "tune-watch", "profile", cfg.Engine.Profile), drifted: map[string]string{}}
	if cfg.ApplyOnStart {
		w.apply(ctx)
	}
	tick := time.NewTicker(cfg.Interval)
	defer tick.Stop()
	for {
		w.verify(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

type watcher struct {
	e   *tuner.Engine
	m   *Metrics
	log *slog.Logger
	// drifted maps each drifting setting to the value it drifted to, so each drift is
	// logged once.
	drifted map[string]string
}

func (w *watcher) apply(ctx context.Context) {
	res, err := w.e.Apply(ctx)
	if err != nil {
		w.log.Error("applying the profile at start", "err", err)
		w.m.applied(resultError)
		return
	}
	w.log.Info("applied the profile at start", "changed", res.Changed, "held", res.Held)
	w.m.applied(resultOK)
}

func (w *watcher) verify(ctx context.Context) {
	items, err := w.e.Current(ctx, true)
	if err != nil {
		if ctx.Err() != nil {
			return // shutting down, not a failure
		}
		w.log.Warn("verifying the profile", "err", err)
		w.m.verified(resultError)
		return
	}
	drifted, pending := 0, 0
	for _, it := range items {
		prev, was := w.drifted[it.ID]
		switch {
		case it.Change:
			drifted++
			got := current(it)
			if !was || prev != got {
				w.log.Warn("setting drifted", "setting", it.ID, "backend", it.Backend, "current", got, "desired", it.Desired, "suspects", it.Suspects)
			}
			w.drifted[it.ID] = got
		case was:
			w.log.Info("setting holds again", "setting", it.ID, "backend", it.Backend, "desired", it.Desired)
			delete(w.drifted, it.ID)
		}
		// A drifted setting is counted as drift, not as waiting for a restart.
		if it.Pending && !it.Change {
			pending++
		}
		w.m.setting(it.ID, it.Backend, it.Change)
	}
	w.m.drift(drifted, pending)
	if drifted > 0 {
		w.m.verified(resultDrift)
	} else {
		w.m.verified(resultOK)
	}
}

func current(it tuner.Item) string {
	if !it.Present {
		return "(absent)"
	}
	return it.Current
}

// The updates below do nothing on a nil *Metrics.

func (m *Metrics) applied(result string) {
	if m != nil {
		m.apply.WithLabelValues(result).Inc()
	}
}

func (m *Metrics) verified(result string) {
	if m == nil {
		return
	}
	m.verify.WithLabelValues(result).Inc()
	if result != resultError {
		m.lastVerify.SetToCurrentTime()
	}
}

func (m *Metrics) setting(id, backend string, drifted bool) {
	if m == nil {
		return
	}
	v := 0.0
	if drifted {
		v = 1
	}
	m.perSetting.WithLabelValues(id, backend).Set(v)
}

func (m *Metrics) drift(drifted, pending int) {
	if m != nil {
		m.drifted.Set(float64(drifted))
		m.pending.Set(float64(pending))
	}
}
