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

func TestOpenAndAreas(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for swapon")
	}
	dir := scratch(t)
	data := filepath.Join(dir, "data")
	if err := os.WriteFile(data, make([]byte, 1<<16), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(data, false); !errors.Is(err, ErrNotSwap) {
		t.Fatalf("opening a data file: %v, want ErrNotSwap", err)
	}
	path := filepath.Join(dir, "swap")
	if _, err := Create(path, 32<<20); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		on, _ := Active("/proc")
		g, err := Open(path, slices.Contains(on, path))
		if err == nil {
			err = g.Remove()
		}
		if err != nil {
			t.Error(err)
		}
	})
	f, err := Open(path, false)
	if err != nil {
		t.Fatal(err)
	}
	if f.Size != 32<<20 {
		t.Errorf("size %d from the header, want 32 MiB", f.Size)
	}
	if err := f.Enable(9); err != nil {
		t.Fatal(err)
	}
	areas, err := Areas("/proc")
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(areas, func(a Area) bool { return a.Path == path })
	if i < 0 || areas[i].Priority != 9 || areas[i].Size != 32<<20-4096 {
		t.Fatalf("areas %+v, want %s at priority 9 with 32 MiB less the header page", areas, path)
	}
	// Opened as on, Disable turns it off.
	g, err := Open(path, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Disable(); err != nil {
		t.Fatal(err)
	}
	if on, _ := Active("/proc"); slices.Contains(on, path) {
		t.Fatal("still on after Disable")
	}
}
