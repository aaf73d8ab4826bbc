//go:build linux

package fsync

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nodectl/nodectl/agent/trace/internal/cgtest"
)

// helperEnv makes the test binary a workload: it does the syncs in the named directory.
const helperEnv = "NODECTL_FSYNC_TEST_DIR"

const (
	nFsync         = 20
	nFdatasync     = 5
	nSyncFileRange = 3
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(helperEnv); dir != "" {
		if err := syncs(dir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(cgtest.WithTracefs(m.Run))
}

// syncs writes a little and syncs, nFsync times with fsync, then nFdatasync times with
// fdatasync and nSyncFileRange times with sync_file_range.
func syncs(dir string) error {
	f, err := os.Create(filepath.Join(dir, "data"))
	if err != nil {
		return err
	}
	defer f.Close()
	fd := int(f.Fd())
	for i := range nFsync + nFdatasync + nSyncFileRange {
		if _, err := f.Write([]byte("nodectl fsync test\n")); err != nil {
			return err
		}
		switch {
		case i < nFsync:
			err = unix.Fsync(fd)
		case i < nFsync+nFdatasync:
			err = unix.Fdatasync(fd)
		default:
			err = unix.SyncFileRange(fd, 0, 0, unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER)
		}
		if err != nil {
			return fmt.Errorf("sync %d: %w", i, err)
		}
	}
	return nil
}

func TestFsyncLatency(t *testing.T) {
	cgtest.RequireRoot(t)
	g := cgtest.Make(t, "blkio", "syncer")["syncer"]

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
	cmd := g.Start(t, -1, "env", helperEnv+"="+dir, os.Args[0])
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper: %v", err)
	}

	st, err := tr.Read()
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	for sc, want := range map[string]uint64{"fsync": nFsync, "fdatasync": nFdatasync, "sync_file_range": nSyncFileRange} {
		k := Key{Cgroup: g.ID, Dev: disk, Syscall: sc}
		h, ok := st.Latency[k]
		if !ok {
			t.Errorf("no latency for %+v; have %v", k, keysOf(st, g.ID))
			continue
		}
		t.Logf("%s on %s: %+v", sc, disk, h)
		if h.Count != want {
			t.Errorf("%s count = %d, want %d", sc, h.Count, want)
		}
		var inBuckets uint64
		for _, c := range h.Buckets {
			inBuckets += c
		}
		if inBuckets != h.Count {
			t.Errorf("%s buckets hold %d, count is %d", sc, inBuckets, h.Count)
		}
		if m := h.Mean(); h.SumNs == 0 || m < 1e-6 || m > 10 {
			t.Errorf("%s mean = %gs (sum %dns), want between 1µs and 10s", sc, m, h.SumNs)
		}
	}
	for reason, n := range st.Drops {
		if n != 0 {
			t.Errorf("drops %s = %d, want 0", reason, n)
		}
	}

	g.Remove(t)
	n, err := tr.Forget(func(id uint64) bool { return id != g.ID })
	if err != nil {
		t.Fatalf("Forget: %v", err)
	}
	if n < 3 {
		t.Errorf("Forget deleted %d entries, want at least 3", n)
	}
	st, err = tr.Read()
	if err != nil {
		t.Fatalf("Read after Forget: %v", err)
	}
	if ks := keysOf(st, g.ID); len(ks) != 0 {
		t.Errorf("entries of the removed cgroup remain: %v", ks)
	}

}

func keysOf(st Stats, cgroup uint64) []Key {
	var out []Key
	for k := range st.Latency {
		if k.Cgroup == cgroup {
			out = append(out, k)
		}
	}
	return out
}

func TestClosedTracer(t *testing.T) {
	cgtest.RequireRoot(t)
	tr, err := New(Config{CgroupV1: cgtest.V1(), MaxEntries: 16}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	cgtest.CheckClose(t, tr)
}
