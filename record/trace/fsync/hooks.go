package fsync

import (
	"fmt"
	"strings"

	"github.com/prometheus/procfs"
)

// ChooseHooks picks HooksExt4 when every writable filesystem on a block device in the host's
// mount table (that of pid 1 under procfsDir, "" meaning /proc) is ext4, so that every fsync
// that reaches a disk passes ext4_sync_file; else HooksSyscalls. why says which.
func ChooseHooks(procfsDir string) (h Hooks, why string, err error) {
	if procfsDir == "" {
		procfsDir = procfs.DefaultMountPoint
	}
	fs, err := procfs.NewFS(procfsDir)
	if err != nil {
		return "", "", fmt.Errorf("opening procfs %s: %w", procfsDir, err)
	}
	p, err := fs.Proc(1)
	if err != nil {
		return "", "", fmt.Errorf("choosing fsync hooks: %w", err)
	}
	mounts, err := p.MountInfo()
	if err != nil {
		return "", "", fmt.Errorf("choosing fsync hooks: reading pid 1's mounts: %w", err)
	}
	return chooseHooks(mounts)
}

// chooseHooks is ChooseHooks on a mount table.
func chooseHooks(mounts []*procfs.MountInfo) (Hooks, string, error) {
	for _, m := range mounts {
		major, _, ok := strings.Cut(m.MajorMinorVer, ":")
		if !ok {
			return "", "", fmt.Errorf("choosing fsync hooks: mount %s has device %q, want MAJ:MIN", m.MountPoint, m.MajorMinorVer)
		}
		_, ro := m.Options["ro"]
		if major == "0" || ro || m.FSType == "ext4" {
			continue // no disk behind it, nothing to sync, or ext4
		}
		return HooksSyscalls, fmt.Sprintf("%s on %s (%s) is writable and not ext4", m.Source, m.MountPoint, m.FSType), nil
	}
	return HooksExt4, "every writable filesystem on a block device is ext4", nil
}
