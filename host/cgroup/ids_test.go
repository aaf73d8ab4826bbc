package cgroup

import (
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// cgroupIDs finds the directories, and their inode numbers, that a walk with a stat each
// finds, and no file.
func TestCgroupIDsMatchAWalk(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"a/b/c", "a/d", "e", "f/g with space"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"cpu.stat", "a/cgroup.procs", "a/b/memory.max", "e/x"} {
		if err := os.WriteFile(filepath.Join(root, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]uint64{}
	if err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		want[filepath.Join("/", rel)] = st.Ino
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	cgroupIDs(root, func(rel string, id uint64) { got[rel] = id })
	if !maps.Equal(got, want) {
		t.Errorf("cgroupIDs found %v, want %v", got, want)
	}
	clear(got)
	cgroupIDs(filepath.Join(root, "missing"), func(rel string, id uint64) { got[rel] = id })
	if len(got) != 0 {
		t.Errorf("below a missing root: %v", got)
	}
}
