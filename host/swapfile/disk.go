package swapfile

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/prometheus/procfs"

	"github.com/nodectl/nodectl/host/blockdev"
	"github.com/nodectl/nodectl/internal/procpath"
)

// Disk is the whole disk ("MAJ:MIN") whose requests serve a swap area: a partition's disk, or
// the disk of the filesystem a swap file lives in; "" when neither can be found (a swap file on
// a filesystem without a block device, or a device name sysfs does not list). An agent in a
// container reads the host's /proc/swaps paths, which its own root may not hold: a device is
// then found by its name in sysfs, and a file by the host's mount table (<procfsDir>/1/mountinfo,
// the mounts of the host's first process).
func Disk(procfsDir, sysfsDir string, a Area) string {
	if sysfsDir == "" {
		sysfsDir = "/sys"
	}
	path := procpath.Unescape(a.Path)
	if dev, err := blockdev.ForPath(sysfsDir, path); err == nil {
		return dev
	}
	if a.Type == "partition" {
		b, err := os.ReadFile(filepath.Join(sysfsDir, "class", "block", filepath.Base(path), "dev"))
		if err != nil {
			return ""
		}
		return blockdev.WholeDisk(sysfsDir, strings.TrimSpace(string(b)))
	}
	fs, err := procfs.NewFS(procfsDir)
	if err != nil {
		return ""
	}
	mounts, err := fs.GetProcMounts(1)
	if err != nil {
		return ""
	}
	// The mount holding the file: the longest mount point that is the path or its parent.
	var best *procfs.MountInfo
	for _, m := range mounts {
		if !holds(m.MountPoint, path) || best != nil && len(m.MountPoint) < len(best.MountPoint) {
			continue
		}
		best = m
	}
	if best == nil || strings.HasPrefix(best.MajorMinorVer, "0:") {
		return "" // no mount, or one without a block device (tmpfs, overlay, btrfs's anonymous device)
	}
	return blockdev.WholeDisk(sysfsDir, best.MajorMinorVer)
}

// holds says whether a mount at point holds path.
func holds(point, path string) bool {
	return point == "/" || path == point || strings.HasPrefix(path, strings.TrimSuffix(point, "/")+"/")
}
