package workload

import (
	"context"
	"fmt"
	"time"

	"github.com/nodectl/nodectl/rundir"
)

// Heartbeat stands in for a node daemon's periodic work (the kubelet renews its node lease every
// 10 s): it sleeps until each tick of period and records how late it woke up. A starved daemon
// wakes late; a late enough heartbeat makes the node look dead to the control plane.
func Heartbeat(ctx context.Context, period time.Duration, e *Emitter) error {
	if period <= 0 {
		return fmt.Errorf("heartbeat: period %s must be positive", period)
	}
	next := time.Now().Add(period)
	for {
		if sleepCtx(ctx, time.Until(next)); ctx.Err() != nil {
			return nil
		}
		now := time.Now()
		if err := e.Emit(now, rundir.MetricHeartbeatLateness, now.Sub(next).Seconds()); err != nil {
			return err
		}
		// Keep the schedule: a late beat does not move the next one; beats it overran are skipped.
		next = next.Add(period)
		for !next.After(now) {
			next = next.Add(period)
		}
	}
}
