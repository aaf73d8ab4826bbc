//go:build linux

package tracefs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Mount is tracefs as Ensure found or made it.
type Mount struct {
	dir     string
	mounted bool
}

// Ensure makes tracefs available: it mounts it at dir unless it is already there, at dir or at
// debug/tracing beside dir (/sys/kernel/debug/tracing, where debugfs carries it). Release
// undoes only what Ensure did. Look-ups of tracepoints may be cached for the life of the
// process (cilium/ebpf does), so Ensure must run before the first attach.
func Ensure(dir string) (*Mount, error) {
	if Available(dir) {
		return &Mount{dir: dir}, nil
	}
	if err := unix.Mount("tracefs", dir, "tracefs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return nil, fmt.Errorf("mounting tracefs at %s: %w", dir, err)
	}
	return &Mount{dir: dir, mounted: true}, nil
}

// Available reports whether tracefs's events are at dir or at debug/tracing beside it.
func Available(dir string) bool {
	for _, d := range []string{dir, filepath.Join(filepath.Dir(dir), "debug", "tracing")} {
		if fi, err := os.Stat(filepath.Join(d, "events")); err == nil && fi.IsDir() {
			return true
		}
	}
	return false
}

// Mounted reports whether Ensure mounted tracefs, so that Release will unmount it.
func (m *Mount) Mounted() bool { return m != nil && m.mounted }

// Release unmounts tracefs if Ensure mounted it; while a file in it is open the unmount is
// lazy. It is safe to call more than once, and on a nil Mount.
func (m *Mount) Release() error {
	if !m.Mounted() {
		return nil
	}
	err := unix.Unmount(m.dir, 0)
	if errors.Is(err, unix.EBUSY) {
		err = unix.Unmount(m.dir, unix.MNT_DETACH)
	}
	if err != nil {
		return fmt.Errorf("unmounting tracefs at %s: %w", m.dir, err)
	}
	m.mounted = false
	return nil
}
