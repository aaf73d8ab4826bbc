package nodefile

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodectl/nodectl/host"

	"github.com/nodectl/nodectl/tuner"
	"github.com/nodectl/nodectl/tuner/internal/tunertest"
)

const node = "/etc/daemon.conf.d/90-nodectl.conf"

func scratch(t *testing.T) host.FS { return tunertest.Scratch(t, "files owned by others") }

var tree = tunertest.Tree

func describe(b []byte, m fs.FileMode) string { return fmt.Sprintf("%q %04o", b, m) }

func read(t *testing.T, f File) tuner.Value {
	t.Helper()
	v, err := f.Read(describe)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// Each previous state survives a write and a restore exactly, as the tree below the root
// shows it, and reads the same again.
func TestWriteAndRestore(t *testing.T) {
	for name, tc := range map[string]struct {
		before   func(p string) error // nil: no file
		existing string               // a directory there before, when set
	}{
		"absent_no_dirs":     {},
		"absent_dir_existed": {existing: "/etc"},
		"file": {before: func(p string) error {
			if err := os.WriteFile(p, []byte("mine\n"), 0o600); err != nil {
				return err
			}
			if err := os.Chown(p, 1234, 5678); err != nil {
				return err
			}
			return os.Chmod(p, 0o640)
		}},
		"empty_file": {before: func(p string) error { return os.WriteFile(p, nil, 0o644) }},
		"link":       {before: func(p string) error { return os.Symlink("/dev/null", p) }},
	} {
		t.Run(name, func(t *testing.T) {
			h := scratch(t)
			f := New(h, node)
			if tc.existing != "" {
				if err := os.MkdirAll(h.Path(tc.existing), 0o700); err != nil {
					t.Fatal(err)
				}
			}
			if tc.before != nil {
				if err := os.MkdirAll(filepath.Dir(f.path()), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := tc.before(f.path()); err != nil {
					t.Fatal(err)
				}
			}
			before := tree(t, h.Root)
			prev := read(t, f)
			if prev.Present != (tc.before != nil) {
				t.Fatalf("reads %+v", prev)
			}
			want := []byte("ours\n")
			if err := f.Write(want, 0o644); err != nil {
				t.Fatal(err)
			}
			if v := read(t, f); !v.Present || v.Text != describe(want, 0o644) {
				t.Errorf("after write reads %+v", v)
			}
			if fi, err := os.Stat(f.path()); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 0 {
				t.Errorf("written file not root's: %v", err)
			}
			if ents, _ := os.ReadDir(filepath.Dir(f.path())); len(ents) != 1 {
				t.Errorf("the directory holds %v, want only the file", ents)
			}
			changed, err := f.Restore(prev)
			if err != nil || !changed {
				t.Fatalf("restore: changed %v, %v", changed, err)
			}
			if got := tree(t, h.Root); !slices.Equal(got, before) {
				t.Errorf("after restore:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(before, "\n"))
			}
			if v := read(t, f); v.Present != prev.Present || v.Text != prev.Text {
				t.Errorf("reads %+v after restore, want %+v", v, prev)
			}
			if changed, err := f.Restore(prev); err != nil || changed {
				t.Errorf("restoring again: changed %v, %v; want nothing to do", changed, err)
			}
		})
	}
}

// A directory that gained another file since stays when the absent value is restored.
func TestRestoreKeepsOthersFiles(t *testing.T) {
	h := scratch(t)
	f := New(h, node)
	prev := read(t, f)
	if err := f.Write([]byte("ours\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	other := h.Path("/etc/daemon.conf.d/10-other.conf")
	if err := os.WriteFile(other, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Restore(prev); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("another file in the directory is gone: %v", err)
	}
	if _, err := os.Lstat(f.path()); err == nil {
		t.Error("the file is still there")
	}
}

func TestErrors(t *testing.T) {
	h := host.FS{Root: t.TempDir()}
	f := New(h, node)
	if _, err := f.Restore(tuner.Value{Present: true, Text: "x", Data: []byte(`{"missing_dirs":["/etc"]}`)}); err == nil ||
		!strings.Contains(err.Error(), "no file data") {
		t.Errorf("restoring a present value without file data: %v", err)
	}
	if _, err := f.Restore(tuner.Value{Data: []byte(`{`)}); err == nil || !strings.Contains(err.Error(), "decoding the recorded value") {
		t.Errorf("restoring undecodable data: %v", err)
	}
	if err := os.MkdirAll(f.path(), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Read(describe); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("reading a directory: %v", err)
	}
}

// Changed dates the last write by the file's mtime and a removal by the nearest directory
// above that is left, which the removal updated.
func TestChanged(t *testing.T) {
	h := scratch(t)
	f := New(h, node)
	prev := read(t, f)
	if err := f.Write([]byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	written := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := os.Chtimes(h.Path(node), written, written); err != nil {
		t.Fatal(err)
	}
	if got, err := f.Changed(); err != nil || !got.Equal(written) {
		t.Errorf("Changed = %v, %v; want the file's mtime %v", got, err, written)
	}
	// Restore removes the file and /etc/daemon.conf.d, which the write made; /etc stays.
	if err := os.MkdirAll(h.Path("/etc/other"), 0o755); err != nil {
		t.Fatal(err)
	}
	start := time.Now().Add(-time.Second) // file times lag the clock by up to a tick
	if changed, err := f.Restore(prev); err != nil || !changed {
		t.Fatalf("Restore = %v, %v", changed, err)
	}
	got, err := f.Changed()
	fi, _ := os.Stat(h.Path("/etc"))
	if err != nil || !got.Equal(fi.ModTime()) || got.Before(start) {
		t.Errorf("Changed = %v, %v after the removal; want /etc's mtime %v, set by it", got, err, fi.ModTime())
	}
}
