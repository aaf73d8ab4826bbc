//go:build linux

package sample

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/rundir"
)

// writeFiles writes each name's content below dir.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// A cgroup's memory, OOM kills and pressure, from files as 6.18 writes them.
func TestCgroupFiles(t *testing.T) {
	const cg = "/nodectl/run"
	v1 := &cgroup.Layout{V1: true, Mounts: map[string]string{cgroup.Memory: t.TempDir()}}
	writeFiles(t, v1.Dir(cgroup.Memory, cg), map[string]string{
		"memory.stat": "cache 1\nrss 2\ninactive_file 3\ntotal_cache 8192\ntotal_rss 40960\ntotal_inactive_file 4096\n" +
			"total_swap 12288\n",
		"memory.usage_in_bytes": "57344\n",
		"memory.limit_in_bytes": "9223372036854771712\n",
		"memory.oom_control":    "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
	})
	v2 := &cgroup.Layout{Unified: t.TempDir(), Mounts: map[string]string{}}
	writeFiles(t, v2.Dir(cgroup.Unified, cg), map[string]string{
		"memory.stat":     "anon 40960\nfile 8192\nkernel 100\nactive_file 4096\ninactive_file 4096\n",
		"memory.current":  "57344\n",
		"memory.max":      "max\n",
		"memory.events":   "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\noom_group_kill 0\n",
		"memory.pressure": "some avg10=0.00 avg60=0.00 avg300=0.00 total=2500000\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=42\n",
	})
	for name, c := range map[string]struct {
		l    *cgroup.Layout
		want Memory
		oom  int64
	}{
		"v1": {v1, Memory{Usage: 57344, Limit: 9223372036854771712, Anon: 40960, File: 8192, InactiveFile: 4096, Swap: 12288}, 2},
		// Without swap accounting (no memory.swap.current) swap is unknown, not zero.
		"v2": {v2, Memory{Usage: 57344, Limit: -1, Anon: 40960, File: 8192, InactiveFile: 4096, Swap: -1}, 1},
	} {
		t.Run(name, func(t *testing.T) {
			m, err := CgroupMemory(c.l, cg)
			if err != nil || m != c.want {
				t.Errorf("memory %+v, %v; want %+v", m, err, c.want)
			}
			if ws := m.WorkingSet(); ws != 57344-4096 {
				t.Errorf("working set %d, want usage less inactive file", ws)
			}
			if n, err := OOMKills(c.l, cg); err != nil || n != c.oom {
				t.Errorf("OOM kills %d, %v; want %d", n, err, c.oom)
			}
		})
	}
	p, err := CgroupPressure(v2, cg, rundir.ResourceMemory)
	if err != nil || p.Some != 2500*time.Millisecond || p.Full != 42*time.Microsecond {
		t.Errorf("pressure %+v, %v", p, err)
	}
	if _, err := CgroupPressure(v1, cg, rundir.ResourceMemory); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("pressure without a v2 hierarchy: %v, want ErrUnsupported", err)
	}

	// A kernel before 4.13 has no oom_kill in memory.oom_control.
	writeFiles(t, v1.Dir(cgroup.Memory, cg), map[string]string{"memory.oom_control": "oom_kill_disable 0\nunder_oom 0\n"})
	if _, err := OOMKills(v1, cg); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("OOM kills without the key: %v, want ErrUnsupported", err)
	}
	writeFiles(t, v2.Dir(cgroup.Unified, cg), map[string]string{"memory.stat": "anon 1\nfile 2\n"})
	if _, err := CgroupMemory(v2, cg); err == nil || !strings.Contains(err.Error(), "no inactive_file") {
		t.Errorf("memory.stat without inactive_file: %v", err)
	}
	writeFiles(t, v2.Dir(cgroup.Unified, cg), map[string]string{"memory.stat": "anon x\nfile 2\ninactive_file 3\n"})
	if _, err := CgroupMemory(v2, cg); err == nil {
		t.Error("a bad memory.stat value parsed")
	}
}

// A real cgroup's memory: a process's touched heap is its anonymous memory, charged to its
// cgroup and counted in its parent.
func TestCgroupMemoryOfATouchedHeap(t *testing.T) {
	l, parent := testParent(t, "test")
	if l.V1 {
		if _, ok := l.Mounts[cgroup.Memory]; !ok {
			t.Skip("no memory controller")
		}
	}
	path := parent + "/heap"
	if err := l.Create(path, cgroup.Limits{MemoryBytes: 256 << 20}); err != nil {
		t.Fatal(err)
	}
	touchIn(t, l, path, 32<<20)
	var m Memory
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var err error
		if m, err = CgroupMemory(l, parent); err != nil {
			t.Fatal(err)
		}
		if m.Anon >= 32<<20 {
			break
		}
	}
	if m.Anon < 32<<20 || m.Usage < m.Anon || m.WorkingSet() > m.Usage {
		t.Errorf("the parent of a 32 MiB heap: %+v", m)
	}
	if own, err := CgroupMemory(l, path); err != nil || own.Limit != 256<<20 {
		t.Errorf("the heap's cgroup: %+v, %v; want its 256 MiB limit", own, err)
	}
	if n, err := OOMKills(l, path); err != nil || n != 0 {
		t.Errorf("OOM kills %d, %v; want none", n, err)
	}
}

// The node's dirty memory from vmstat, in bytes; a vmstat without one of its counters fails.
func TestReadDirty(t *testing.T) {
	procfs := t.TempDir()
	writeFiles(t, procfs, map[string]string{
		"vmstat": "nr_free_pages 100\nnr_dirty 25\nnr_writeback 3\nnr_dirty_threshold 1000\nnr_dirty_background_threshold 500\npgpgout 7\n",
	})
	page := int64(os.Getpagesize())
	d, err := ReadDirty(procfs)
	if want := (Dirty{25 * page, 3 * page, 1000 * page, 500 * page}); err != nil || d != want {
		t.Errorf("%+v, %v; want %+v", d, err, want)
	}
	writeFiles(t, procfs, map[string]string{"vmstat": "nr_dirty 25\npgpgout 7\n"})
	if _, err := ReadDirty(procfs); err == nil || !strings.Contains(err.Error(), ": no nr_") {
		t.Errorf("a vmstat without the thresholds: %v", err)
	}
	if d, err := ReadDirty("/proc"); err != nil || d.Threshold <= 0 || d.BackgroundThreshold > d.Threshold {
		t.Errorf("this node: %+v, %v", d, err)
	}
}

func TestMemAvailable(t *testing.T) {
	procfs := t.TempDir()
	writeFiles(t, procfs, map[string]string{"meminfo": "MemTotal:       16384 kB\nMemFree:         1024 kB\nMemAvailable:    4096 kB\n"})
	if n, err := MemAvailable(procfs); err != nil || n != 4096<<10 {
		t.Errorf("%d, %v; want %d", n, err, 4096<<10)
	}
	if n, err := MemAvailable("/proc"); err != nil || n <= 0 {
		t.Errorf("this node: %d, %v", n, err)
	}
}
