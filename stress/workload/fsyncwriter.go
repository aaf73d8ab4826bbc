package workload

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"github.com/nodectl/nodectl/rundir"
)

// MetricStormReady is what an fsync writer emits when it waits for a go: the driver counts these
// to release every writer at once, and does not record them.
const MetricStormReady = "fsync_storm_ready"

// Recorded says whether a run records m: a reading, not a line that only tells the driver
// where a workload is (MetricStormReady).
func Recorded(m Measurement) bool { return m.Metric != MetricStormReady }

// StormGo is the line the driver sends each writer to start one storm.
const StormGo = "go\n"

// stormChunk is the size of each write(2): large enough that the syscalls cost nothing next to
// the copy, small enough that a stop lands between two of them.
const stormChunk = 1 << 20

// FsyncWriterConfig configures one writer of an fsync storm.
type FsyncWriterConfig struct {
	Dir   string // where the writer's file goes; on the device under test
	Bytes int64  // written per storm, then fsynced
}

// FsyncWriter is one writer of an fsync storm, as a sandbox writing its snapshot: for each go
// line read from in, it writes Bytes to a fresh file in chunks, fsyncs it, and emits the time
// to durable (first write to the fsync's return), split into the write and the fsync. Between
// storms it removes the file and emits MetricStormReady, so that the driver can release all
// writers together. It returns at the end of in or when ctx is done.
func FsyncWriter(ctx context.Context, cfg FsyncWriterConfig, in io.Reader, e *Emitter) error {
	if cfg.Bytes < 1 {
		return fmt.Errorf("fsync-writer: %d bytes: want at least 1", cfg.Bytes)
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return fmt.Errorf("fsync-writer: making %s: %w", cfg.Dir, err)
	}
	path := filepath.Join(cfg.Dir, "snapshot.dat")
	defer os.Remove(path)
	// Random data, as a snapshot's: nothing below the page cache can shortcut it.
	buf := make([]byte, stormChunk)
	rng := rand.NewChaCha8([32]byte{byte(os.Getpid()), byte(os.Getpid() >> 8)})
	_, _ = rng.Read(buf)

	// The read cannot be interrupted, so it runs aside and a stop does not wait for it.
	lines := make(chan error)
	go func() {
		r := bufio.NewReader(in)
		for {
			_, err := r.ReadString('\n')
			select {
			case lines <- err:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	for {
		if err := e.Emit(time.Now(), MetricStormReady, 1); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case err := <-lines:
			if errors.Is(err, io.EOF) {
				return nil // the driver is done with the storms
			}
			if err != nil {
				return fmt.Errorf("fsync-writer: reading the go: %w", err)
			}
		}
		start := time.Now()
		wrote, synced, err := writeAndSync(ctx, path, buf, cfg.Bytes)
		if ctx.Err() != nil {
			return nil // stopped mid-storm: a cut-short write is no measurement
		}
		if err != nil {
			return fmt.Errorf("fsync-writer: %w", err)
		}
		// One time for all three, the fsync's return: start is end minus durable.
		end := start.Add(wrote + synced)
		for _, m := range []struct {
			metric string
			d      time.Duration
		}{{rundir.MetricStormWrite, wrote}, {rundir.MetricStormFsync, synced}, {rundir.MetricStormDurable, wrote + synced}} {
			if err := e.Emit(end, m.metric, m.d.Seconds()); err != nil {
				return err
			}
		}
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("fsync-writer: %w", err)
		}
	}
}
