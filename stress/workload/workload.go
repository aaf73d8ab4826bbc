// Package workload holds the bodies of the stress workloads: the victim probe and the hogs.
// They run as hidden subcommands of the nodectl binary (`nodectl workload victim ...`), so the
// same code runs as a local child process, inside runc or runsc, or in a pod.
package workload

import (
	"context"
	"encoding/json"
	"io"
	"sync"
	"time"
)

// Measurement is one line a workload prints on standard output: a value the workload measured
// itself at time T. The launcher turns each line into a sample of the run.
type Measurement struct {
	T      time.Time `json:"t"`
	Metric string    `json:"metric"`
	Value  float64   `json:"value"`
}

// Emitter writes measurements as JSON lines; safe for concurrent use.
type Emitter struct {
	mu  sync.Mutex
	enc *json.Encoder
}

// NewEmitter writes to w (a workload's standard output).
func NewEmitter(w io.Writer) *Emitter { return &Emitter{enc: json.NewEncoder(w)} }

// Emit records one measurement; a broken pipe (the launcher went away) is returned so the
// workload can stop.
func (e *Emitter) Emit(t time.Time, metric string, v float64) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.enc.Encode(Measurement{T: t, Metric: metric, Value: v})
}

// sleepCtx sleeps for d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
