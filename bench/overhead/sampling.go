//go:build linux

package main

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/record/sample"
)

// samplingCost is what the agent's cgroup sampler costs at n cgroups (each with a CPU and a
// memory limit, as a pod has), one Sample a second: for each of rounds, the share of a core
// of the rotating Sample the agent takes every interval, and of a SampleFull, which reads
// every file, timed alternately over the same span. The cgroups live under the nodectl
// parent and are removed, also on error.
func samplingCost(n, rounds int, span time.Duration) (rotating, full []float64, err error) {
	l, err := cgroup.Detect("/sys/fs/cgroup")
	if err != nil {
		return nil, nil, err
	}
	parent := fmt.Sprintf("%s/bench-sampling-%d-%08x", cgroup.Parent, os.Getpid(), rand.Uint32())
	defer func() { err = errors.Join(err, l.Remove(parent), l.Prune(cgroup.Parent)) }()
	paths := make([]string, n)
	for i := range paths {
		paths[i] = fmt.Sprintf("%s/c%04d", parent, i)
		if err := l.Create(paths[i], cgroup.Limits{CPUMilli: 500, MemoryBytes: 256 << 20}); err != nil {
			return nil, nil, err
		}
	}
	s := sample.NewCgroups(l, func() []string { return paths })
	if _, err := s.SampleFull(time.Now()); err != nil { // opens every file, as a running agent has
		return nil, nil, err
	}
	timed := func(f func(time.Time) error) (float64, error) {
		calls, t0 := 0, time.Now()
		for time.Since(t0) < span {
			if err := f(time.Now()); err != nil {
				return 0, err
			}
			calls++
		}
		return time.Since(t0).Seconds() / float64(calls), nil // seconds per Sample: a share of a core at one a second
	}
	rot := func(now time.Time) error { _, err := s.Sample(now); return err }
	all := func(now time.Time) error { _, err := s.SampleFull(now); return err }
	for range rounds {
		r, err := timed(rot)
		if err != nil {
			return nil, nil, err
		}
		f, err := timed(all)
		if err != nil {
			return nil, nil, err
		}
		rotating, full = append(rotating, r), append(full, f)
	}
	return rotating, full, nil
}
