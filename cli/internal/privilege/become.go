package privilege

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Become makes the process uid:gid, keeping only the capabilities keep (by number), after
// giving uid the directories trees with everything below them, and the directories dirs
// themselves (CAP_CHOWN), so that it goes on writing there. Every thread changes: Go's setuid
// does, and the capability calls go through syscall.AllThreadsSyscall, which needs a binary
// built without cgo (nodectl's is).
func Become(uid, gid int, keep []int, trees, dirs []string) error {
	for _, dir := range trees {
		if err := giveTree(dir, uid, gid); err != nil {
			return fmt.Errorf("giving %s to uid %d: %w", dir, uid, err)
		}
	}
	for _, dir := range dirs {
		if err := os.Lchown(dir, uid, gid); err != nil {
			return fmt.Errorf("giving %s to uid %d: %w", dir, uid, err)
		}
	}
	// Capabilities survive the change of uid only with keep-caps set, on every thread.
	if err := allThreads(unix.SYS_PRCTL, unix.PR_SET_KEEPCAPS, 1, 0); err != nil {
		return fmt.Errorf("keeping capabilities across the change of user: %w", err)
	}
	if err := syscall.Setgroups(nil); err != nil {
		return fmt.Errorf("dropping supplementary groups: %w", err)
	}
	if err := syscall.Setresgid(gid, gid, gid); err != nil {
		return fmt.Errorf("becoming gid %d: %w", gid, err)
	}
	if err := syscall.Setresuid(uid, uid, uid); err != nil {
		return fmt.Errorf("becoming uid %d: %w", uid, err)
	}
	// The change of uid emptied the effective set; the permitted one is cut to keep and
	// raised again, so nothing else can come back.
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	for _, c := range keep {
		data[c/32].Permitted |= 1 << (c % 32)
		data[c/32].Effective |= 1 << (c % 32)
	}
	if err := allThreads(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); err != nil {
		return fmt.Errorf("keeping capabilities %v: %w", keep, err)
	}
	return allThreads(unix.SYS_PRCTL, unix.PR_SET_KEEPCAPS, 0, 0)
}

// giveTree gives dir and all below it to uid:gid, children before their directory: root
// without CAP_DAC_READ_SEARCH may not list a directory once it is another's (mode 0750). A dir
// already uid's was given at an earlier start, and all in it written by uid since.
func giveTree(dir string, uid, gid int) error {
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		return &os.PathError{Op: "stat", Path: dir, Err: err}
	}
	if int(st.Uid) == uid && int(st.Gid) == gid {
		return nil
	}
	var paths []string
	err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		paths = append(paths, p)
		return err
	})
	if err != nil {
		return err
	}
	for _, p := range slices.Backward(paths) {
		if err := os.Lchown(p, uid, gid); err != nil {
			return err
		}
	}
	return nil
}

func allThreads(trap, a1, a2, a3 uintptr) error {
	if _, _, errno := syscall.AllThreadsSyscall(trap, a1, a2, a3); errno != 0 {
		if errno == syscall.ENOTSUP {
			return errors.New("this binary was built with cgo: only one built without can change every thread's capabilities")
		}
		return errno
	}
	return nil
}
