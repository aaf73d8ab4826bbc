package blockdev

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ForPath is the whole disk "MAJ:MIN" holding path: the device of its filesystem, mapped with
// WholeDisk; for a block device node (a swap device), the device itself. A filesystem without a
// block device of its own (overlay, tmpfs, btrfs's anonymous device) is an error.
func ForPath(sysfs, path string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "", fmt.Errorf("finding the disk of %s: %w", path, &os.PathError{Op: "stat", Path: path, Err: err})
	}
	dev := st.Dev
	if st.Mode&unix.S_IFMT == unix.S_IFBLK {
		dev = st.Rdev
	}
	majmin := fmt.Sprintf("%d:%d", unix.Major(dev), unix.Minor(dev))
	if _, err := os.Stat(filepath.Join(sysfs, "dev", "block", majmin)); err != nil {
		return "", fmt.Errorf("finding the disk of %s: its filesystem is on device %s, which is not a block device (overlay, tmpfs, or another filesystem without one): %w", path, majmin, err)
	}
	return WholeDisk(sysfs, majmin), nil
}
