// Package tunertest holds what the backends' tests share: a scratch host root, a listing of a
// tree to compare before and after, and reading a setting.
package tunertest

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/nodectl/nodectl/host"

	"github.com/nodectl/nodectl/tuner"
)

// Scratch is a host whose root is an empty temporary directory and whose kernel is this
// machine's. With needRoot set, the test is skipped (saying why) unless it runs as root.
func Scratch(t *testing.T, needRoot string) host.FS {
	t.Helper()
	if needRoot != "" && os.Geteuid() != 0 {
		t.Skip("needs root: " + needRoot)
	}
	return host.FS{Root: t.TempDir(), Procfs: "/proc", Sysfs: "/sys", Cgroupfs: "/sys/fs/cgroup"}
}

// Tree lists every path below root with its mode, owner, and content or link target, to
// compare a scratch root before and after.
func Tree(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		line := fmt.Sprintf("%s %s %d:%d", strings.TrimPrefix(p, root), fi.Mode(), st.Uid, st.Gid)
		if fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			line += fmt.Sprintf(" %q", b)
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			l, _ := os.Readlink(p)
			line += " -> " + l
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Read reads s, failing the test on an error.
func Read(t *testing.T, s tuner.Setting) tuner.Value {
	t.Helper()
	v, err := s.Read(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return v
}
