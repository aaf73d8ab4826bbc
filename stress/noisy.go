package stress

import (
	"context"
	"errors"
	"time"

	"github.com/nodectl/nodectl/internal/quantity"

	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/stress/launch"
	"github.com/nodectl/nodectl/stress/workload"
)

// NoisyConfig configures `nodectl stress noisy`.
type NoisyConfig struct {
	Hogs           []HogSpec
	VictimCPUMilli int64         // 0 = unlimited
	VictimMemBytes int64         // 0 = unlimited
	Heartbeat      time.Duration // period of the heartbeat probe in the system cgroup; 0 = none
	Daemons        []string      // comm names of host daemons to follow (host/daemons); none when empty
	Baseline       time.Duration
	Duration       time.Duration

	// VictimWorkRounds and VictimWriteBytes size the probe's fixed work; 0 means
	// workload.DefaultWorkRounds and workload.DefaultWriteBytes.
	VictimWorkRounds int
	VictimWriteBytes int64

	// VictimCPURequestMilli sets the victim cgroup's CPU weight (see CPURequest); 0 = the
	// kernel's default.
	VictimCPURequestMilli int64

	// NodeMemBytes limits the run's cgroup, above every workload's, as a node's memory bounds its
	// pods: a neighbour that grows there presses the others into reclaim. 0 = unlimited.
	NodeMemBytes int64

	RunOptions
}

func isProbe(kind string) bool { return kind == rundir.KindVictim || kind == rundir.KindHeartbeat }

// Noisy runs the noisy-neighbour scenario on this host: the victim probe alone (baseline),
// then with the hogs (stress). It returns the run directory, which holds everything recorded;
// the caller analyzes it. Everything the run created on the host is removed before Noisy
// returns, also when ctx is cancelled (SIGINT, SIGTERM, SIGHUP) or a step fails.
func Noisy(ctx context.Context, cfg NoisyConfig) (dir string, err error) {
	return runOnHost(ctx, &cfg.RunOptions, rundir.ScenarioNoisy, cfg.check, func(host runHost) onHost {
		p := &localPlacement{runHost: host, nodeMemBytes: cfg.NodeMemBytes, daemons: cfg.Daemons, last: map[string]float64{}}
		return onHost{&p.runHost, func(ctx context.Context) error { return NoisyOn(ctx, cfg, p) }, p.undo}
	})
}

// check refuses phases of no length.
func (cfg NoisyConfig) check() error {
	if cfg.Baseline <= 0 || cfg.Duration <= 0 {
		return errors.New("the baseline and stress phases must last longer than zero")
	}
	return nil
}

