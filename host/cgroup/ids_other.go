//go:build !linux

package cgroup

import (
	"io/fs"
	"path/filepath"
	"syscall"
)

// cgroupIDs calls fn with the path below root (from "/") and the inode number of root and of
// every directory below it; a directory removed during the walk is passed over.
func cgroupIDs(root string, fn func(rel string, id uint64)) {
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		var st syscall.Stat_t
		if syscall.Stat(p, &st) != nil {
			return filepath.SkipDir
		}
		if rel, err := filepath.Rel(root, p); err == nil {
			fn(filepath.Join("/", rel), st.Ino)
		}
		return nil
	})
}
