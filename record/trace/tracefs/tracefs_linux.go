//go:build linux

package tracefs

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Mount is tracefs as Ensure found or made it.
type Mount struct {
	dir     string
	mounted bool
}

// Ensure makes tracefs available: it mounts it at dir unless Find finds it anywhere. Release
// undoes only what Ensure did. cilium/ebpf looks tracefs up once per process, in a copy of
// the mount table it takes at the first BPF object load, so Ensure must run before anything
// loads; a mount at DefaultDir it also finds later.
func Ensure(dir string) (*Mount, error) {
	if found, ok := Find(); ok {
		return &Mount{dir: found}, nil
	}
	if err := unix.Mount("tracefs", dir, "tracefs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return nil, fmt.Errorf("mounting tracefs at %s: %w", dir, err)
	}
	return &Mount{dir: dir, mounted: true}, nil
}

// Find returns the tracefs directory that cilium/ebpf (v0.22, internal/tracefs) would use, in
// its order: the first whole tracefs mount in /proc/self/mountinfo wherever it is, then the
// tracing directory of the first whole debugfs mount, then /sys/kernel/tracing or
// /sys/kernel/debug/tracing by filesystem type.
func Find() (string, bool) {
	if dir := fromMountinfo(); dir != "" {
		return dir, true
	}
	for _, c := range []struct {
		dir   string
		types []int64
	}{
		{DefaultDir, []int64{unix.TRACEFS_MAGIC}},
		{"/sys/kernel/debug/tracing", []int64{unix.TRACEFS_MAGIC, unix.DEBUGFS_MAGIC}},
	} {
		var st unix.Statfs_t
		if unix.Statfs(c.dir, &st) == nil && slices.Contains(c.types, int64(st.Type)) {
			return c.dir, true
		}
	}
	return "", false
}

// fromMountinfo returns the first tracefs mount of the whole filesystem (root "/", not a bind
// mount of a subdirectory), else the tracing directory of the first such debugfs mount.
func fromMountinfo() string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	var debugfs []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent dev root point options [optional...] - fstype source super-options
		before, after, ok := strings.Cut(sc.Text(), " - ")
		l, r := strings.Fields(before), strings.Fields(after)
		if !ok || len(l) < 5 || len(r) < 1 || unescape(l[3]) != "/" {
			continue
		}
		switch point := unescape(l[4]); r[0] {
		case "tracefs":
			return point
		case "debugfs":
			debugfs = append(debugfs, point)
		}
	}
	for _, d := range debugfs {
		if fi, err := os.Stat(filepath.Join(d, "tracing")); err == nil && fi.IsDir() {
			return filepath.Join(d, "tracing")
		}
	}
	return ""
}

// unescape undoes the octal escapes mountinfo uses for space, tab, newline and backslash.
var unescape = strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace

// Adopt takes over a tracefs mount at dir that an earlier process made with Ensure and could not
// release (it was killed), so that Release unmounts it. Anything else at dir is left alone.
func Adopt(dir string) *Mount {
	var st unix.Statfs_t
	return &Mount{dir: dir, mounted: unix.Statfs(dir, &st) == nil && int64(st.Type) == unix.TRACEFS_MAGIC}
}

// Dir is where tracefs is, "" for a nil Mount.
func (m *Mount) Dir() string {
	if m == nil {
		return ""
	}
	return m.dir
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
