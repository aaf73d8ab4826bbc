package workload

import (
	"context"
	"fmt"
	"os/exec"
	"sync"
	"time"

	"github.com/nodectl/nodectl/rundir"
)

// Churn starts short-lived processes continuously, parallel at a time, until ctx is done: the
// process creation and teardown that pod initialisation puts on a dense node. Each process runs
// argv; every second it records how many it started.
func Churn(ctx context.Context, argv []string, parallel int, e *Emitter) error {
	if len(argv) == 0 || parallel < 1 {
		return fmt.Errorf("churn: need a command and at least 1 in parallel (got %d)", parallel)
	}
	// One failing starter stops the others too: the deferred cancel runs before the wait.
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	var mu sync.Mutex
	started := 0
	errs := make(chan error, parallel)
	for range parallel {
		wg.Go(func() {
			for ctx.Err() == nil {
				if err := exec.Command(argv[0], argv[1:]...).Run(); err != nil && ctx.Err() == nil {
					errs <- fmt.Errorf("churn: running %s: %w", argv[0], err)
					return
				}
				mu.Lock()
				started++
				mu.Unlock()
			}
		})
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errs:
			return err
		case now := <-tick.C:
			mu.Lock()
			n := started
			started = 0
			mu.Unlock()
			if err := e.Emit(now, rundir.MetricChurnStarts, float64(n)); err != nil {
				return err
			}
		}
	}
}
