// Package nodefile is a file on the node that nodectl writes whole, such as a daemon's
// drop-in: its previous state (absent, with the directories that were missing for it; a
// regular file with its bytes, mode and owner; or a symlink) is recorded and put back
// exactly, and every write is atomic and durable, so the daemon reading it never sees half a
// file.
package nodefile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"syscall"
	"time"

	"github.com/google/renameio/v2"

	"github.com/nodectl/nodectl/host"
	"github.com/nodectl/nodectl/internal/atomicfile"
	"github.com/nodectl/nodectl/tuner"
)

// File is the file at a node path below a host's root.
type File struct {
	h    host.FS
	node string // the node path, e.g. /etc/systemd/journald.conf.d/90-nodectl.conf
}

// New is the file at the node path p on h.
func New(h host.FS, p string) File { return File{h: h, node: p} }

// path is the file's path as this process reaches it.
func (f File) path() string { return f.h.Path(f.node) }

// state is what a file was, as a tuner.Value's Data records it for Restore: a regular file's
// exact bytes, mode and owner, or a link's target; when there was nothing, the directories
// (node paths, outermost first) that were missing for it, which writing it makes.
type state struct {
	Bytes []byte      `json:"bytes,omitempty"`
	Mode  fs.FileMode `json:"mode,omitempty"`
	// Regular marks a regular file, whose mode may be 0000 (and so left out of the JSON).
	Regular bool     `json:"regular,omitempty"`
	UID     int      `json:"uid,omitempty"`
	GID     int      `json:"gid,omitempty"`
	Link    string   `json:"link,omitempty"`
	Missing []string `json:"missing_dirs,omitempty"`
}

// same reports whether s and o are the same file or link.
func (s state) same(o state) bool {
	return bytes.Equal(s.Bytes, o.Bytes) && s.Mode == o.Mode && s.UID == o.UID && s.GID == o.GID && s.Link == o.Link
}

// Read returns the file's value: absent, a symlink (Text "a link to <target>"), or a regular
// file whose Text is describe's of its bytes and mode. Data is what Restore needs. Errors say
// what failed, not which file: the caller names its setting and the path.
func (f File) Read(describe func(b []byte, mode fs.FileMode) string) (tuner.Value, error) {
	present, st, err := f.read()
	switch {
	case err != nil:
		return tuner.Value{}, err
	case !present:
		return tuner.Value{Data: st.data()}, nil
	case st.Link != "":
		return tuner.Value{Present: true, Text: "a link to " + st.Link, Data: st.data()}, nil
	}
	return tuner.Value{Present: true, Text: describe(st.Bytes, st.Mode), Data: st.data()}, nil
}

func (f File) read() (present bool, st state, err error) {
	fi, err := os.Lstat(f.path())
	if errors.Is(err, fs.ErrNotExist) {
		return false, state{Missing: f.h.MissingDirs(path.Dir(f.node))}, nil
	}
	if err != nil {
		return false, state{}, fmt.Errorf("reading: %w", err)
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		if st.Link, err = os.Readlink(f.path()); err != nil {
			return false, state{}, fmt.Errorf("reading: %w", err)
		}
	case fi.Mode().IsRegular():
		if st.Bytes, err = os.ReadFile(f.path()); err != nil {
			return false, state{}, fmt.Errorf("reading: %w", err)
		}
		st.Mode, st.Regular = fi.Mode().Perm(), true
		if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
			st.UID, st.GID = int(sys.Uid), int(sys.Gid)
		}
	default:
		return false, state{}, fmt.Errorf("not a regular file (%s)", fi.Mode().Type())
	}
	return true, st, nil
}

// Write makes the file exactly b, with mode, owned by root, making its directories first.
func (f File) Write(b []byte, mode fs.FileMode) error {
	return f.write(state{Bytes: b, Mode: mode})
}

// write replaces the file with st's file (internal/atomicfile) or link (renameio.Symlink), and
// syncs the directory, so a reader or a crash sees the old file or the new one whole. The
// temporary file is hidden and does not end in the daemon's suffix (.conf): no daemon reads it.
func (f File) write(st state) error {
	dir := filepath.Dir(f.path())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("making its directory: %w", err)
	}
	if st.Link != "" {
		err := renameio.Symlink(st.Link, f.path())
		if err == nil {
			err = atomicfile.SyncDir(dir)
		}
		if err != nil {
			return fmt.Errorf("writing: %w", err)
		}
		return nil
	}
	t, err := atomicfile.Create(f.path(), st.Mode)
	if err != nil {
		return fmt.Errorf("writing: %w", err)
	}
	defer t.Abort()
	_, err = t.Write(st.Bytes)
	if err == nil {
		err = t.Chown(st.UID, st.GID)
	}
	if err == nil {
		// Exact, as recorded: a chown may clear set-id bits the mode had.
		err = t.Chmod(st.Mode)
	}
	if err == nil {
		err = t.Commit()
	}
	if err != nil {
		return fmt.Errorf("writing: %w", err)
	}
	return nil
}

// Restore puts back the file prev, a value Read returned: the same file or link, or, when
// it was absent, no file and none of the directories that were missing then (those that
// gained other files stay). It reports whether it changed anything, so the caller restarts
// its daemon only then.
func (f File) Restore(prev tuner.Value) (changed bool, err error) {
	var want state
	if len(prev.Data) > 0 {
		if err := json.Unmarshal(prev.Data, &want); err != nil {
			return false, fmt.Errorf("decoding the recorded value: %w", err)
		}
	}
	if prev.Present && !want.Regular && want.Mode == 0 && want.Link == "" {
		return false, fmt.Errorf("the recorded value %q has no file data to restore", prev.Text)
	}
	present, have, err := f.read()
	if err != nil {
		return false, err
	}
	if prev.Present {
		if present && have.same(want) {
			return false, nil
		}
		if err := f.write(want); err != nil {
			return false, err
		}
		return true, nil
	}
	if present {
		if err := os.Remove(f.path()); err != nil {
			return false, fmt.Errorf("removing: %w", err)
		}
		if err := atomicfile.SyncDir(filepath.Dir(f.path())); err != nil {
			return false, fmt.Errorf("removing: %w", err)
		}
		changed = true
	}
	if err := f.h.RemoveDirs(want.Missing); err != nil {
		return false, err
	}
	return changed, nil
}

// Changed is when the file was last written or removed: its modification time or, when there
// is none, that of the nearest directory above it that exists, which removing the file (or a
// directory Restore removed) updated. Another change in that directory since moves it later,
// never earlier, so a daemon compared with it can only be taken as not having restarted when
// it has: the side on which a restart is repeated, not skipped.
func (f File) Changed() (time.Time, error) {
	for p := f.node; ; p = path.Dir(p) {
		fi, err := os.Lstat(f.h.Path(p))
		if err == nil {
			return fi.ModTime(), nil
		}
		if !errors.Is(err, fs.ErrNotExist) || p == "/" {
			return time.Time{}, fmt.Errorf("reading the modification time: %w", err)
		}
	}
}

// data is s as a Value's Data.
func (s state) data() json.RawMessage {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err) // a struct of bytes, ints and strings always encodes
	}
	return b
}
