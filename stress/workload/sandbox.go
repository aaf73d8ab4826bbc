package workload

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nodectl/nodectl/rundir"
)

// SandboxConfig configures a sandbox stand-in: a headless browser as a node sees it.
type SandboxConfig struct {
	HeapBytes int64   // anonymous heap, allocated and touched at start: the steady RSS
	HotShare  float64 // share of the heap each activity burst touches (its working set); the rest stays cold
	// Binary is the shared file-backed "binary" every sandbox maps and executes from: page
	// cache shared by all sandboxes, which reclaim can evict and the next burst re-reads.
	Binary      string
	BinaryShare float64       // share of the binary each burst reads
	Activity    time.Duration // time between activity bursts
	BurstRounds int           // CPU work of a burst (rounds of cpuWork)
	Tick        time.Duration // the event loop's tick; its lateness is recorded
}

// Defaults of a sandbox stand-in: ~200 MiB of steady heap, as the seed's browser sandboxes
// (200-250 MiB RSS), a quarter of it hot, bursts every 2 s of ~1 ms of CPU so that hundreds of
// sandboxes fit on two CPUs.
const (
	DefaultSandboxHeap        = 200 << 20
	DefaultSandboxHotShare    = 0.25
	DefaultSandboxBinaryShare = 0.5
	DefaultSandboxActivity    = 2 * time.Second
	DefaultSandboxBurstRounds = 500_000
	DefaultSandboxTick        = time.Second
)

const pageSize = 4096

// Sandbox allocates its heap and maps its binary, touching all of both, emits how long that took
// (its ready heartbeat), then runs an event loop until ctx is done: every tick it records how late
// the tick woke, and every Activity it bursts (touches the hot share of the heap and a share of
// the binary, does some CPU work) and records how long the burst took. Under memory pressure
// the heap's cold pages can go to swap and the binary's pages out of the page cache: the bursts
// fault them back, and the ticks run late.
func Sandbox(ctx context.Context, cfg SandboxConfig, e *Emitter) error {
	if cfg.HeapBytes < pageSize || cfg.Activity <= 0 || cfg.Tick <= 0 || cfg.BurstRounds < 0 {
		return fmt.Errorf("sandbox: heap (at least a page), activity and tick must be positive")
	}
	if cfg.HotShare <= 0 || cfg.HotShare > 1 || cfg.BinaryShare < 0 || cfg.BinaryShare > 1 {
		return fmt.Errorf("sandbox: hot share must be in (0, 1] and binary share in [0, 1]")
	}
	start := time.Now()
	// The heap is mmapped, not Go-allocated: the garbage collector neither scans nor frees it,
	// so the RSS stays what the flag says.
	heap, err := unix.Mmap(-1, 0, int(cfg.HeapBytes), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("sandbox: allocating %d bytes of heap: %w", cfg.HeapBytes, err)
	}
	defer unix.Munmap(heap)
	for i := 0; i < len(heap); i += pageSize {
		heap[i] = byte(i>>12) | 1 // non-zero: a zero page could be deduplicated
	}
	var bin []byte
	if cfg.Binary != "" {
		if bin, err = mapBinary(cfg.Binary); err != nil {
			return err
		}
		defer unix.Munmap(bin)
		readPages(bin, 0, len(bin))
	}
	if ctx.Err() != nil {
		return nil
	}
	now := time.Now()
	if err := e.Emit(now, rundir.MetricSandboxReady, now.Sub(start).Seconds()); err != nil {
		return err
	}

	hot := int(float64(len(heap))*cfg.HotShare) &^ (pageSize - 1)
	binPart := int(float64(len(bin))*cfg.BinaryShare) &^ (pageSize - 1)
	binOff := 0
	nextTick, nextBurst := now.Add(cfg.Tick), now.Add(cfg.Activity)
	for {
		wake := nextTick
		if nextBurst.Before(wake) {
			wake = nextBurst
		}
		if sleepCtx(ctx, time.Until(wake)); ctx.Err() != nil {
			return nil
		}
		now := time.Now()
		if !now.Before(nextTick) {
			if err := e.Emit(now, rundir.MetricSandboxTickLateness, now.Sub(nextTick).Seconds()); err != nil {
				return err
			}
			nextTick = skipPast(nextTick, cfg.Tick, now)
		}
		if !now.Before(nextBurst) {
			b := time.Now()
			for i := 0; i < hot; i += pageSize {
				heap[i]++
			}
			// The binary's part moves on each burst, as code paths change: over a few bursts the
			// whole binary is read, so evicted pages come back as refaults.
			if binPart > 0 {
				readPages(bin, binOff, binPart)
				binOff = (binOff + binPart) % len(bin)
			}
			cpuWork(cfg.BurstRounds)
			end := time.Now()
			if err := e.Emit(end, rundir.MetricSandboxActivity, end.Sub(b).Seconds()); err != nil {
				return err
			}
			nextBurst = skipPast(nextBurst, cfg.Activity, end)
		}
	}
}

// skipPast moves a schedule on by period until it is after now: a late tick does not move the
// next one, and ticks it overran are skipped.
func skipPast(next time.Time, period time.Duration, now time.Time) time.Time {
	for next = next.Add(period); !next.After(now); next = next.Add(period) {
	}
	return next
}

// mapBinary maps the shared binary read-only and executable, as a program's text is mapped
// (the kernel keeps executable file pages active a little longer under reclaim); where the
// filesystem forbids executable mappings, readable is enough.
func mapBinary(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("sandbox: opening the binary: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	if st.Size() < pageSize {
		return nil, fmt.Errorf("sandbox: the binary %s has %d bytes, want at least a page", path, st.Size())
	}
	b, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ|unix.PROT_EXEC, unix.MAP_SHARED)
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
		b, err = unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox: mapping the binary %s: %w", path, err)
	}
	return b, nil
}

// readPages reads one byte of every page of b[off:off+n], wrapping around.
func readPages(b []byte, off, n int) {
	var sum byte
	for i := 0; i < n; i += pageSize {
		sum += b[(off+i)%len(b)]
	}
	cpuSink.Add(uint64(sum))
}
