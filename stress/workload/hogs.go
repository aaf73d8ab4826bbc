package workload

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"
)

// CPUHog keeps threads busy until ctx is done.
func CPUHog(ctx context.Context, threads int) error {
	if threads < 1 {
		return fmt.Errorf("cpu hog: %d threads: want at least 1", threads)
	}
	runtime.GOMAXPROCS(max(runtime.GOMAXPROCS(0), threads+1))
	var wg sync.WaitGroup
	for range threads {
		wg.Go(func() {
			runtime.LockOSThread()
			for ctx.Err() == nil {
				cpuWork(1_000_000)
			}
		})
	}
	wg.Wait()
	return nil
}

// DiskHogConfig configures a disk hog: large sequential writes, each file fsynced once at its
// end, as `dd bs=1M count=N conv=fsync` does, in a loop.
type DiskHogConfig struct {
	Dir       string
	FileBytes int64
}

// DefaultDiskHogFileBytes is the size of each disk hog file, written then fsynced, as `dd bs=1M
// count=512 conv=fsync` does in the seed report.
const DefaultDiskHogFileBytes = 512 << 20

// DiskHog writes and fsyncs FileBytes files in Dir until ctx is done.
func DiskHog(ctx context.Context, cfg DiskHogConfig) error {
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return fmt.Errorf("disk hog: making %s: %w", cfg.Dir, err)
	}
	path := filepath.Join(cfg.Dir, "disk-hog.dat")
	defer os.Remove(path)
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i*13 + 1)
	}
	for ctx.Err() == nil {
		if _, _, err := writeAndSync(ctx, path, buf, cfg.FileBytes); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("disk hog: %w", err)
		}
	}
	return nil
}

// FsyncHog writes a small block and fsyncs it, in a loop, until ctx is done.
func FsyncHog(ctx context.Context, dir string, blockBytes int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("fsync hog: making %s: %w", dir, err)
	}
	path := filepath.Join(dir, "fsync-hog.dat")
	defer os.Remove(path)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("fsync hog: %w", err)
	}
	defer f.Close()
	buf := make([]byte, blockBytes)
	var written int64
	for ctx.Err() == nil {
		if _, err := f.Write(buf); err != nil {
			return fmt.Errorf("fsync hog: writing: %w", err)
		}
		if err := f.Sync(); err != nil {
			return fmt.Errorf("fsync hog: fsync: %w", err)
		}
		// Start over now and then, so the file stays small.
		if written += int64(blockBytes); written >= 64<<20 {
			if err := f.Truncate(0); err != nil {
				return fmt.Errorf("fsync hog: truncating: %w", err)
			}
			written = 0
		}
	}
	return nil
}

// MemoryHog allocates up to size bytes and keeps touching every page, so the memory stays in
// its working set, until ctx is done.
func MemoryHog(ctx context.Context, size int64) error {
	const chunk = 16 << 20
	const page = 4096
	var chunks [][]byte
	for have := int64(0); have < size && ctx.Err() == nil; have += chunk {
		c := make([]byte, min(chunk, size-have))
		for i := 0; i < len(c); i += page {
			c[i] = 1
		}
		chunks = append(chunks, c)
	}
	for ctx.Err() == nil {
		for _, c := range chunks {
			for i := 0; i < len(c); i += page {
				c[i]++
			}
			if ctx.Err() != nil {
				break
			}
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}
	runtime.KeepAlive(chunks)
	return nil
}
