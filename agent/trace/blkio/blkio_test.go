//go:build linux

package blkio

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nodectl/nodectl/agent/trace/internal/cgtest"
)

// Helper modes of the test binary, selected by env: NODECTL_BLKIO_TEST_MODE names the mode,
// NODECTL_BLKIO_TEST_FILE the file to write.
const (
	modeEnv = "NODECTL_BLKIO_TEST_MODE"
	fileEnv = "NODECTL_BLKIO_TEST_FILE"
)

const (
	writeBytes = 32 << 20
	chunk      = 1 << 20
)

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

// helper writes writeBytes to path: with O_DIRECT ("direct"), or through the page cache with an
// fsync after each chunk ("buffered"), so that the flusher, which would charge root, has no
// time to take the pages first. "idle" does no I/O.
func helper(mode, path string) error {
	flags := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	switch mode {
	case "idle":
		return nil
	case "direct":
		flags |= unix.O_DIRECT
	case "buffered":
	default:
		return fmt.Errorf("unknown helper mode %q", mode)
	}
	f, err := os.OpenFile(path, flags, 0o644)
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
	for range writeBytes / chunk {
		if _, err := f.Write(buf); err != nil {
			return fmt.Errorf("writing %s: %w", path, err)
		}
		if err := f.Sync(); err != nil {
			return fmt.Errorf("syncing %s: %w", path, err)
		}
	}
	return nil
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

	tr, err := New(Config{CgroupV1: cgtest.V1()}, slog.New(slog.DiscardHandler))
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
	for g, m := range map[*cgtest.Group]string{writer: mode, idle: "idle"} {
		cmd := g.Start(t, -1, "env", modeEnv+"="+m, fileEnv+"="+file, os.Args[0])
		if err := cmd.Wait(); err != nil {
			t.Fatalf("helper %s: %v", m, err)
		}
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
	if m := st.Service[w].Mean(); m <= 0 || m > 10 {
		t.Errorf("writer mean service time = %gs, want between 0 and 10s", m)
	}
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

func TestClosedTracer(t *testing.T) {
	cgtest.RequireRoot(t)
	tr, err := New(Config{CgroupV1: cgtest.V1(), MaxEntries: 16}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	cgtest.CheckClose(t, tr)
}
