//go:build linux

package trace

import (
	"errors"
	"io/fs"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodectl/nodectl/record/trace/fsync"
	"github.com/nodectl/nodectl/record/trace/internal/cgtest"
	"github.com/nodectl/nodectl/record/trace/tracefs"
	"github.com/nodectl/nodectl/rundir"
)

// walkResolver finds cgroups by walking the hierarchy, again on a miss.
type walkResolver struct {
	mu    sync.Mutex
	paths map[string]map[uint64]string // by mount
}

func (r *walkResolver) Path(controller string, id uint64) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	mount := cgtest.Mount(controller)
	if p, ok := r.paths[mount][id]; ok {
		return p, true
	}
	if r.paths == nil {
		r.paths = map[string]map[uint64]string{}
	}
	m := map[uint64]string{}
	filepath.WalkDir(mount, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil // removed meanwhile
		}
		if fi, err := d.Info(); err == nil {
			m[fi.Sys().(*syscall.Stat_t).Ino] = "/" + strings.TrimPrefix(strings.TrimPrefix(path, mount), "/")
		}
		return nil
	})
	r.paths[mount] = m
	p, ok := m[id]
	return p, ok
}

// All programs load side by side, and a run-queue contention and an fsync made in test
// cgroups come out as samples named by those cgroups' paths.
func TestCollectReal(t *testing.T) {
	cgtest.RequireRoot(t)
	cpu := cgtest.Make(t, "cpu", "a", "b")
	blk := cgtest.Make(t, "blkio", "syncer")["syncer"]

	tr, err := New(Config{CgroupV1: cgtest.V1()}, &walkResolver{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { tr.Close() })
	for _, p := range Programs {
		if s := tr.Status()[p]; s != StatusAttached {
			t.Errorf("program %s: %s", p, s)
		}
	}

	c := cgtest.LastCPU(t)
	cpu["a"].Busy(t, c)
	cpu["b"].Busy(t, c)
	dir, _ := cgtest.DiskDir(t)
	dd := blk.Start(t, -1, "dd", "if=/dev/zero", "of="+filepath.Join(dir, "data"), "bs=64k", "count=4", "conv=fsync", "status=none")
	if err := dd.Wait(); err != nil {
		t.Fatalf("dd: %v", err)
	}

	// Snapshot until everything showed up: each snapshot holds every series in full.
	a, b := cpu["a"].Path, cpu["b"].Path
	var recs []rundir.Record
	deadline := time.Now().Add(15 * time.Second)
	for {
		got, err := collectAll(tr, time.Now())
		if err != nil {
			t.Fatalf("Collect: %v", err)
		}
		recs = append(recs, got...)
		seen := len(find(recs, rundir.MetricFsyncLatency, blk.Path, nil)) > 0 &&
			len(find(recs, rundir.MetricRunqLatency, a, nil)) > 0 &&
			len(find(recs, rundir.MetricRunqPreemptions, a, map[string]string{rundir.LabelPreemptor: b})) > 0
		if seen || time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}

	// dd fsynced before the first snapshot and never again: every snapshot holds that fsync,
	// and no more.
	syncs := find(recs, rundir.MetricFsyncLatency, blk.Path, map[string]string{rundir.LabelSyscall: rundir.SyscallFsync})
	if len(syncs) == 0 || syncs[0].Hist.Count == 0 {
		t.Errorf("fsync samples of %s: %+v, want the dd's fsync", blk.Path, syncs)
	}
	for _, s := range syncs {
		if s.Hist.Count != syncs[0].Hist.Count {
			t.Errorf("fsync count of %s went %d → %d with no fsync in between", blk.Path, syncs[0].Hist.Count, s.Hist.Count)
		}
	}
	if len(find(recs, rundir.MetricRunqLatency, a, nil)) == 0 {
		t.Errorf("no run-queue latency sample for %s", a)
	}
	p := find(recs, rundir.MetricRunqPreemptions, a, map[string]string{rundir.LabelPreemptor: b})
	if len(p) == 0 || *p[len(p)-1].Value == 0 {
		t.Errorf("preemptions of %s by %s: %+v", a, b, p)
	}
	var requests bool
	for _, r := range recs {
		requests = requests || r.Metric == rundir.MetricBlkRequests
	}
	if !requests {
		t.Errorf("no block request sample after an fsync'd write")
	}
}

// The fsync program on the syscall hooks gets tracefs mounted when the host has not mounted it, and the machine is
// left as found: a tracefs that was there is neither mounted over nor unmounted, one that was
// not is unmounted at Close. This host has one or not; TestTracefsMountedWhenMissing makes
// sure the other case runs too.
func TestTracefsLeftAsFound(t *testing.T) {
	cgtest.RequireRoot(t)
	testTracefsLeftAsFound(t)
}

func TestTracefsMountedWhenMissing(t *testing.T) {
	if !cgtest.WithoutTracefs(t) {
		return
	}
	testTracefsLeftAsFound(t)
}

// testTracefsLeftAsFound tells the mounts apart by id, so that mounts made meanwhile by others
// do not count.
func testTracefsLeftAsFound(t *testing.T) {
	_, had := tracefs.Find()
	before := cgtest.TracefsMounts(t)
	tr, err := New(Config{CgroupV1: cgtest.V1(), Programs: []string{ProgramFsync}, FsyncHooks: fsync.HooksSyscalls}, &walkResolver{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { tr.Close() })
	if s := tr.Status()[ProgramFsync]; s != StatusAttached {
		t.Fatalf("fsync: %s", s)
	}
	var added []string
	for id, dir := range cgtest.TracefsMounts(t) {
		if _, ok := before[id]; !ok {
			added = append(added, id)
			t.Logf("tracer mounted tracefs at %s (mount id %s)", dir, id)
		}
	}
	switch {
	case had && len(added) > 0:
		t.Errorf("tracefs was available, yet %d tracefs mount(s) appeared", len(added))
	case !had && (len(added) != 1 || !tr.tracefs.Mounted()):
		t.Errorf("tracefs was not available: %d tracefs mount(s) appeared, Mounted %v; want 1 and true", len(added), tr.tracefs.Mounted())
	}

	if err := errors.Join(tr.Close(), tr.Close()); err != nil {
		t.Fatalf("Close twice: %v", err)
	}
	after := cgtest.TracefsMounts(t)
	for _, id := range added {
		if _, ok := after[id]; ok {
			t.Errorf("tracefs mount %s at %s left after Close", id, after[id])
		}
	}
	for id, dir := range before {
		if _, ok := after[id]; !ok {
			t.Errorf("tracefs mount %s at %s, there before New, is gone after Close", id, dir)
		}
	}
	t.Logf("tracefs available before: %v; mounted by the tracer: %d", had, len(added))
}

// Without tracefs the fsync program on the syscall hooks is reported not attached, saying why,
// and the others run.
func TestNoTracefsSkipsFsyncOnly(t *testing.T) {
	if !cgtest.WithoutTracefs(t) {
		return
	}
	nowhere := filepath.Join(t.TempDir(), "missing")
	tr, err := New(Config{CgroupV1: cgtest.V1(), Tracefs: nowhere, FsyncHooks: fsync.HooksSyscalls}, &walkResolver{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { tr.Close() })
	st := tr.Status()
	if s := st[ProgramFsync]; !strings.Contains(s, "tracefs") || !strings.Contains(s, nowhere) {
		t.Errorf("fsync status %q, want the tracefs mount failure at %s", s, nowhere)
	}
	for _, p := range []string{ProgramRunq, ProgramBlkio} {
		if st[p] != StatusAttached {
			t.Errorf("program %s: %s", p, st[p])
		}
	}
}

// On ext4's hooks the fsync program needs no tracefs: it runs without one, and none is mounted.
func TestExt4HooksNeedNoTracefs(t *testing.T) {
	if !cgtest.WithoutTracefs(t) {
		return
	}
	before := cgtest.TracefsMounts(t)
	nowhere := filepath.Join(t.TempDir(), "missing")
	tr, err := New(Config{CgroupV1: cgtest.V1(), Tracefs: nowhere, Programs: []string{ProgramFsync}, FsyncHooks: fsync.HooksExt4},
		&walkResolver{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { tr.Close() })
	if s := tr.Status()[ProgramFsync]; s != StatusAttached {
		t.Errorf("fsync: %s", s)
	}
	for id, dir := range cgtest.TracefsMounts(t) {
		if _, ok := before[id]; !ok {
			t.Errorf("tracefs mounted at %s for ext4's hooks", dir)
		}
	}
}

// Programs that need no tracefs do not get it mounted.
func TestNoFsyncNoTracefs(t *testing.T) {
	cgtest.RequireRoot(t)
	before := cgtest.TracefsMounts(t)
	tr, err := New(Config{CgroupV1: cgtest.V1(), Programs: []string{ProgramRunq, ProgramBlkio}}, &walkResolver{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { tr.Close() })
	for id, dir := range cgtest.TracefsMounts(t) {
		if _, ok := before[id]; !ok {
			t.Errorf("tracefs mounted at %s without the fsync program", dir)
		}
	}
}
