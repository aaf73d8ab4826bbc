//go:build linux

package swapfile

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// scratch makes a directory for a test's swap file on a real disk: /var/tmp, as /tmp may be a
// tmpfs, which cannot hold swap. It is removed when the test ends.
func scratch(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/var/tmp", "nodectl-swap-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func TestSwapFile(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for swapon")
	}
	before, err := Active("/proc")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(scratch(t), "swap")
	f, err := Create(path, 32<<20+123)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Remove(); err != nil {
			t.Error(err)
		}
	})
	if f.Size != 32<<20 {
		t.Errorf("size %d, want it rounded down to 32 MiB", f.Size)
	}
	if _, err := Create(path, 32<<20); !errors.Is(err, ErrExists) {
		t.Errorf("creating over an existing file: %v, want ErrExists", err)
	}
	if err := f.Enable(40000); err == nil {
		t.Error("priority 40000 accepted")
	}
	if err := f.Enable(5); err != nil {
		t.Fatal(err)
	}
	on, err := Active("/proc")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(on, path) {
		t.Fatalf("%s not in the active swaps %v", path, on)
	}
	for range 2 { // the second is a no-op
		if err := f.Remove(); err != nil {
			t.Fatal(err)
		}
	}
	after, err := Active("/proc")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(before, after) {
		t.Fatalf("swaps %v after, %v before", after, before)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("swap file left behind: %v", err)
	}
}

func TestCreateTooSmall(t *testing.T) {
	if _, err := Create(filepath.Join(t.TempDir(), "swap"), 4096); err == nil {
		t.Fatal("a one-page swap file was made")
	}
}
