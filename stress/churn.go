package stress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/stress/launch"
	"github.com/nodectl/nodectl/stress/workload"
)

// sandboxChurn is the churn hog under a container runtime: it starts and stops short-lived
// sandboxes, parallel at a time, until stopped, as pod start-up churn does on a dense node.
// Each sandbox gets a cgroup of its own below the hog's (as a pod's containers sit below the
// pod's), so the hog's limits bound them all and the analyzer charges them to the hog. Every
// second it records how many sandboxes it started.
type sandboxChurn struct {
	name      string // the hog's workload name
	cgroup    string // the hog's cgroup
	parallel  int
	launcher  *launch.Launcher
	layout    *cgroup.Layout
	log       io.Writer
	onMeasure func(string, workload.Measurement)
	resolver  *cgroup.Resolver // the tracer's, told of each sandbox's cgroup; nil untraced
}

// churnBootTimeout bounds one sandbox's life: it only boots and exits.
const churnBootTimeout = 60 * time.Second

func (c *sandboxChurn) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		seq     atomic.Int64
		started atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		firstEr error
	)
	for range c.parallel {
		wg.Go(func() {
			for ctx.Err() == nil {
				if err := c.once(ctx, seq.Add(1)-1); err != nil {
					if ctx.Err() == nil {
						errOnce.Do(func() { firstEr = err })
					}
					cancel()
					return
				}
				started.Add(1)
			}
		})
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return firstEr
		case now := <-tick.C:
			c.onMeasure(c.name, workload.Measurement{T: now, Metric: rundir.MetricChurnStarts, Value: float64(started.Swap(0))})
		}
	}
}

// once starts one sandbox that exits as soon as it has booted, waits for it, and removes its
// cgroup.
func (c *sandboxChurn) once(ctx context.Context, i int64) (err error) {
	name := fmt.Sprintf("%s-%d", c.name, i)
	cg := fmt.Sprintf("%s/sandbox-%d", c.cgroup, i)
	if err := c.layout.Create(cg, cgroup.Limits{}); err != nil {
		return fmt.Errorf("churn: %w", err)
	}
	if c.resolver != nil {
		// The cgroup may be gone before the tracer's next collection.
		c.resolver.Note(cg)
	}
	defer func() {
		if rerr := c.layout.Remove(cg); rerr != nil {
			err = errors.Join(err, fmt.Errorf("churn: %w", rerr))
		}
	}()
	// The runtime itself runs in the hog's cgroup: creating sandboxes is the load.
	p, err := c.launcher.Start(launch.Spec{Name: name, Cgroup: cg, RuntimeCgroup: c.cgroup, Args: []string{"version"}, Log: c.log}, nil)
	if err != nil {
		return fmt.Errorf("churn: %w", err)
	}
	select {
	case <-p.Done():
		if err := p.Err(); err != nil && ctx.Err() == nil {
			return fmt.Errorf("churn: sandbox %s: %w", name, err)
		}
	case <-ctx.Done():
		p.Stop(5 * time.Second)
	case <-time.After(churnBootTimeout):
		p.Stop(5 * time.Second)
		return fmt.Errorf("churn: sandbox %s did not exit within %s", name, churnBootTimeout)
	}
	return nil
}
