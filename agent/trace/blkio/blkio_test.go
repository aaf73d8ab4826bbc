//go:build linux

package blkio

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nodectl/nodectl/agent/hist"
	"github.com/nodectl/nodectl/agent/trace/internal/cgtest"
)

// Helper modes of the test binary, selected by env: NODECTL_BLKIO_TEST_MODE names the mode,
// NODECTL_BLKIO_TEST_FILE the file to write.
const (
	modeEnv = "NODECTL_BLKIO_TEST_MODE"
	fileEnv = "NODECTL_BLKIO_TEST_FILE"
)

// The writer overwrites writeBytes in chunks small enough for one request each.
const (
	writeBytes = 16 << 20
	chunk      = 256 << 10
)

// timesSuffix names, beside the written file, the writer's timing of each chunk (write and
// sync) in nanoseconds by its own clock.
const timesSuffix = ".times.json"

func TestMain(m *testing.M) {
	if mode := os.Getenv(modeEnv); mode != "" {
		if err := helper(mode, os.Getenv(fileEnv)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// helper overwrites path, which holds writeBytes already on disk, chunk by chunk: with
// O_DIRECT ("direct"), or through the page cache with an fsync after each chunk ("buffered"),
// so that the flusher, which would charge root, has no time to take the pages first. Blocks
// already written need no allocation, so the writer's requests are its data and little
// metadata. "idle" does no I/O.
func helper(mode, path string) error {
	flags := os.O_WRONLY
	switch mode {
	case "idle":
		return nil
	case "direct":
		flags |= unix.O_DIRECT
	case "buffered":
	default:
		return fmt.Errorf("unknown helper mode %q", mode)
	}
	f, err := os.OpenFile(path, flags, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	// O_DIRECT wants an aligned buffer: mmap gives a page-aligned one.
	buf, err := unix.Mmap(-1, 0, chunk, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return fmt.Errorf("mapping buffer: %w", err)
	}
	defer unix.Munmap(buf)
	for i := range buf {
		buf[i] = byte(i)
	}
	took := make([]int64, 0, writeBytes/chunk)
	for range writeBytes / chunk {
		start := time.Now()
		if _, err := f.Write(buf); err != nil {
			return fmt.Errorf("writing %s: %w", path, err)
		}
		if mode == "buffered" {
			if err := f.Sync(); err != nil {
				return fmt.Errorf("syncing %s: %w", path, err)
			}
		}
		took = append(took, time.Since(start).Nanoseconds())
	}
	b, err := json.Marshal(took)
	if err != nil {
		return err
	}
	return os.WriteFile(path+timesSuffix, b, 0o644)
}

func TestAttribution(t *testing.T) {
	cgtest.RequireRoot(t)
	for _, mode := range []string{"direct", "buffered"} {
		t.Run(mode, func(t *testing.T) { testAttribution(t, mode) })
	}
}

// testAttribution writes from one cgroup while another does nothing, and checks that the
// writes are charged to the writer on the disk that holds the file.
func testAttribution(t *testing.T, mode string) {
	gs := cgtest.Make(t, "blkio", "writer", "idle")
	writer, idle := gs["writer"], gs["idle"]

	const capacity = 256
	tr, err := New(Config{CgroupV1: cgtest.V1(), MaxEntries: capacity}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := tr.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})

	dir, disk := cgtest.DiskDir(t)
	file := filepath.Join(dir, "data")
	// Written from the test's own cgroup, so that the writer has blocks to overwrite.
	if err := writeSynced(file, writeBytes); err != nil {
		t.Fatalf("preparing %s: %v", file, err)
	}
	for g, m := range map[*cgtest.Group]string{writer: mode, idle: "idle"} {
		cmd := g.Start(t, -1, "env", modeEnv+"="+m, fileEnv+"="+file, os.Args[0])
		if err := cmd.Wait(); err != nil {
			t.Fatalf("helper %s: %v", m, err)
		}
	}

	b, err := os.ReadFile(file + timesSuffix)
	if err != nil {
		t.Fatalf("reading the writer's times: %v", err)
	}
	var took []int64
	if err := json.Unmarshal(b, &took); err != nil {
		t.Fatalf("parsing the writer's times: %v", err)
	}

	st, err := tr.Read()
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	for k, c := range st.IO {
		if k.Cgroup == writer.ID || k.Cgroup == idle.ID || k.Cgroup == 1 {
			t.Logf("%+v: %+v service %+v", k, c, st.Service[k])
		}
	}
	w := Key{Cgroup: writer.ID, Dev: disk, Op: "write"}
	if c := st.IO[w]; c.Bytes < writeBytes || c.Requests == 0 {
		t.Errorf("writer charged %+v on %s, want at least %d bytes in at least one request", c, disk, writeBytes)
	}
	if n := st.Service[w].Count; n != st.IO[w].Requests {
		t.Errorf("writer service-time count = %d, want its %d requests", n, st.IO[w].Requests)
	}
	if n := st.Queue[w].Count; n != st.IO[w].Requests {
		t.Errorf("writer queue-time count = %d, want its %d requests", n, st.IO[w].Requests)
	}
	cgtest.CheckHist(t, "writer service time", st.Service[w])
	cgtest.CheckHist(t, "writer queue time", st.Queue[w])
	checkAgainstWriter(t, st.Queue[w], st.Service[w], took)
	for k, c := range st.IO {
		// The idle helper may page in its binary: allow a little reading, no writing.
		if k.Cgroup == idle.ID && (k.Op == "write" || c.Bytes > chunk) {
			t.Errorf("idle cgroup charged %+v for %+v", c, k)
		}
	}
	for reason, n := range st.Drops {
		if n != 0 {
			t.Errorf("drops %s = %d, want 0", reason, n)
		}
	}
	// Keys of partitions of one disk are merged: the map holds at least as many.
	if low := float64(len(st.IO)) / capacity; st.Fill < low || st.Fill > 1 {
		t.Errorf("fill %g, want between %g and 1", st.Fill, low)
	}

	writer.Remove(t)
	idle.Remove(t)
	gone := map[uint64]bool{writer.ID: true, idle.ID: true}
	n, err := tr.Forget(func(id uint64) bool { return !gone[id] })
	if err != nil {
		t.Fatalf("Forget: %v", err)
	}
	if n < 1 {
		t.Errorf("Forget deleted %d entries, want at least 1", n)
	}
	st, err = tr.Read()
	if err != nil {
		t.Fatalf("Read after Forget: %v", err)
	}
	for k := range st.IO {
		if gone[k.Cgroup] {
			t.Errorf("entry of a removed cgroup remains: %+v", k)
		}
	}
}

// writeSynced writes n bytes to a new file at path and syncs it.
func writeSynced(path string, n int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := f.Write(make([]byte, n)); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// clockSlack is how much the tracer's and the writer's reads of CLOCK_MONOTONIC may disagree.
const clockSlack = time.Microsecond

// checkAgainstWriter compares the writer's requests as traced with the writer's own timing of
// each chunk, took. A chunk's requests are inserted, issued and completed while its write (or
// its sync) waits for them, and each chunk makes at least one, so:
//   - no request's queue or service time exceeds the longest chunk;
//   - the queue and service times of a chunk's n requests add up to at most n times the
//     chunk, hence over the run to at most the chunks' total plus, for the requests beyond
//     one per chunk, the longest chunk each.
//
// The rest of a chunk's time is the writer's own (copying, submitting, waking up), which a
// busy machine stretches, so there is no lower bound beyond the requests being there.
func checkAgainstWriter(t *testing.T, queue, service hist.Log2, took []int64) {
	t.Helper()
	chunks, requests := uint64(len(took)), service.Count
	if chunks != writeBytes/chunk {
		t.Fatalf("writer timed %d chunks, want %d", chunks, writeBytes/chunk)
	}
	if requests < chunks {
		t.Errorf("writer made %d requests for %d chunks, want at least one each", requests, chunks)
		return
	}
	var sum, longest int64
	for _, d := range took {
		sum += d
		longest = max(longest, d)
	}
	longest += clockSlack.Nanoseconds()
	for name, h := range map[string]hist.Log2{"queue": queue, "service": service} {
		if n := len(h.Buckets); n > 0 && cgtest.BucketLow(n-1) > float64(longest) {
			t.Errorf("a request's %s time reached %.0fns, beyond the writer's longest chunk of %dns", name, cgtest.BucketLow(n-1), longest)
		}
	}
	bound := sum + int64(requests-chunks)*longest + int64(requests)*clockSlack.Nanoseconds()
	traced := queue.SumNs + service.SumNs
	t.Logf("queue+service %dns over %d requests; writer %dns over %d chunks (longest %dns); bound %dns, ratio to the writer %.3f",
		traced, requests, sum, chunks, longest, bound, float64(traced)/float64(sum))
	if int64(traced) > bound {
		t.Errorf("queue+service time %dns exceeds the %dns the writer's chunks allow", traced, bound)
	}
}

func TestClosedTracer(t *testing.T) {
	cgtest.RequireRoot(t)
	tr, err := New(Config{CgroupV1: cgtest.V1(), MaxEntries: 16}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	cgtest.CheckClose(t, tr)
}
