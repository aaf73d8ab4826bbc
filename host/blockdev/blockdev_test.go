package blockdev

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

func TestName(t *testing.T) {
	for name, tc := range map[string]struct {
		dev  uint32
		want string
	}{
		"virtio_disk":  {254<<20 | 0, "254:0"},
		"scsi_part":    {8<<20 | 1, "8:1"},
		"large_minor":  {259<<20 | 1048575, "259:1048575"},
		"anonymous_fs": {0<<20 | 45, "0:45"},
	} {
		t.Run(name, func(t *testing.T) {
			if got := Name(tc.dev); got != tc.want {
				t.Errorf("Name(%#x) = %q, want %q", tc.dev, got, tc.want)
			}
		})
	}
}

// fakeSysfs lays out a disk 8:0 (sda) with a partition 8:1 (sda1) as sysfs does: the
// partition's directory inside the disk's, both reached through /sys/dev/block links.
func fakeSysfs(t *testing.T) string {
	root := t.TempDir()
	disk := filepath.Join(root, "devices", "pci0", "block", "sda")
	part := filepath.Join(disk, "sda1")
	for _, f := range []struct{ path, body string }{
		{filepath.Join(disk, "dev"), "8:0\n"},
		{filepath.Join(part, "dev"), "8:1\n"},
		{filepath.Join(part, "partition"), "1\n"},
	} {
		if err := os.MkdirAll(filepath.Dir(f.path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f.path, []byte(f.body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	links := filepath.Join(root, "dev", "block")
	if err := os.MkdirAll(links, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{
		"8:0": "../../devices/pci0/block/sda",
		"8:1": "../../devices/pci0/block/sda/sda1",
	} {
		if err := os.Symlink(target, filepath.Join(links, name)); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestWholeDisk(t *testing.T) {
	sysfs := fakeSysfs(t)
	for name, tc := range map[string]struct{ in, want string }{
		"partition":  {"8:1", "8:0"},
		"whole_disk": {"8:0", "8:0"},
		"unknown":    {"9:9", "9:9"},
	} {
		t.Run(name, func(t *testing.T) {
			if got := WholeDisk(sysfs, tc.in); got != tc.want {
				t.Errorf("WholeDisk(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestWholeDiskCached(t *testing.T) {
	sysfs := fakeSysfs(t)
	if got := WholeDisk(sysfs, "8:1"); got != "8:0" {
		t.Fatalf("WholeDisk(8:1) = %q, want 8:0", got)
	}
	// The answer survives the device's sysfs entry going away.
	if err := os.RemoveAll(filepath.Join(sysfs, "dev")); err != nil {
		t.Fatal(err)
	}
	if got := WholeDisk(sysfs, "8:1"); got != "8:0" {
		t.Errorf("cached WholeDisk(8:1) = %q, want 8:0", got)
	}
}

func TestForPath(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("needs Linux sysfs")
	}
	// The package directory: a checkout lives on a disk, where /tmp may be tmpfs.
	disk, err := ForPath("/sys", ".")
	if err != nil {
		t.Skipf("the checkout is not on a block device here: %v", err)
	}
	if _, err := os.Stat(filepath.Join("/sys/dev/block", disk)); err != nil {
		t.Errorf("ForPath gave %q, not a block device in sysfs: %v", disk, err)
	}
	if _, err := os.Stat(filepath.Join("/sys/dev/block", disk, "partition")); err == nil {
		t.Errorf("ForPath gave %q, a partition, not a whole disk", disk)
	}
}

func TestForPathWithoutBlockDevice(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("needs Linux sysfs")
	}
	// procfs never has a block device.
	if disk, err := ForPath("/sys", "/proc/self"); err == nil {
		t.Errorf("ForPath(/proc/self) = %q, want an error", disk)
	}
}
