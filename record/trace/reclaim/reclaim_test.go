//go:build linux

package reclaim

import (
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nodectl/nodectl/record/trace/internal/cgtest"
)

const mib = 1 << 20

func load(t *testing.T) *Tracer {
	t.Helper()
	cgtest.RequireRoot(t)
	tr, err := New(Config{CgroupV1: cgtest.V1()}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

// limit sets a memory limit on a cgroup directory, with no swap allowed above it.
func limit(t *testing.T, dir string, bytes int) {
	t.Helper()
	files := []string{"memory.max", "memory.swap.max"}
	values := []string{strconv.Itoa(bytes), "0"}
	if cgtest.V1() {
		// memsw is memory+swap, and may not go below the memory limit: set it second.
		files = []string{"memory.limit_in_bytes", "memory.memsw.limit_in_bytes"}
		values = []string{strconv.Itoa(bytes), strconv.Itoa(bytes)}
	}
	for i, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(values[i]), 0); err != nil {
			t.Fatalf("writing %s to %s/%s: %v", values[i], dir, f, err)
		}
	}
}

// A cgroup reading a file larger than its memory limit reclaims its own page cache: memcg
// reclaim stalls and pages charged to it, none to an idle neighbour.
func TestMemcgReclaim(t *testing.T) {
	tr := load(t)
	g := cgtest.Make(t, "memory", "reader", "idle")
	const limitBytes, fileBytes = 64 * mib, 192 * mib
	limit(t, g["reader"].Dir, limitBytes)

	// Written from here and dropped from the page cache, so that the reader charges every page.
	dir, _ := cgtest.DiskDir(t)
	file := filepath.Join(dir, "data")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, mib)
	for range fileBytes / mib {
		if _, err := f.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	f.Close()

	cat := g["reader"].Start(t, -1, "dd", "if="+file, "of=/dev/null", "bs=1M", "status=none")
	if err := cat.Wait(); err != nil {
		t.Fatalf("dd: %v", err)
	}
	st, err := tr.Read()
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	s := st.Stalls[Key{Cgroup: g["reader"].ID, Kind: KindMemcg}]
	cgtest.CheckHist(t, "reader memcg stalls", s.Time)
	// At least half of what did not fit under the limit was reclaimed by the reader itself.
	if min := uint64(fileBytes-limitBytes) / 2 / uint64(os.Getpagesize()); s.Time.Count == 0 || s.Pages < min {
		t.Errorf("reader: %d memcg reclaim stalls reclaiming %d pages, want some reclaiming at least %d", s.Time.Count, s.Pages, min)
	}
	for _, kind := range []string{KindMemcg, KindDirect} {
		if n := st.Stalls[Key{Cgroup: g["idle"].ID, Kind: kind}].Time.Count; n != 0 {
			t.Errorf("idle cgroup: %d %s stalls, want none", n, kind)
		}
	}
	t.Logf("reader: %d memcg reclaim stalls, %s total, p99 %s, %d pages; kswapd wakes %d",
		s.Time.Count, time.Duration(s.Time.SumNs), time.Duration(s.Time.Quantile(0.99)*1e9), s.Pages, st.KswapdWakes)
	cgtest.CheckClose(t, tr)
}

// A process allocating past the limit of its cgroup, or of its cgroup's parent, is OOM-killed:
// the kill is counted for its cgroup, and the event names it and the cgroup whose limit was hit.
func TestOOMKill(t *testing.T) {
	for _, c := range []struct {
		name        string
		parentLimit bool
	}{{"own_limit", false}, {"parent_limit", true}} {
		t.Run(c.name, func(t *testing.T) { testOOMKill(t, c.parentLimit) })
	}
}

func testOOMKill(t *testing.T, parentLimit bool) {
	tr := load(t)
	g := cgtest.Make(t, "memory", "victim", "bystander")
	limited := g["victim"].Dir
	if parentLimit {
		limited = filepath.Dir(limited)
	}
	var lst syscall.Stat_t
	if err := syscall.Stat(limited, &lst); err != nil {
		t.Fatal(err)
	}
	limit(t, limited, 64*mib)
	g["bystander"].Start(t, -1, "sleep", "60")

	// dd allocates its 128 MiB block and fills it from /dev/zero: anonymous memory, no swap.
	dd := g["victim"].Start(t, -1, "dd", "if=/dev/zero", "of=/dev/null", "bs=128M", "count=1", "status=none")
	pid := uint32(dd.Process.Pid)
	err := dd.Wait()
	if ws, ok := dd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("dd ended with %v, want killed by SIGKILL", err)
	}

	st, err := tr.Read()
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	if n := st.OOMKills[g["victim"].ID]; n != 1 {
		t.Errorf("victim cgroup: %d OOM kills, want 1", n)
	}
	if n := st.OOMKills[g["bystander"].ID]; n != 0 {
		t.Errorf("bystander cgroup: %d OOM kills, want none", n)
	}
	var found bool
	for _, k := range st.Kills {
		t.Logf("kill: %+v", k)
		if k.PID != pid {
			continue
		}
		found = true
		if k.Comm != "dd" || k.Cgroup != g["victim"].ID {
			t.Errorf("kill of pid %d: comm %q cgroup %d, want dd in %d", pid, k.Comm, k.Cgroup, g["victim"].ID)
		}
		if k.Limit != lst.Ino {
			t.Errorf("kill of pid %d: limit hit by cgroup %d, want %s's %d", pid, k.Limit, limited, lst.Ino)
		}
		if k.LimitBytes != 64*mib || k.UsageBytes < k.LimitBytes/2 {
			t.Errorf("kill of pid %d: usage %d of limit %d, want near the limit %d", pid, k.UsageBytes, k.LimitBytes, 64*mib)
		}
		if d := time.Since(k.Time); d < 0 || d > time.Minute {
			t.Errorf("kill of pid %d at %v, %v ago", pid, k.Time, d)
		}
	}
	if !found {
		t.Errorf("no kill event for dd (pid %d) among %d", pid, len(st.Kills))
	}
	// The ring was drained: the next read has no kill, the count stays.
	if st, err = tr.Read(); err != nil || len(st.Kills) != 0 || st.OOMKills[g["victim"].ID] != 1 {
		t.Errorf("second Read: %d kills, count %d, err %v; want none, 1, nil", len(st.Kills), st.OOMKills[g["victim"].ID], err)
	}

	// Removed cgroups are forgotten.
	g["victim"].Remove(t)
	n, err := tr.Forget(func(id uint64) bool { return id != g["victim"].ID })
	if err != nil || n == 0 {
		t.Errorf("Forget: %d entries, %v; want the victim's", n, err)
	}
	if st, _ := tr.Read(); st.OOMKills[g["victim"].ID] != 0 {
		t.Error("victim's kill count still there after Forget")
	}
	for reason, n := range st.Drops {
		if n > 0 {
			t.Errorf("drops %s: %d", reason, n)
		}
	}
}
