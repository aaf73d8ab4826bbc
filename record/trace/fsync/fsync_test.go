//go:build linux

package fsync

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nodectl/nodectl/record/trace/internal/cgtest"
	"github.com/nodectl/nodectl/rundir/hist"
)

// helperEnv makes the test binary a workload: it does the syncs in the named directory.
const helperEnv = "NODECTL_FSYNC_TEST_DIR"

const (
	nFsync         = 20
	nFdatasync     = 10
	nSyncFileRange = 10
)

// minCallerShare is the least share of the caller's time in a sync that the tracer must see.
const minCallerShare = 0.5

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

// timesFile is where the helper leaves, in its directory, how long each of its calls took by
// its own clock: nanoseconds by syscall name, in call order.
const timesFile = "times.json"

// syncs writes a little and syncs, nFsync times with fsync, then nFdatasync times with
// fdatasync and nSyncFileRange times with sync_file_range, timing each call.
func syncs(dir string) error {
	f, err := os.Create(filepath.Join(dir, "data"))
	if err != nil {
		return err
	}
	defer f.Close()
	fd := int(f.Fd())
	took := map[string][]int64{}
	for i := range nFsync + nFdatasync + nSyncFileRange {
		if _, err := f.Write([]byte("nodectl fsync test\n")); err != nil {
			return err
		}
		var sc string
		start := time.Now()
		switch {
		case i < nFsync:
			sc, err = "fsync", unix.Fsync(fd)
		case i < nFsync+nFdatasync:
			sc, err = "fdatasync", unix.Fdatasync(fd)
		default:
			sc, err = "sync_file_range", unix.SyncFileRange(fd, 0, 0, unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER)
		}
		d := time.Since(start)
		if err != nil {
			return fmt.Errorf("sync %d: %w", i, err)
		}
		took[sc] = append(took[sc], d.Nanoseconds())
	}
	b, err := json.Marshal(took)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, timesFile), b, 0o644)
}

// TestFsyncLatency runs the syncs under each set of hooks: ext4's sees fsync and fdatasync
// (told by their datasync flag) and not sync_file_range, which syncs no file; the syscalls'
// sees all three.
func TestFsyncLatency(t *testing.T) {
	cgtest.RequireRoot(t)
	t.Run("ext4", func(t *testing.T) {
		testFsyncLatency(t, HooksExt4, map[string]uint64{"fsync": nFsync, "fdatasync": nFdatasync})
	})
	t.Run("syscalls", func(t *testing.T) {
		testFsyncLatency(t, HooksSyscalls, map[string]uint64{"fsync": nFsync, "fdatasync": nFdatasync, "sync_file_range": nSyncFileRange})
	})
}

func testFsyncLatency(t *testing.T, hooks Hooks, wantCounts map[string]uint64) {
	dir, disk := cgtest.DiskDir(t)
	if hooks == HooksExt4 {
		var fs unix.Statfs_t
		if err := unix.Statfs(dir, &fs); err != nil {
			t.Fatal(err)
		}
		if fs.Type != unix.EXT4_SUPER_MAGIC {
			t.Skipf("%s is not on ext4 (statfs type %#x)", dir, fs.Type)
		}
	}
	g := cgtest.Make(t, "blkio", "syncer")["syncer"]

	const capacity = 256
	tr, err := New(Config{CgroupV1: cgtest.V1(), MaxEntries: capacity, Hooks: hooks}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := tr.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	if tr.Hooks() != hooks {
		t.Errorf("Hooks() = %q, want %q", tr.Hooks(), hooks)
	}

	cmd := g.Start(t, -1, "env", helperEnv+"="+dir, os.Args[0])
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper: %v", err)
	}

	b, err := os.ReadFile(filepath.Join(dir, timesFile))
	if err != nil {
		t.Fatalf("reading the helper's times: %v", err)
	}
	var took map[string][]int64
	if err := json.Unmarshal(b, &took); err != nil {
		t.Fatalf("parsing the helper's times: %v", err)
	}

	st, err := tr.Read()
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	if n := len(keysOf(st, g.ID)); n != len(wantCounts) {
		t.Errorf("%d keys of the cgroup, want %d: %v", n, len(wantCounts), keysOf(st, g.ID))
	}
	for sc, want := range wantCounts {
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
		cgtest.CheckHist(t, sc, h)
		checkAgainstCaller(t, sc, h, took[sc])
	}
	for reason, n := range st.Drops {
		if n != 0 {
			t.Errorf("drops %s = %d, want 0", reason, n)
		}
	}
	// Keys of partitions of one disk are merged: the map holds at least as many.
	if low := float64(len(st.Latency)) / capacity; st.Fill < low || st.Fill > 1 {
		t.Errorf("fill %g, want between %g and 1", st.Fill, low)
	}

	g.Remove(t)
	n, err := tr.Forget(func(id uint64) bool { return id != g.ID })
	if err != nil {
		t.Fatalf("Forget: %v", err)
	}
	if n < len(wantCounts) {
		t.Errorf("Forget deleted %d entries, want at least %d", n, len(wantCounts))
	}
	st, err = tr.Read()
	if err != nil {
		t.Fatalf("Read after Forget: %v", err)
	}
	if ks := keysOf(st, g.ID); len(ks) != 0 {
		t.Errorf("entries of the removed cgroup remain: %v", ks)
	}

}

