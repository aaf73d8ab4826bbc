// Package host says where a node's filesystems are, so that the same code works on the machine
// itself, on /host in a DaemonSet and on a scratch tree in tests: every reader and writer of the
// node (stress runs, recordings, the tuner, the agent) takes an FS, never a literal path.
package host

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"syscall"

	securejoin "github.com/cyphar/filepath-securejoin"
)

// FS is where the node's filesystems are. Procfs, Sysfs, Cgroupfs and Tracefs are separate from
// Root because a test's scratch root still works on the machine's real kernel.
type FS struct {
	Root     string // the node's root filesystem: /etc, /var, /run are below it
	Procfs   string
	Sysfs    string
	Cgroupfs string // the cgroup filesystem's root (v1 hierarchies or the unified one below it)
	Tracefs  string // where tracefs is, or is to be mounted for the tracepoints that need it
}

// Default is the machine's own.
func Default() FS { return At("/") }

// At is the node whose root filesystem is root, with /proc, /sys and the rest below it.
func At(root string) FS {
	root = filepath.Clean(root)
	return FS{Root: root, Procfs: filepath.Join(root, "proc"), Sysfs: filepath.Join(root, "sys"),
		Cgroupfs: filepath.Join(root, "sys/fs/cgroup"), Tracefs: filepath.Join(root, "sys/kernel/tracing")}
}

// Path is p (an absolute path on the node) below the node's root. Below a root other than
// "/", the directories on the way are resolved inside the root, so that an absolute symlink on
// the node (/var/log -> /mnt/log) leads to the node's /mnt/log under /host, not to the
// container's; the last element is left as it is, so that a setting can see (and restore) a
// symlink there.
func (h FS) Path(p string) string {
	p = filepath.Join("/", p)
	if h.Root == "/" || h.Root == "" || p == "/" {
		return filepath.Join(h.Root, p)
	}
	dir, err := securejoin.SecureJoin(h.Root, filepath.Dir(p))
	if err != nil {
		// A symlink loop: the plain join fails on it the same way when used.
		return filepath.Join(h.Root, p)
	}
	return filepath.Join(dir, filepath.Base(p))
}

// Resolve is p below the node's root with every element resolved inside the root, the last
// one included: the directory a bind mount goes onto.
func (h FS) Resolve(p string) (string, error) {
	root := h.Root
	if root == "" {
		root = "/"
	}
	return securejoin.SecureJoin(root, p)
}

// Systemd reports whether systemd is the node's init, as sd_booted(3) decides.
func (h FS) Systemd() bool {
	fi, err := os.Stat(h.Path("/run/systemd/system"))
	return err == nil && fi.IsDir()
}

// MissingDirs are dir and its ancestors (node paths) that do not exist, outermost first: what
// a change records before it creates them, so that undoing it removes exactly those.
func (h FS) MissingDirs(dir string) []string {
	var out []string
	for ; dir != "/" && dir != "."; dir = path.Dir(dir) {
		if _, err := os.Lstat(h.Path(dir)); !errors.Is(err, fs.ErrNotExist) {
			break
		}
		out = append(out, dir)
	}
	slices.Reverse(out)
	return out
}

// RemoveDirs removes directories a change made (node paths, outermost first), innermost
// first; one that gained other files since stays, and so do its ancestors.
func (h FS) RemoveDirs(dirs []string) error {
	for _, dir := range slices.Backward(dirs) {
		err := os.Remove(h.Path(dir))
		if errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
			continue
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing directory %s: %w", dir, err)
		}
	}
	return nil
}
