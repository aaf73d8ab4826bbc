package workload

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/nodectl/nodectl/rundir"
)

// VictimConfig configures the victim probe.
type VictimConfig struct {
	Dir        string        // where the probe writes its file; on the disk under test
	Interval   time.Duration // one iteration per interval
	WorkRounds int           // size of the fixed CPU work
	WriteBytes int64         // bytes written and fsynced per iteration
}

// DefaultWriteBytes is the probe's write + fsync per iteration, as in the seed reports.
const DefaultWriteBytes = 64 << 20

// DefaultWorkRounds is a fixed piece of CPU work of roughly 50 ms on one core of a current
// x86 machine; what matters is that it is the same in every phase.
const DefaultWorkRounds = 40_000_000

// Victim runs the probe until ctx is done: once per interval a fixed piece of CPU work, then a
// write of WriteBytes and an fsync, each timed by the probe itself.
func Victim(ctx context.Context, cfg VictimConfig, e *Emitter) error {
	if cfg.Interval <= 0 || cfg.WorkRounds <= 0 || cfg.WriteBytes <= 0 {
		return fmt.Errorf("victim: interval, work rounds and write size must be positive")
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return fmt.Errorf("victim: making %s: %w", cfg.Dir, err)
	}
	path := filepath.Join(cfg.Dir, "victim.dat")
	defer os.Remove(path)
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i*7 + 3) // not all zeros, in case the filesystem special-cases them
	}
	next := time.Now()
	for ctx.Err() == nil {
		start := time.Now()
		cpuWork(cfg.WorkRounds)
		worked := time.Now()
		wrote, synced, err := writeAndSync(ctx, path, buf, cfg.WriteBytes)
		if ctx.Err() != nil {
			return nil // stopped mid-iteration: a cut-short write is no measurement
		}
		if err != nil {
			return fmt.Errorf("victim: %w", err)
		}
		if err := e.Emit(worked, rundir.MetricProbeCPUWork, worked.Sub(start).Seconds()); err != nil {
			return err
		}
		end := worked.Add(wrote + synced)
		if err := e.Emit(end, rundir.MetricProbeWrite, wrote.Seconds()); err != nil {
			return err
		}
		if err := e.Emit(end, rundir.MetricProbeFsync, synced.Seconds()); err != nil {
			return err
		}
		next = next.Add(cfg.Interval)
		if now := time.Now(); next.Before(now) {
			next = now // an iteration overran: start the next one at once, do not burst
		}
		sleepCtx(ctx, time.Until(next))
	}
	return nil
}

// cpuSink keeps the compiler from removing the work; atomic because a cpu hog's threads all
// add to it.
var cpuSink atomic.Uint64

// cpuWork does a fixed amount of integer work with no memory traffic, so its duration reflects
// only the CPU time the task got.
func cpuWork(rounds int) {
	x := uint64(88172645463325252)
	for range rounds {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
	}
	cpuSink.Add(x)
}

// writeAndSync rewrites path with n bytes and fsyncs it, returning the two durations. It stops
// writing between chunks once ctx is done, so a stopping workload does not finish a large file.
func writeAndSync(ctx context.Context, path string, buf []byte, n int64) (time.Duration, time.Duration, error) {
	start := time.Now()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return 0, 0, fmt.Errorf("opening %s: %w", path, err)
	}
	defer f.Close()
	for left := n; left > 0 && ctx.Err() == nil; {
		chunk := buf[:min(int64(len(buf)), left)]
		if _, err := f.Write(chunk); err != nil {
			return 0, 0, fmt.Errorf("writing %s: %w", path, err)
		}
		left -= int64(len(chunk))
	}
	wrote := time.Since(start)
	if err := f.Sync(); err != nil {
		return 0, 0, fmt.Errorf("syncing %s: %w", path, err)
	}
	return wrote, time.Since(start) - wrote, nil
}
