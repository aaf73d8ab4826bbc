package agent

import (
	"context"
	"errors"
	"fmt"
)

// Bounds on the analyses the API asks for, besides the incidents' own worker: each holds a
// window's records in the agent's memory (docs/agent.md, "Cost"), so a burst of post-mortems
// must queue, not add up past the agent's memory limit.
const (
	maxAPIAnalyses = 1 // at a time
	maxAPIQueued   = 4 // waiting for it; more are refused
)

// errBusy refuses an analysis when maxAPIQueued already wait.
var errBusy = errors.New("the agent is busy with other analyses")

// gate lets n analyses run at a time and queue more up to a bound.
type gate struct {
	slots, queue chan struct{}
}

func newGate(running, queued int) *gate {
	return &gate{slots: make(chan struct{}, running), queue: make(chan struct{}, running+queued)}
}

// enter waits for a slot until ctx is done; errBusy when the queue is full. The caller leaves
// through the returned func.
func (g *gate) enter(ctx context.Context) (leave func(), err error) {
	select {
	case g.queue <- struct{}{}:
	default:
		return nil, fmt.Errorf("%w: %d running and %d waiting; try again later", errBusy, cap(g.slots), cap(g.queue)-cap(g.slots))
	}
	select {
	case g.slots <- struct{}{}:
		return func() { <-g.slots; <-g.queue }, nil
	case <-ctx.Done():
		<-g.queue
		return nil, context.Cause(ctx)
	}
}

// stopOn is a channel closed when ctx is done or stop is closed, for a window's read; release
// ends its watch.
func stopOn(ctx context.Context, stop <-chan struct{}) (c <-chan struct{}, release func()) {
	out, done := make(chan struct{}), make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
		case <-stop:
		case <-done:
		}
		close(out)
	}()
	return out, func() { close(done) }
}
