//go:build linux

package blkio

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/nodectl/nodectl/record/trace/internal/cgtest"
	"github.com/nodectl/nodectl/rundir/hist"
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

// concurrentWriters is how many chunks the "concurrent" helper writes at once: many more 256
// KiB requests than a virtio ring without indirect descriptors holds, so that the driver hands
// requests back (requeues them) and they are issued again: some 30 times a run on this VM, as
// tracefs's block_rq_requeue showed.
const concurrentWriters = 32

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
// metadata. "concurrent" writes the chunks with O_DIRECT, concurrentWriters at a time, and
// times nothing. "idle" does no I/O.
func helper(mode, path string) error {
	flags := os.O_WRONLY
	switch mode {
	case "idle":
		return nil
	case "direct", "concurrent":
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
	if mode == "concurrent" {
		return writeConcurrently(f, buf)
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

// writeConcurrently writes buf over each chunk of f, concurrentWriters chunks at a time.
func writeConcurrently(f *os.File, buf []byte) error {
	var wg sync.WaitGroup
	errs := make([]error, writeBytes/chunk)
	slots := make(chan struct{}, concurrentWriters)
	for i := range errs {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			if _, err := f.WriteAt(buf, int64(i)*chunk); err != nil {
				errs[i] = fmt.Errorf("writing %s: %w", f.Name(), err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func TestAttribution(t *testing.T) {
	cgtest.RequireRoot(t)
	for _, mode := range []string{"direct", "buffered"} {
		t.Run(mode, func(t *testing.T) { testAttribution(t, mode) })
	}
}

// capacity is the io map's in the tests.
const capacity = 256

// newTracer starts a tracer, closed when the test ends, with its sweep, which this kernel
// (6.18) has.
func newTracer(t *testing.T) *Tracer {
	t.Helper()
	tr, err := New(Config{CgroupV1: cgtest.V1(), MaxEntries: capacity}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := tr.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	if tr.sweep == nil {
		t.Fatal("New loaded no sweep")
	}
	return tr
}

// prepare writes the file the writer overwrites, from the test's own cgroup, so that the
// writer has blocks to overwrite, and returns its path and disk.
func prepare(t *testing.T) (file, disk string) {
	t.Helper()
	dir, disk := cgtest.DiskDir(t)
	file = filepath.Join(dir, "data")
	if err := writeSynced(file, writeBytes); err != nil {
		t.Fatalf("preparing %s: %v", file, err)
	}
	return file, disk
}

// runHelper runs this binary's helper mode in g on file and waits for it.
func runHelper(t *testing.T, g *cgtest.Group, mode, file string) {
	t.Helper()
	cmd := g.Start(t, -1, "env", modeEnv+"="+mode, fileEnv+"="+file, os.Args[0])
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper %s: %v", mode, err)
	}
}

// testAttribution writes from one cgroup while another does nothing, and checks that the
// writes are charged to the writer on the disk that holds the file.
func testAttribution(t *testing.T, mode string) {
	gs := cgtest.Make(t, "blkio", "writer", "idle")
	writer, idle := gs["writer"], gs["idle"]
	tr := newTracer(t)
	file, disk := prepare(t)
	runHelper(t, writer, mode, file)
	runHelper(t, idle, "idle", file)

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
	checkCounts(t, st, w)
	checkAgainstWriter(t, st.Queue[w], st.Service[w], st.IO[w].Requests, took)
	for k, c := range st.IO {
		// The idle helper may page in its binary: allow a little reading, no writing.
		if k.Cgroup == idle.ID && (k.Op == "write" || c.Bytes > chunk) {
			t.Errorf("idle cgroup charged %+v for %+v", c, k)
		}
	}
	checkDrops(t, st)
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

// checkCounts checks that w's requests are all counted once, each in both histograms or as
// untimed, and that its histograms are consistent.
func checkCounts(t *testing.T, st Stats, w Key) {
	t.Helper()
	c := st.IO[w]
	if c.Untimed > c.Requests {
		t.Errorf("%+v: %d untimed requests of %d", w, c.Untimed, c.Requests)
	}
	if n := st.Service[w].Count; n != c.Requests-c.Untimed {
		t.Errorf("%+v: service-time count = %d, want its %d requests less %d untimed", w, n, c.Requests, c.Untimed)
	}
	if n := st.Queue[w].Count; n != c.Requests-c.Untimed {
		t.Errorf("%+v: queue-time count = %d, want its %d requests less %d untimed", w, n, c.Requests, c.Untimed)
	}
	cgtest.CheckHist(t, fmt.Sprintf("%+v service time", w), st.Service[w])
	cgtest.CheckHist(t, fmt.Sprintf("%+v queue time", w), st.Queue[w])
}

// unseen are the drop reasons of requests that the kernel did not run a program for at their
// issue or completion. This VM hardly runs any in the softirqs on top of the sandbox agent's
// threads (see struct rq_key in bpf/blkio.bpf.c), so a writer's request now and then ends
// unseen: it is charged, untimed, and counted here.
var unseen = []string{"completion_unseen", "issue_unseen"}

// checkDrops checks that nothing was dropped for want of room, and that every untimed request
// was counted as unseen.
func checkDrops(t *testing.T, st Stats) {
	t.Helper()
	var missed, untimed uint64
	for reason, n := range st.Drops {
		switch {
		case slices.Contains(unseen, reason):
			missed += n
			if n > 0 {
				t.Logf("drops %s = %d", reason, n)
			}
		case n != 0:
			t.Errorf("drops %s = %d, want 0", reason, n)
		}
	}
	for _, c := range st.IO {
		untimed += c.Untimed
	}
	if untimed > missed {
		t.Errorf("%d untimed requests, but only %d unseen issues and completions", untimed, missed)
	}
}

// TestUnseenCompletions hides every completion from the tracer, as the kernel does with some
// (see struct rq_key in bpf/blkio.bpf.c), by detaching rq_complete. The writer's requests end
// unseen; Read must still charge each byte and request once, untimed, and count them as
// unseen completions, and ReadPart the same at its sweep, once in sweepEvery calls.
func TestUnseenCompletions(t *testing.T) {
	cgtest.RequireRoot(t)
	gs := cgtest.Make(t, "blkio", "writer")
	writer := gs["writer"]
	tr := newTracer(t)
	file, disk := prepare(t)
	detach(t, tr, tr.objs.RqComplete)
	runHelper(t, writer, "direct", file)
	w := Key{Cgroup: writer.ID, Dev: disk, Op: "write"}

	// An interval's read sweeps once in sweepEvery: until then the requests stay in flight.
	for i := 1; i < sweepEvery; i++ {
		st, err := tr.ReadPart()
		if err != nil {
			t.Fatalf("ReadPart: %v", err)
		}
		if c := st.IO[w]; c.Bytes != 0 {
			t.Fatalf("interval %d of %d charged the writer %+v before the sweep", i, sweepEvery, c)
		}
	}
	st, err := tr.ReadPart()
	if err != nil {
		t.Fatalf("ReadPart: %v", err)
	}
	if part := st.IO[w]; part.Bytes != writeBytes {
		t.Errorf("the sweep of interval %d charged the writer %+v, want %d bytes", sweepEvery, part, writeBytes)
	}

	st, err = tr.Read()
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	c := st.IO[w]
	t.Logf("%+v: %+v; drops %v", w, c, st.Drops)
	if c.Bytes != writeBytes || c.Requests < writeBytes/chunk || c.Untimed != c.Requests {
		t.Errorf("writer charged %+v on %s, want %d bytes in at least %d requests, all untimed", c, disk, writeBytes, writeBytes/chunk)
	}
	checkCounts(t, st, w)
	if n := st.Drops["completion_unseen"]; n < c.Requests {
		t.Errorf("%d unseen completions, want at least the writer's %d requests", n, c.Requests)
	}
	checkDrops(t, st)

	// The sweep took the writer's requests out of the in-flight table: a second read adds
	// nothing.
	again, err := tr.Read()
	if err != nil {
		t.Fatalf("Read again: %v", err)
	}
	if again.IO[w] != c {
		t.Errorf("second read charged the writer %+v, want the first's %+v", again.IO[w], c)
	}
}

// detach closes the link of prog, as if the kernel did not run it.
func detach(t *testing.T, tr *Tracer, prog *ebpf.Program) {
	t.Helper()
	info, err := prog.Info()
	if err != nil {
		t.Fatalf("program info: %v", err)
	}
	id, _ := info.ID()
	for i, l := range tr.links {
		li, err := l.Info()
		if err != nil {
			t.Fatalf("link info: %v", err)
		}
		if li.Program == id {
			if err := l.Close(); err != nil {
				t.Fatalf("detaching %s: %v", info.Name, err)
			}
			tr.links = slices.Delete(tr.links, i, i+1)
			return
		}
	}
	t.Fatalf("no link of %s", info.Name)
}

// TestRequeued overwrites the file with many direct writes at a time, more than the device
// takes: the driver hands requests back, and they are issued again (block_rq_requeue, then
// block_rq_issue once more). Each is one request, counted once when it completes; the bytes
// must be exactly those written, with sweeps running all along, which must take no request
// still in flight (a requeued one taken, then issued again, would be counted twice).
func TestRequeued(t *testing.T) {
	cgtest.RequireRoot(t)
	gs := cgtest.Make(t, "blkio", "writer")
	writer := gs["writer"]
	tr := newTracer(t)
	file, disk := prepare(t)

	done := make(chan struct{})
	sweeps := make(chan int)
	go func() {
		n := 0
		defer func() { sweeps <- n }()
		for {
			select {
			case <-done:
				return
			default:
			}
			if _, err := tr.Read(); err != nil {
				t.Errorf("Read while writing: %v", err)
				return
			}
			n++
		}
	}()
	runHelper(t, writer, "concurrent", file)
	close(done)
	t.Logf("%d reads while writing", <-sweeps)

	st, err := tr.Read()
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	w := Key{Cgroup: writer.ID, Dev: disk, Op: "write"}
	c := st.IO[w]
	t.Logf("%+v: %+v service %+v queue %+v", w, c, st.Service[w], st.Queue[w])
	// Adjacent chunks may be merged into one request.
	if c.Bytes != writeBytes || c.Requests == 0 || c.Requests > writeBytes/chunk {
		t.Errorf("writer charged %+v on %s, want %d bytes in 1 to %d requests", c, disk, writeBytes, writeBytes/chunk)
	}
	checkCounts(t, st, w)
	checkDrops(t, st)
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

// checkAgainstWriter compares the writer's requests as traced (all of them, and the queue and
// service times of the timed ones) with the writer's own timing of each chunk, took. A chunk's
// requests are inserted, issued and completed while its write (or its sync) waits for them,
// and each chunk makes at least one, so:
//   - no request's queue or service time exceeds the longest chunk;
//   - the queue and service times of a chunk's n requests add up to at most n times the
//     chunk, hence over the run to at most the chunks' total plus, for the requests beyond
//     one per chunk, the longest chunk each.
//
// The rest of a chunk's time is the writer's own (copying, submitting, waking up), which a
// busy machine stretches, so there is no lower bound beyond the requests being there.
func checkAgainstWriter(t *testing.T, queue, service hist.Log2, requests uint64, took []int64) {
	t.Helper()
	chunks := uint64(len(took))
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
