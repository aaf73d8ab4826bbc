//go:build linux

package cgroup

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestDetectProcfs(t *testing.T) {
	tests := map[string]struct {
		mountinfo string
		want      Layout
	}{
		"hybrid": {
			mountinfo: `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
50 23 0:40 / /elsewhere/cpu rw,relatime - cgroup cgroup rw,cpuset
`,
			want: Layout{Root: "/sys/fs/cgroup", V1: true, Unified: "/sys/fs/cgroup/unified", Mounts: map[string]string{
				"cpu":          "/sys/fs/cgroup/cpu,cpuacct",
				"cpuacct":      "/sys/fs/cgroup/cpu,cpuacct",
				"memory":       "/sys/fs/cgroup/memory",
				"name=systemd": "/sys/fs/cgroup/systemd",
			}},
		},
		"unified": {
			mountinfo: `31 23 0:28 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
`,
			want: Layout{Root: "/sys/fs/cgroup", Unified: "/sys/fs/cgroup", Mounts: map[string]string{}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			proc := t.TempDir()
			if err := os.MkdirAll(filepath.Join(proc, "self"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(proc, "self", "mountinfo"), []byte(tc.mountinfo), 0o644); err != nil {
				t.Fatal(err)
			}
			l, err := DetectProcfs("/sys/fs/cgroup/", proc)
			if err != nil {
				t.Fatal(err)
			}
			if l.Root != tc.want.Root || l.V1 != tc.want.V1 || l.Unified != tc.want.Unified || fmt.Sprint(l.Mounts) != fmt.Sprint(tc.want.Mounts) {
				t.Fatalf("got %+v, want %+v", *l, tc.want)
			}
			// Every controller lands somewhere; on v2 all in the unified dir.
			want := filepath.Join(tc.want.Unified, "/a/b")
			if tc.want.V1 {
				want = "/sys/fs/cgroup/cpu,cpuacct/a/b"
			}
			if got := l.Dir("cpu", "/a/b"); got != want {
				t.Fatalf("Dir(cpu) = %s, want %s", got, want)
			}
			if got := l.Dir(Unified, "/a"); got != filepath.Join(tc.want.Unified, "/a") {
				t.Fatalf("Dir(unified) = %s", got)
			}
		})
	}
}

func TestDetectNoCgroups(t *testing.T) {
	proc := t.TempDir()
	if err := os.MkdirAll(filepath.Join(proc, "self"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, "self", "mountinfo"), []byte("22 1 0:21 / /proc rw - proc proc rw\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := DetectProcfs("/sys/fs/cgroup", proc); err == nil {
		t.Fatal("no error without cgroup mounts")
	}
}

func TestRefusesRoot(t *testing.T) {
	l := &Layout{Root: "/nonexistent", Unified: "/nonexistent"}
	for _, p := range []string{"/", "", "relative", "/a/../b"} {
		if err := l.Remove(p); err == nil {
			t.Errorf("Remove(%q) did not fail", p)
		}
		if err := l.Create(p, Limits{}); err == nil {
			t.Errorf("Create(%q) did not fail", p)
		}
	}
}

// testLayout detects the host's cgroups and returns a fresh parent path /nodectl/test-*,
// removed with everything in it when the test ends.
func testLayout(t testing.TB) (*Layout, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create cgroups")
	}
	l, err := Detect("/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	parent := fmt.Sprintf("%s/test-%d-%08x", Parent, os.Getpid(), rand.Uint32())
	t.Cleanup(func() {
		if err := l.Remove(parent); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		if err := l.Prune(Parent); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return l, parent
}

func readTrim(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func inode(t *testing.T, dir string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// start runs a command whose process is killed and reaped when the test ends.
func start(t *testing.T, name string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(name, args...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

func TestLifecycle(t *testing.T) {
	l, parent := testLayout(t)
	path := parent + "/victim"
	const mem = 64 << 20
	if err := l.Create(path, Limits{CPUMilli: 250, CPURequestMilli: 250, MemoryBytes: mem}); err != nil {
		t.Fatal(err)
	}
	// The request sets the weight as the kubelet does: 256 shares, weight 10 on v2.
	weightFile, weight, defaultWeight := "cpu.shares", "256", "1024"
	if !l.V1 {
		weightFile, weight, defaultWeight = "cpu.weight", "10", "100"
	}
	if got := readTrim(t, filepath.Join(l.Dir("cpu", path), weightFile)); got != weight {
		t.Fatalf("%s = %s, want %s", weightFile, got, weight)
	}
	if l.V1 {
		if got := readTrim(t, filepath.Join(l.Dir("cpu", path), "cpu.cfs_quota_us")); got != "25000" {
			t.Fatalf("cfs_quota_us = %s, want 25000", got)
		}
		if got := readTrim(t, filepath.Join(l.Dir("memory", path), "memory.limit_in_bytes")); got != strconv.Itoa(mem) {
			t.Fatalf("memory.limit_in_bytes = %s, want %d", got, mem)
		}
	} else {
		if got := readTrim(t, filepath.Join(l.Dir("cpu", path), "cpu.max")); got != "25000 100000" {
			t.Fatalf("cpu.max = %s, want 25000 100000", got)
		}
		if got := readTrim(t, filepath.Join(l.Dir("memory", path), "memory.max")); got != strconv.Itoa(mem) {
			t.Fatalf("memory.max = %s, want %d", got, mem)
		}
	}

	// Create again lifts the limits it is no longer given.
	if err := l.Create(path, Limits{}); err != nil {
		t.Fatal(err)
	}
	quotaFile, want := "cpu.cfs_quota_us", "-1"
	if !l.V1 {
		quotaFile, want = "cpu.max", "max 100000"
	}
	if got := readTrim(t, filepath.Join(l.Dir("cpu", path), quotaFile)); got != want {
		t.Fatalf("%s after lifting = %s, want %s", quotaFile, got, want)
	}
	if got := readTrim(t, filepath.Join(l.Dir("cpu", path), weightFile)); got != defaultWeight {
		t.Fatalf("%s after lifting = %s, want the default %s", weightFile, got, defaultWeight)
	}

	sleep := start(t, "sleep", "60")
	if err := l.AddProc(path, sleep.Process.Pid); err != nil {
		t.Fatal(err)
	}
	procs, err := l.Procs(parent)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(procs, []int{sleep.Process.Pid}) {
		t.Fatalf("Procs = %v, want [%d]", procs, sleep.Process.Pid)
	}
	own := readTrim(t, fmt.Sprintf("/proc/%d/cgroup", sleep.Process.Pid))
	if !strings.Contains(own, ":"+path+"\n") && !strings.HasSuffix(own, ":"+path) {
		t.Fatalf("/proc/pid/cgroup does not name %s:\n%s", path, own)
	}
	if kids, err := l.Children(parent); err != nil || !slices.Equal(kids, []string{path}) {
		t.Fatalf("Children = %v, %v", kids, err)
	}

	r := NewResolver(l)
	ids := map[string]uint64{}
	for _, c := range []string{"cpu", "blkio", Unified} {
		if l.Dir(c, "/") == "" {
			continue
		}
		id, err := l.ID(c, path)
		if err != nil {
			t.Fatal(err)
		}
		if ino := inode(t, l.Dir(c, path)); id != ino {
			t.Fatalf("ID(%s) = %d, st_ino = %d", c, id, ino)
		}
		if got, ok := r.Path(c, id); !ok || got != path {
			t.Fatalf("Path(%s, %d) = %q, %v; want %s", c, id, got, ok, path)
		}
		if !r.Live(c, id) {
			t.Fatalf("Live(%s, %d) = false", c, id)
		}
		if live, done := r.Sweep(c); !live(id) || live(1<<62) {
			t.Fatalf("Sweep(%s): live(%d) = %v, live(1<<62) = %v; want true, false", c, id, live(id), live(1<<62))
		} else {
			done()
		}
		ids[c] = id
	}
	// Each id is checked against its own hierarchy's inode: v1 hierarchies number their cgroups
	// separately, but on a fresh machine two of them may hold the same count, so equal ids of
	// cpu and blkio prove nothing either way.
	if _, ok := r.Path("cpu", 1<<62); ok {
		t.Fatal("resolved an id that does not exist")
	}

	if err := l.Remove(parent); err != nil {
		t.Fatal(err)
	}
	err = sleep.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("sleep ended with %v, want killed", err)
	}
	for _, root := range l.roots() {
		if _, err := os.Stat(filepath.Join(root, parent)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still there: %v", filepath.Join(root, parent), err)
		}
	}
	for c, id := range ids {
		if r.Live(c, id) {
			t.Errorf("Live(%s) after Remove", c)
		}
		live, done := r.Sweep(c)
		if live(id) {
			t.Errorf("Sweep(%s): live after Remove", c)
		}
		done()
		if got, ok := r.Path(c, id); !ok || got != path {
			t.Errorf("Path(%s) of a just removed cgroup = %q, %v; want it kept", c, got, ok)
		}
	}
	if err := l.Remove(parent); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
}

func TestRemoveForkingChild(t *testing.T) {
	l, parent := testLayout(t)
	layouts := map[string]*Layout{"host": l}
	if l.V1 && l.Unified != "" {
		// Without the v2 tree there is no cgroup.kill: the v1 freezer must stop the forks.
		v1 := *l
		v1.Unified = ""
		layouts["v1_only"] = &v1
	}
	for name, l := range layouts {
		t.Run(name, func(t *testing.T) {
			path := parent + "/" + name + "/forker"
			if err := l.Create(path, Limits{}); err != nil {
				t.Fatal(err)
			}
			sh := start(t, "sh", "-c", "while :; do sleep 0.01 & done")
			if err := l.AddProc(path, sh.Process.Pid); err != nil {
				t.Fatal(err)
			}
			// Wait until it has forked a few children inside the cgroup.
			for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				procs, err := l.Procs(path)
				if err != nil {
					t.Fatal(err)
				}
				if len(procs) > 3 {
					break
				}
				if time.Now().After(end) {
					t.Fatalf("the forker did not fork: %v", procs)
				}
			}
			if err := l.Remove(parent + "/" + name); err != nil {
				t.Fatal(err)
			}
			for _, root := range l.roots() {
				if _, err := os.Stat(filepath.Join(root, parent, name)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s still there: %v", filepath.Join(root, parent, name), err)
				}
			}
		})
	}
}

func TestResolverNewCgroup(t *testing.T) {
	l, parent := testLayout(t)
	for _, handles := range []bool{true, false} {
		t.Run(fmt.Sprintf("handles_%v", handles), func(t *testing.T) {
			r := NewResolver(l)
			r.handles = handles // false: as without CAP_DAC_READ_SEARCH
			walked := time.Now()
			if _, ok := r.Path("cpu", 1<<62); ok {
				t.Fatal("resolved an id that does not exist")
			}
			path := fmt.Sprintf("%s/late-%v", parent, handles)
			if err := l.Create(path, Limits{}); err != nil {
				t.Fatal(err)
			}
			id, err := l.ID("cpu", path)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := r.Path("cpu", id)
			if handles {
				// The kernel names a cgroup created since the last look at once.
				if !ok || got != path {
					t.Fatalf("Path = %q, %v; want %s", got, ok, path)
				}
				if err := l.Remove(path); err != nil {
					t.Fatal(err)
				}
				if r.Live("cpu", id) {
					t.Fatal("Live after Remove")
				}
				return
			}
			// A miss within the interval does not walk again, so the new cgroup stays unknown.
			if ok && time.Since(walked) < rewalkEvery {
				t.Fatal("walked again within the rewalk interval")
			}
			time.Sleep(rewalkEvery)
			if got, ok := r.Path("cpu", id); !ok || got != path {
				t.Fatalf("Path after the interval = %q, %v; want %s", got, ok, path)
			}
			if !r.Live("cpu", id) {
				t.Fatal("Live = false")
			}
		})
	}
}

// TestV2Tree runs the v2 code paths on a hybrid host's cgroup2 mount, which has no cpu or
// memory controller but the same files for placing, killing and identifying. A v2 host runs
// them in the tests above.
func TestV2Tree(t *testing.T) {
	host, parent := testLayout(t)
	if !host.V1 || host.Unified == "" {
		t.Skip("not a hybrid host")
	}
	l := &Layout{Root: host.Root, Unified: host.Unified, Mounts: map[string]string{}}
	path := parent + "/v2"
	if err := l.Create(path, Limits{CPUMilli: 100}); err == nil && !hasController(t, l, "cpu") {
		t.Fatal("a cpu limit without a cpu controller did not fail")
	}
	if err := l.Create(path, Limits{CPURequestMilli: 100}); err == nil && !hasController(t, l, "cpu") {
		t.Fatal("a cpu request without a cpu controller did not fail")
	}
	if err := l.Create(path, Limits{}); err != nil {
		t.Fatal(err)
	}
	sleep := start(t, "sleep", "60")
	if err := l.AddProc(path, sleep.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if own := readTrim(t, fmt.Sprintf("/proc/%d/cgroup", sleep.Process.Pid)); !strings.Contains(own, "0::"+path) {
		t.Fatalf("/proc/pid/cgroup does not name %s in v2:\n%s", path, own)
	}
	id, err := l.ID("cpu", path)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := NewResolver(l).Path("memory", id); !ok || got != path {
		t.Fatalf("Path = %q, %v; want %s (every controller is the unified tree)", got, ok, path)
	}
	if err := l.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := sleep.Wait(); err == nil {
		t.Fatal("sleep survived Remove")
	}
	if _, err := os.Stat(l.Dir("cpu", path)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s still there", l.Dir("cpu", path))
	}
}

func hasController(t *testing.T, l *Layout, c string) bool {
	t.Helper()
	return slices.Contains(strings.Fields(readTrim(t, filepath.Join(l.Unified, "cgroup.controllers"))), c)
}

func TestPruneLeavesASharedParentInUse(t *testing.T) {
	l, parent := testLayout(t)
	child := parent + "/busy"
	if err := l.Create(child, Limits{}); err != nil {
		t.Fatal(err)
	}
	if err := l.Prune(parent); err != nil {
		t.Fatalf("Prune of a parent with a child: %v", err)
	}
	if _, err := os.Stat(l.Dir("cpu", child)); err != nil {
		t.Fatalf("Prune removed a cgroup in use: %v", err)
	}
	if err := l.Remove(child); err != nil {
		t.Fatal(err)
	}
	if err := l.Prune(parent); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"cpu", "memory", "blkio"} {
		if _, err := os.Stat(l.Dir(c, parent)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("Prune left the empty %s cgroup %s: %v", c, parent, err)
		}
	}
}

// A cgroup kept out of swap, with its own swappiness that the cgroups below it copy (v1).
func TestNoSwapAndSwappiness(t *testing.T) {
	l, parent := testLayout(t)
	const mem = 64 << 20
	swappiness := 7
	if err := l.Create(parent, Limits{MemoryBytes: mem, NoSwap: true, Swappiness: &swappiness}); err != nil {
		t.Fatal(err)
	}
	if err := l.Create(parent+"/child", Limits{}); err != nil {
		t.Fatal(err)
	}
	if !l.V1 {
		if got := readTrim(t, filepath.Join(l.Dir(Unified, parent), "memory.swap.max")); got != "0" {
			t.Errorf("memory.swap.max = %s, want 0", got)
		}
		return
	}
	if memsw := filepath.Join(l.Dir(Memory, parent), "memory.memsw.limit_in_bytes"); fileExists(memsw) {
		if got := readTrim(t, memsw); got != strconv.Itoa(mem) {
			t.Errorf("memsw limit = %s, want %d", got, mem)
		}
	}
	for _, cg := range []string{parent, parent + "/child"} {
		if got := readTrim(t, filepath.Join(l.Dir(Memory, cg), "memory.swappiness")); got != "7" {
			t.Errorf("%s: memory.swappiness = %s, want 7", cg, got)
		}
	}
	if err := l.Create(parent+"/unbounded", Limits{NoSwap: true}); err == nil {
		t.Error("no swap without a memory limit on v1 was accepted")
	}
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }
