//go:build linux

package swapfile

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/nodectl/nodectl/host/blockdev"
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
	if i < 0 || areas[i].Priority != 9 || areas[i].Size != 32<<20-4096 || areas[i].Type != "file" {
		t.Fatalf("areas %+v, want the file %s at priority 9 with 32 MiB less the header page", areas, path)
	}
	if disk, want := Disk("/proc", "/sys", areas[i]), diskOf(t, dir); disk != want {
		t.Errorf("the swap file's disk %q, want %q (its directory's)", disk, want)
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

// An agent in a container reads the host's swap paths, which its root does not hold: a device
// is found by its name in sysfs, a file by the host's mount table.
func TestDiskFromTheHostsTables(t *testing.T) {
	procfs, sysfs := t.TempDir(), t.TempDir()
	write := func(path, text string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(procfs, "1", "mountinfo"), `22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 0:26 / /tmp rw,nosuid - tmpfs tmpfs rw
31 22 8:17 / /mnt/disks/ssd0 rw,relatime - ext4 /dev/sdb1 rw
32 22 8:33 / /mnt/disks/ssd rw,relatime - ext4 /dev/sdc1 rw
`)
	write(filepath.Join(sysfs, "class", "block", "nvme0n1", "dev"), "259:0\n")
	for _, tc := range []struct {
		area Area
		want string
	}{
		{Area{Path: "/nodectl-test-absent/mnt/disks/ssd0/swapfile", Type: "file"}, "8:1"},
		{Area{Path: "/mnt/disks/ssd0/nodectl-test-absent/swap", Type: "file"}, "8:17"},
		{Area{Path: `/mnt/disks/ssd0/nodectl\040test-absent`, Type: "file"}, "8:17"},
		{Area{Path: "/mnt/disks/ssd0x/nodectl-test-absent", Type: "file"}, "8:1"},
		{Area{Path: "/tmp/nodectl-test-absent", Type: "file"}, ""},
		{Area{Path: "/dev/nodectl-test-absent/nvme0n1", Type: "partition"}, "259:0"},
		{Area{Path: "/dev/nodectl-test-absent/sdz", Type: "partition"}, ""},
	} {
		if got := Disk(procfs, sysfs, tc.area); got != tc.want {
			t.Errorf("Disk(%s %s) = %q, want %q", tc.area.Type, tc.area.Path, got, tc.want)
		}
	}
}

// diskOf is the whole disk holding dir, as the tracers name it.
func diskOf(t *testing.T, dir string) string {
	t.Helper()
	d, err := blockdev.ForPath("/sys", dir)
	if err != nil {
		t.Fatal(err)
	}
	return d
}
