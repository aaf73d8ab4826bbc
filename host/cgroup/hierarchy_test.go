//go:build linux

package cgroup

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
)

// plainTree writes files (path -> content) below a new directory, a v2 hierarchy of plain
// files, and returns its root.
func plainTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for f, c := range files {
		p := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestHierarchyOnPlainFiles(t *testing.T) {
	root := plainTree(t, map[string]string{
		"cgroup.subtree_control":          "cpu memory\n",
		"cpuset.cpus.effective":           "0-3\n",
		"kubepods/cgroup.subtree_control": "cpu cpuset\n",
		"kubepods/pod/cpuset.cpus":        "1-2\n",
		"kubepods/pod/cgroup.procs":       "7\n9\n",
		"kubepods/idle/cgroup.procs":      "",
	})
	h := Hierarchy{Root: root, Controller: CPUSet, V2: true}

	for p, want := range map[string]bool{"/": false, "/kubepods": true} {
		if on, err := h.Enabled(p); err != nil || on != want {
			t.Errorf("Enabled(%s) = %v, %v; want %v", p, on, err, want)
		}
	}
	if err := h.Enable("/kubepods"); err != nil {
		t.Fatal(err)
	}
	if got := readTrim(t, filepath.Join(root, "kubepods/cgroup.subtree_control")); got != "cpu cpuset" {
		t.Errorf("enabling where it is on already wrote: %q", got)
	}
	if err := h.Enable("/"); err != nil {
		t.Fatal(err)
	}
	if on, err := h.Enabled("/"); err != nil || !on {
		t.Errorf("after Enable, Enabled(/) = %v, %v", on, err)
	}
	if err := h.Disable("/"); err != nil {
		t.Fatal(err)
	}
	if got := readTrim(t, filepath.Join(root, "cgroup.subtree_control")); got != "-cpuset" {
		t.Errorf("Disable wrote %q, want -cpuset", got)
	}

	// Without the controller (no file) a v2 cgroup's cpus read as "".
	for p, want := range map[string]string{"/kubepods/pod": "1-2", "/kubepods/idle": ""} {
		if got, err := h.CPUs(p); err != nil || got != want {
			t.Errorf("CPUs(%s) = %q, %v; want %q", p, got, err, want)
		}
	}
	if err := h.SetCPUs("/kubepods/pod", "2"); err != nil {
		t.Fatal(err)
	}
	if got, err := h.CPUs("/kubepods/pod"); err != nil || got != "2" {
		t.Errorf("after SetCPUs, CPUs = %q, %v", got, err)
	}
	if got, err := h.EffectiveCPUs("/"); err != nil || got != "0-3" {
		t.Errorf("EffectiveCPUs(/) = %q, %v", got, err)
	}

	if got, err := h.Procs("/kubepods/pod"); err != nil || !slices.Equal(got, []int{7, 9}) {
		t.Errorf("Procs = %v, %v; want 7 and 9", got, err)
	}
	if err := h.AddProc("/kubepods/idle", 7); err != nil {
		t.Fatal(err)
	}
	if got, err := h.Procs("/kubepods/idle"); err != nil || !slices.Equal(got, []int{7}) {
		t.Errorf("after AddProc, Procs = %v, %v; want 7", got, err)
	}

	var walked []string
	if err := h.Walk("/kubepods", func(p string) error { walked = append(walked, p); return nil }); err != nil {
		t.Fatal(err)
	}
	if want := []string{"/kubepods", "/kubepods/idle", "/kubepods/pod"}; !reflect.DeepEqual(walked, want) {
		t.Errorf("walked %v, want %v", walked, want)
	}
	if got, err := h.Children("/kubepods"); err != nil || !reflect.DeepEqual(got, []string{"/kubepods/idle", "/kubepods/pod"}) {
		t.Errorf("Children = %v, %v", got, err)
	}

	// Created twice, the second time leaves it; pruned while it holds files, it stays.
	for range 2 {
		if err := h.Create("/new"); err != nil {
			t.Fatal(err)
		}
	}
	if !h.Exists("/new") {
		t.Fatal("Create made nothing")
	}
	if err := h.Prune("/kubepods"); err != nil || !h.Exists("/kubepods") {
		t.Errorf("Prune of a cgroup in use: %v, exists %v", err, h.Exists("/kubepods"))
	}
	if err := h.Remove("/new"); err != nil || h.Exists("/new") {
		t.Errorf("Remove: %v, exists %v", err, h.Exists("/new"))
	}
	if err := h.Create("/"); err == nil {
		t.Error("Create(/) did not fail")
	}
}

// A v1 cpuset starts empty: Create gives it its parent's CPUs and memory nodes.
func TestHierarchyCreateV1CpusetOnPlainFiles(t *testing.T) {
	root := plainTree(t, map[string]string{
		"nodectl/cpuset.cpus": "0-1\n",
		"nodectl/cpuset.mems": "0\n",
	})
	h := Hierarchy{Root: root, Controller: CPUSet}
	if err := h.Create("/nodectl/system"); err != nil {
		t.Fatal(err)
	}
	for f, want := range map[string]string{"cpuset.cpus": "0-1", "cpuset.mems": "0"} {
		if got := readTrim(t, filepath.Join(root, "nodectl/system", f)); got != want {
			t.Errorf("%s = %q, want %q", f, got, want)
		}
	}
	if on, err := h.Enabled("/nodectl"); err != nil || !on {
		t.Errorf("a v1 cgroup does not have its hierarchy's controller: %v, %v", on, err)
	}
}

// On the host's v1 cpuset hierarchy: a cgroup made below nodectl's parent gets CPUs and takes
// a process; once that has exited the cgroup goes.
func TestHierarchyOnTheHost(t *testing.T) {
	l, parent := testLayout(t)
	h, err := l.Hierarchy(CPUSet)
	if err != nil {
		t.Skipf("no cpuset hierarchy: %v", err)
	}
	if h.V2 {
		t.Skip("cpuset is on the v2 hierarchy, where enabling it at the root would outlive the test")
	}
	for _, p := range []string{Parent, parent, parent + "/pinned"} {
		if err := h.Create(p); err != nil {
			t.Fatal(err)
		}
	}
	path := parent + "/pinned"
	if err := h.SetCPUs(path, "0"); err != nil {
		t.Fatal(err)
	}
	cmd := start(t, "sleep", "30")
	if err := h.AddProc(path, cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if got, err := h.Procs(path); err != nil || !slices.Equal(got, []int{cmd.Process.Pid}) {
		t.Errorf("Procs = %v, %v; want %d", got, err, cmd.Process.Pid)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if err := h.Remove(path); err != nil || h.Exists(path) {
		t.Errorf("Remove: %v, exists %v", err, h.Exists(path))
	}
}
