//go:build linux

package trace

import (
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodectl/nodectl/agent/record"
	"github.com/nodectl/nodectl/agent/trace/internal/cgtest"
)

func TestMain(m *testing.M) {
	os.Exit(cgtest.WithTracefs(m.Run))
}

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
	// A checkout is on a disk; /tmp may be tmpfs, which fsyncs without I/O.
	dir, err := os.MkdirTemp(".", "trace-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	dd := blk.Start(t, -1, "dd", "if=/dev/zero", "of="+filepath.Join(dir, "data"), "bs=64k", "count=4", "conv=fsync", "status=none")
	if err := dd.Wait(); err != nil {
		t.Fatalf("dd: %v", err)
	}

	// Collect until everything showed up: each series is emitted when it changes, so the
	// records of all collects together hold each value at least once.
	a, b := cpu["a"].Path, cpu["b"].Path
	var recs []record.Record
	deadline := time.Now().Add(15 * time.Second)
	for {
		got, err := tr.Collect(time.Now())
		if err != nil {
			t.Fatalf("Collect: %v", err)
		}
		recs = append(recs, got...)
		seen := len(find(recs, record.MetricFsyncLatency, blk.Path, nil)) > 0 &&
			len(find(recs, record.MetricRunqLatency, a, nil)) > 0 &&
			len(find(recs, record.MetricRunqPreemptions, a, map[string]string{record.LabelPreemptor: b})) > 0
		if seen || time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}

	// dd fsynced once, before the first Collect: one sample, never emitted again.
	syncs := find(recs, record.MetricFsyncLatency, blk.Path, map[string]string{record.LabelSyscall: "fsync"})
	if len(syncs) != 1 || syncs[0].Hist.Count == 0 {
		t.Errorf("fsync samples of %s: %+v, want one with the dd's fsync", blk.Path, syncs)
	}
	if len(find(recs, record.MetricRunqLatency, a, nil)) == 0 {
		t.Errorf("no run-queue latency sample for %s", a)
	}
	p := find(recs, record.MetricRunqPreemptions, a, map[string]string{record.LabelPreemptor: b})
	if len(p) == 0 || *p[len(p)-1].Value == 0 {
		t.Errorf("preemptions of %s by %s: %+v", a, b, p)
	}
	var requests bool
	for _, r := range recs {
		requests = requests || r.Metric == record.MetricBlkRequests
	}
	if !requests {
		t.Errorf("no block request sample after an fsync'd write")
	}
}
