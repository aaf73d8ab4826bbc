//go:build linux

package cgroup

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// fileIDKernfs is the file handle type of kernfs (cgroupfs v1 and v2): the node's 64-bit id.
const fileIDKernfs = 0xfe

// byHandle opens the cgroup with id in the hierarchy mounted at root by file handle and
// returns its path below root. errGone means there is no such cgroup; other errors mean the
// kernel would not say (no CAP_DAC_READ_SEARCH, no export support, outside this mount).
func byHandle(root string, id uint64) (string, error) {
	var out string
	err := openByHandle(root, id, func(mfd, fd int) error {
		// Both through /proc/self/fd, so symlinks in root (cpu -> cpu,cpuacct) resolve alike.
		top, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", mfd))
		if err != nil {
			return err
		}
		p, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(top, p)
		if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
			return fmt.Errorf("cgroup %d at %s is outside %s", id, p, top)
		}
		out = filepath.Join("/", rel)
		return nil
	})
	return out, err
}

// rootDir opens the hierarchy mounted at root, for byHandleExistsAt.
func rootDir(root string) (int, error) {
	return unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
}

// byHandleExistsAt is byHandle without the path, below the open root mfd: whether the kernel
// knows the cgroup, in one open, where the path takes two readlinks more (a churning node's
// forget sweep asks it of every id its maps hold, and opens the root once).
func byHandleExistsAt(mfd int, id uint64) error {
	fd, err := openAt(mfd, id)
	if err != nil {
		return err
	}
	return unix.Close(fd)
}

// openAt opens the cgroup with id below the open root mfd by file handle; errGone means there
// is no such cgroup.
func openAt(mfd int, id uint64) (int, error) {
	var b [8]byte
	binary.NativeEndian.PutUint64(b[:], id)
	fd, err := unix.OpenByHandleAt(mfd, unix.NewFileHandle(fileIDKernfs, b[:]), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC)
	if errors.Is(err, unix.ESTALE) || errors.Is(err, unix.ENOENT) {
		return -1, errGone
	}
	return fd, err
}

// openByHandle opens root and, by file handle, the cgroup with id below it, and calls fn with
// both descriptors, which it closes after.
func openByHandle(root string, id uint64, fn func(mfd, fd int) error) error {
	mfd, err := rootDir(root)
	if err != nil {
		return err
	}
	defer unix.Close(mfd)
	fd, err := openAt(mfd, id)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return fn(mfd, fd)
}