// NoisyOn runs the noisy-neighbour scenario on p, written once for every placement: the probes
// (the victim, and the heartbeat where it can run) alone for the baseline, then the hogs
// beside them for the stress phase, each phase marked at its edges. cfg.Interval is the probes'
// period. The caller owns p: it cleans up and analyzes what p wrote.
func NoisyOn(ctx context.Context, cfg NoisyConfig, p Holder) error {
	if err := cfg.check(); err != nil {
		return err
	}
	if cfg.VictimWorkRounds == 0 {
		cfg.VictimWorkRounds = workload.DefaultWorkRounds
	}
	if cfg.VictimWriteBytes == 0 {
		cfg.VictimWriteBytes = workload.DefaultWriteBytes
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	ws, err := p.Place(ctx, planNoisy(cfg))
	if err != nil {
		return err
	}
	var probes, hogs []Planned
	for i, w := range ws {
		if !owned(w.Workload) {
			continue // a daemon the run follows: never started here
		}
		ws[i].Config = NoisyWorkload(cfg, w.Kind, w.Hog, w.Target, p.CPUs())
		if isProbe(w.Kind) {
			probes = append(probes, ws[i])
		} else {
			hogs = append(hogs, ws[i])
		}
	}
	if err := p.Start(ctx, probes...); err != nil {
		return err
	}
	// Let the probes finish one iteration before the baseline counts, so start-up is not in it.
	if err := p.Hold(ctx, "warm-up", cfg.Interval); err != nil {
		return err
	}
	if err := phase(ctx, p, rundir.PhaseBaseline, cfg.Baseline); err != nil {
		return err
	}
	// The stress phase starts once the hogs run: their start-up (a sandbox's boot, a pod's
	// scheduling) is not in it.
	if err := p.Start(ctx, hogs...); err != nil {
		return err
	}
	if err := phase(ctx, p, rundir.PhaseStress, cfg.Duration); err != nil {
		return err
	}
	return p.Finish(ctx)
}

// phase marks a phase's start, holds it for d and marks its end.
func phase(ctx context.Context, p Holder, name string, d time.Duration) error {
	if err := p.Mark(name, rundir.EventStart); err != nil {
		return err
	}
	if err := p.Hold(ctx, name, d); err != nil {
		return err
	}
	return p.Mark(name, rundir.EventEnd)
}

// planNoisy names the victim, the heartbeat and every hog, with their limits; a placement gives
// them cgroups and directories.
func planNoisy(cfg NoisyConfig) []Planned {
	victim := Planned{Workload: rundir.Workload{Name: rundir.WorkloadVictim, Kind: rundir.KindVictim, CPU: quantity.FormatCPU(cfg.VictimCPUMilli),
		CPURequest: quantity.FormatCPU(cfg.VictimCPURequestMilli), Memory: quantity.FormatSize(cfg.VictimMemBytes)},
		Limits: cgroup.Limits{CPUMilli: cfg.VictimCPUMilli, CPURequestMilli: cfg.VictimCPURequestMilli, MemoryBytes: cfg.VictimMemBytes}}
	out := []Planned{victim}
	if cfg.Heartbeat > 0 {
		out = append(out, Planned{Workload: rundir.Workload{Name: rundir.WorkloadHeartbeat, Kind: rundir.KindHeartbeat, Period: rundir.Duration(cfg.Heartbeat)}})
	}
	seen := map[string]int{}
	for _, h := range cfg.Hogs {
		for range h.Count {
			i := seen[h.Kind]
			seen[h.Kind]++
			out = append(out, Planned{Workload: rundir.Workload{Name: rundir.HogName(h.Kind, i), Kind: h.Kind,
				CPU: quantity.FormatCPU(h.CPUMilli), CPURequest: quantity.FormatCPU(h.CPURequestMilli), Memory: quantity.FormatSize(h.MemBytes)},
				Limits: cgroup.Limits{CPUMilli: h.CPUMilli, CPURequestMilli: h.CPURequestMilli, MemoryBytes: h.MemBytes}, Hog: h})
		}
	}
	return out
}

// sentryReserve is what a gVisor sandbox's own memory takes of its cgroup's limit besides the
// application's: the Sentry and the gofer. Measured here: ~20 MiB steady, more while booting.
const sentryReserve = 64 << 20

// hogReserve is what a memory hog's own process takes of its cgroup's limit besides what it
// holds: the Go runtime and the packages' init, page tables and kernel memory. Measured: a hog
// holding 60 MiB under 64 MiB was OOM-killed at 63.9 MiB of anonymous memory (2026-12-02).
const hogReserve = 12 << 20

// memoryHogBytes is what a memory hog with limit size holds: a sixteenth under the limit, at
// least hogReserve, and under runsc also the Sentry's share, since the sandbox's cgroup holds
// the Sentry too.
func memoryHogBytes(size int64, rt launch.Runtime) int64 {
	n := size - max(size/16, hogReserve)
	if rt == launch.RuntimeRunsc {
		n -= sentryReserve
	}
	return n
}

// NoisyWorkload is the body of a noisy run's workload of kind (its hog spec, for a hog),
// writing below dir, on a node of ncpu CPUs; nil for an unknown kind.
func NoisyWorkload(cfg NoisyConfig, kind string, spec HogSpec, dir string, ncpu int) workload.Config {
	switch kind {
	case rundir.KindVictim:
		return &workload.VictimConfig{Dir: dir, Interval: cfg.Interval, WorkRounds: cfg.VictimWorkRounds, WriteBytes: cfg.VictimWriteBytes}
	case rundir.KindHeartbeat:
		return &workload.HeartbeatConfig{Period: cfg.Heartbeat}
	case rundir.KindCPU:
		return &workload.CPUHogConfig{Threads: threadsFor(spec, ncpu)}
	case rundir.KindDisk:
		return &workload.DiskHogConfig{Dir: dir, FileBytes: workload.DefaultDiskHogFileBytes}
	case rundir.KindFsync:
		return &workload.FsyncHogConfig{Dir: dir, BlockBytes: workload.DefaultFsyncHogBlockBytes}
	case rundir.KindChurn:
		return &workload.ChurnConfig{Parallel: threadsFor(spec, ncpu)}
	case rundir.KindMemory:
		// Stay under the limit: the hog is to hold memory, not to be OOM-killed.
		return &workload.MemoryHogConfig{Bytes: memoryHogBytes(spec.MemBytes, cfg.Runtime)}
	}
	return nil
}