// clockSlack is how much later than the caller's clock the tracer's may read the same
// instant: both are CLOCK_MONOTONIC, read by different code.
const clockSlack = time.Microsecond

// checkAgainstCaller compares what the tracer recorded of a syscall with the caller's own
// timing of each call, took. The tracer times from syscall entry to exit, inside the caller's
// clock reads, so each recorded latency is at most its call's: the sum cannot exceed the
// caller's, and no more values can reach a bucket's lower edge than calls took that long.
// The caller's time also holds the way in and out of the kernel and any preemption there,
// small beside a sync that waits for the disk: the tracer must account for most of it.
func checkAgainstCaller(t *testing.T, sc string, h hist.Log2, took []int64) {
	t.Helper()
	if len(took) != int(h.Count) {
		t.Errorf("%s: caller timed %d calls, tracer counted %d", sc, len(took), h.Count)
		return
	}
	var sum int64
	for _, d := range took {
		sum += d
	}
	upper := sum + int64(len(took))*clockSlack.Nanoseconds()
	ratio := float64(h.SumNs) / float64(sum)
	t.Logf("%s: tracer %dns, caller %dns, ratio %.3f", sc, h.SumNs, sum, ratio)
	if int64(h.SumNs) > upper {
		t.Errorf("%s: tracer summed %dns, more than the %dns the caller spent in the calls", sc, h.SumNs, sum)
	}
	if ratio < minCallerShare {
		t.Errorf("%s: tracer summed %.3f of the caller's time in the calls, want at least %.2f", sc, ratio, minCallerShare)
	}
	var atLeast uint64 // tracer values in bucket i or above
	for i := len(h.Buckets) - 1; i >= 0; i-- {
		atLeast += h.Buckets[i]
		edge := cgtest.BucketLow(i)
		var calls uint64
		for _, d := range took {
			if float64(d+clockSlack.Nanoseconds()) >= edge {
				calls++
			}
		}
		if atLeast > calls {
			t.Errorf("%s: tracer has %d calls of at least %.0fns, the caller timed only %d", sc, atLeast, edge, calls)
		}
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

// A container's fsync goes through its overlay to the upper file: on ext4's hooks it is
// recorded with the disk under the overlay, where the syscall hooks see only the overlay's
// anonymous device.
func TestFsyncThroughOverlay(t *testing.T) {
	cgtest.RequireRoot(t)
	dir, disk := cgtest.DiskDir(t)
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Type != unix.EXT4_SUPER_MAGIC {
		t.Skipf("%s is not on ext4 (statfs type %#x)", dir, fs.Type)
	}
	merged := filepath.Join(dir, "merged")
	for _, d := range []string{"lower", "upper", "work", "merged"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s/lower,upperdir=%s/upper,workdir=%s/work", dir, dir, dir)
	if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		t.Skipf("mounting an overlay: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(merged, 0); err != nil {
			t.Errorf("unmounting the overlay: %v", err)
		}
	})
	g := cgtest.Make(t, "blkio", "container")["container"]
	tr, err := New(Config{CgroupV1: cgtest.V1(), MaxEntries: 64, Hooks: HooksExt4}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { tr.Close() })

	if err := g.Start(t, -1, "env", helperEnv+"="+merged, os.Args[0]).Wait(); err != nil {
		t.Fatalf("helper: %v", err)
	}
	st, err := tr.Read()
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	for sc, want := range map[string]uint64{"fsync": nFsync, "fdatasync": nFdatasync} {
		k := Key{Cgroup: g.ID, Dev: disk, Syscall: sc}
		if h := st.Latency[k]; h.Count != want {
			t.Errorf("%+v: %d calls, want %d; have %v", k, h.Count, want, keysOf(st, g.ID))
		}
	}
}
