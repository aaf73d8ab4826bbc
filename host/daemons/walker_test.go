package daemons

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodectl/nodectl/host/cgroup"
)

// replace makes pid a new process p in the fake procfs root: a new directory, made before the
// old one goes so that the filesystem cannot hand the old inode number on.
func replace(t *testing.T, root string, pid int, p proc) {
	t.Helper()
	fresh := fakeProcfs(t, map[int]proc{pid: p})
	dir := filepath.Join(root, strconv.Itoa(pid))
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(fresh, strconv.Itoa(pid)), dir); err != nil {
		t.Fatal(err)
	}
}

// execIn changes pid's comm and executable in place, as an exec does: same directory, same
// start time.
func execIn(t *testing.T, root string, pid int, comm, exe string) {
	t.Helper()
	dir := filepath.Join(root, strconv.Itoa(pid))
	if err := os.WriteFile(filepath.Join(dir, "comm"), []byte(comm+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	stat, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		t.Fatal(err)
	}
	open, end := strings.IndexByte(string(stat), '('), strings.LastIndexByte(string(stat), ')')
	if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(string(stat[:open+1])+comm+string(stat[end:])), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"exe", "cmdline"} {
		os.Remove(filepath.Join(dir, f))
	}
	if err := os.Symlink(exe, filepath.Join(dir, "exe")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cmdline"), []byte(exe+"\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func names(ds []Daemon) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.Name)
	}
	return out
}

// A Walker reads the comms of new processes only, once for a process settledAge old, and still
// finds a daemon that took a pid again, that exec'd between its fork and the walk after, or in
// place later (at a reread).
func TestWalker(t *testing.T) {
	root := fakeProcfs(t, map[int]proc{
		1:   {comm: "systemd", exe: "/usr/lib/systemd/systemd", cpu: "/", unified: "/init.scope"},
		100: {comm: "kubelet", exe: "/usr/bin/kubelet", cpu: "/system.slice/kubelet.service", unified: "/system.slice/kubelet.service"},
		200: {comm: "bash", exe: "/usr/bin/bash", cpu: "/user.slice", unified: "/user.slice"},
		// Forked by systemd 50ms before the walk (the fake's uptime is 1000s), not yet exec'd.
		300: {comm: "(containerd)", exe: "/usr/lib/systemd/systemd", start: 99995, cpu: "/system.slice/containerd.service", unified: "/system.slice/containerd.service"},
		400: {comm: "sh", exe: "/usr/bin/dash", cpu: "/system.slice/wrapped.service", unified: "/system.slice/wrapped.service"},
	})
	w := NewWalker(root, []string{"kubelet", "containerd"})
	l := &cgroup.Layout{V1: true}
	walk := func(want ...string) (reads int) {
		t.Helper()
		before := w.seen.reads
		got, _, err := w.Find(l)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(names(got), want) && !(len(got) == 0 && len(want) == 0) {
			t.Fatalf("walk %d found %v, want %v", w.walks, names(got), want)
		}
		return w.seen.reads - before
	}
	if n := walk("kubelet"); n != 5 {
		t.Errorf("first walk read %d comms, want all 5", n)
	}
	execIn(t, root, 300, "containerd", "/usr/bin/containerd")
	// The young 300 is read again: it exec'd since and is found.
	if n := walk("kubelet", "containerd"); n != 1 {
		t.Errorf("second walk read %d comms, want 300's alone (the others were old at their first read)", n)
	}
	// 300 read two ways: once more.
	if n := walk("kubelet", "containerd"); n != 1 {
		t.Errorf("third walk read %d comms, want 1", n)
	}
	if n := walk("kubelet", "containerd"); n != 0 {
		t.Errorf("fourth walk read %d comms, want none", n)
	}
	// The kubelet restarted as pid 200 (a pid taken again): a new directory, read.
	replace(t, root, 200, proc{comm: "kubelet", exe: "/usr/bin/kubelet", cpu: "/system.slice/kubelet2.service", unified: "/system.slice/kubelet2.service"})
	if err := os.RemoveAll(filepath.Join(root, "100")); err != nil {
		t.Fatal(err)
	}
	if n := walk("kubelet", "containerd"); n != 1 {
		t.Errorf("walk after a restart read %d comms, want the new process's alone", n)
	}
	if got, _, _ := w.Find(l); len(got) == 0 || got[0].PIDs[0] != 200 {
		t.Fatalf("the restarted kubelet: found %+v, want pid 200", got)
	}
	// An exec in place in a process read twice already (a wrapper script's) is seen at the
	// walk that reads all.
	execIn(t, root, 400, "kubelet", "/usr/bin/kubelet")
	for w.walks%rereadEvery != 0 {
		walk("kubelet", "containerd")
	}
	got, _, err := w.Find(l)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[1].Name != "kubelet-1" || got[1].PIDs[0] != 400 {
		t.Errorf("at the reread: found %+v, want pid 400's kubelet too", got)
	}
	// The reread confirmed the comms it read the same as the walk before: the next reads only
	// 400's, which it read anew.
	if n := walk("kubelet", "kubelet-1", "containerd"); n != 1 {
		t.Errorf("the walk after the reread read %d comms, want 1", n)
	}
	if n := walk("kubelet", "kubelet-1", "containerd"); n != 0 {
		t.Errorf("the second walk after the reread read %d comms, want none", n)
	}
}

// On this host's /proc: the directories' inode numbers hold from one walk to the next, so the
// third walk reads the comms of the processes started since alone (two walks confirm every
// comm whatever the processes' ages: a machine booted seconds ago has only young ones); a
// daemon started between two walks is found at the next.
func TestWalkerOnThisHost(t *testing.T) {
	const name = "nodectl-test-walkd"
	w := NewWalker("/proc", []string{name})
	l, err := cgroup.Detect("/sys/fs/cgroup")
	if err != nil {
		t.Skip(err)
	}
	for range 2 {
		if _, _, err := w.Find(l); err != nil {
			t.Fatal(err)
		}
	}
	entries, err := pidEntries("/proc")
	if err != nil {
		t.Fatal(err)
	}
	before := w.seen.reads
	if _, _, err := w.Find(l); err != nil {
		t.Fatal(err)
	}
	n := w.seen.reads - before
	t.Logf("the third walk read %d comms of %d processes", n, len(entries))
	if n > len(entries)/2 {
		t.Error("the inode numbers did not hold")
	}
	d := start(t, name)
	// The agent's walks are a minute apart: this one comes once the exec is done.
	comm := filepath.Join("/proc", strconv.Itoa(d.Process.Pid), "comm")
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if b, _ := os.ReadFile(comm); string(b) == name[:commLen]+"\n" {
			break
		}
	}
	found, inRoot, err := w.Find(l)
	if err != nil {
		t.Fatal(err)
	}
	// A test run in the root cgroup finds its daemon there.
	if (len(found) != 1 || found[0].PIDs[0] != d.Process.Pid) && !reflect.DeepEqual(inRoot, []string{name}) {
		t.Errorf("found %+v (in the root cgroup: %v), want %s, pid %d", found, inRoot, name, d.Process.Pid)
	}
}

// BenchmarkWalk compares, beside 500 more processes, Procs's walk (every comm read) with a
// Walker's once warm (the comms of new processes alone, every comm at each rereadEvery-th), in
// one run: ns a walk each, and the ratio (use a multiple of rereadEvery walks: -benchtime 50x).
func BenchmarkWalk(b *testing.B) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		b.Skip("no sleep")
	}
	for range 500 {
		c := exec.Command(sleep, "600")
		if err := c.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Process.Kill(); c.Wait() })
	}
	l, err := cgroup.Detect("/sys/fs/cgroup")
	if err != nil {
		b.Skip(err)
	}
	names := Default
	w := NewWalker("/proc", names)
	for range 2 { // warm: every comm read twice
		if _, _, err := w.Find(l); err != nil {
			b.Fatal(err)
		}
	}
	var full, walker time.Duration
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		if _, _, err := Find("/proc", l, names); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, _, err := w.Find(l); err != nil { // every rereadEvery-th reads all, as the agent's
			b.Fatal(err)
		}
		full, walker = full+t1.Sub(t0), walker+time.Since(t1)
	}
	b.ReportMetric(float64(full.Nanoseconds())/float64(b.N), "find-ns/walk")
	b.ReportMetric(float64(walker.Nanoseconds())/float64(b.N), "walker-ns/walk")
	b.ReportMetric(float64(walker)/float64(full), "walker/find")
}

// TestWalkerWithoutUptime: a procfs whose uptime cannot be read says so, not that a comm could
// not be read.
func TestWalkerWithoutUptime(t *testing.T) {
	root := fakeProcfs(t, map[int]proc{
		1:   {comm: "systemd", exe: "/usr/lib/systemd/systemd", cpu: "/", unified: "/init.scope"},
		100: {comm: "kubelet", exe: "/usr/bin/kubelet", cpu: "/system.slice/kubelet.service", unified: "/system.slice/kubelet.service"},
	})
	if err := os.Remove(filepath.Join(root, "uptime")); err != nil {
		t.Fatal(err)
	}
	_, _, err := NewWalker(root, []string{"kubelet"}).Find(&cgroup.Layout{V1: true})
	if err == nil || !strings.Contains(err.Error(), "uptime") || strings.Contains(err.Error(), "reading comm") {
		t.Errorf("Find without an uptime: %v; want the uptime named, not a comm", err)
	}
}
