package journald

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nodectl/nodectl/host"
	"github.com/nodectl/nodectl/internal/procpath"

	"github.com/prometheus/procfs"

	"github.com/nodectl/nodectl/tuner"
)

// StorageBackend is the storage backend's name in state files.
const StorageBackend = "journal-storage"

// StorageSpec is the journal storage's parameters, as recorded in the state file.
type StorageSpec struct {
	Source string `json:"source"` // the directory that holds the journal, e.g. on a local SSD
	Target string `json:"target"` // where journald looks for it: /var/log/journal
}

type storage struct {
	h       host.FS
	spec    StorageSpec
	restart restartFunc
}

// NewStorage is the journal kept in source (a node path, e.g. a directory on the local SSD),
// bind-mounted onto target (/var/log/journal), where journald writes it.
func NewStorage(h host.FS, source, target string) tuner.Setting {
	return &storage{h: h, spec: StorageSpec{Source: source, Target: target}, restart: systemctl}
}

// DecodeStorage rebuilds the journal storage from its recorded StorageSpec.
func DecodeStorage(h host.FS, raw json.RawMessage) (tuner.Setting, error) {
	var s StorageSpec
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, fmt.Errorf("decoding journal storage spec: %w", err)
	}
	if err := s.check(); err != nil {
		return nil, fmt.Errorf("decoding journal storage spec %s: %w", raw, err)
	}
	return NewStorage(h, s.Source, s.Target), nil
}

func (s StorageSpec) check() error {
	for _, p := range []struct{ name, v string }{{"source", s.Source}, {"target", s.Target}} {
		if !path.IsAbs(p.v) || path.Clean(p.v) != p.v || p.v == "/" {
			return fmt.Errorf("%s %q: want a clean absolute path below /", p.name, p.v)
		}
	}
	if s.Source == s.Target || strings.HasPrefix(s.Target, s.Source+"/") || strings.HasPrefix(s.Source, s.Target+"/") {
		return fmt.Errorf("source %s and target %s: want two directories, neither inside the other", s.Source, s.Target)
	}
	return nil
}

func (s *storage) ID() string      { return StorageBackend + ":" + s.spec.Target }
func (s *storage) Backend() string { return StorageBackend }
func (s *storage) Desired() string { return "bind " + s.spec.Source }
func (s *storage) Spec() any       { return s.spec }
func (s *storage) Restart() string { return Daemon }

func (s *storage) errf(format string, args ...any) error {
	return fmt.Errorf("%s (%s): %s", s.ID(), s.h.Path(s.spec.Target), fmt.Sprintf(format, args...))
}

// markerDir holds the storage's markers: Linux records no time for a mount, so Apply and
// Restore date their changes by a marker file's modification time, for Pending. It is below
// /run, emptied at boot as the bind mount itself is gone then, so a marker never outlives the
// mount it dates.
const markerDir = "/run/nodectl/journal-storage"

// marker is the node path of the storage's marker: the target, escaped into one file name.
func (s *storage) marker() string { return path.Join(markerDir, url.PathEscape(s.spec.Target)) }

// mark dates a change of the mount: now.
func (s *storage) mark() error {
	p := s.h.Path(s.marker())
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return s.errf("making directory %s: %v", filepath.Dir(p), err)
	}
	if err := os.WriteFile(p, []byte(s.Desired()+"\n"), 0o644); err != nil {
		return s.errf("writing %s: %v", p, err)
	}
	return nil
}

// marked is when the mount last changed, as its marker says; ok is false without a marker.
func (s *storage) marked() (at time.Time, ok bool, err error) {
	fi, err := os.Stat(s.h.Path(s.marker()))
	if errors.Is(err, fs.ErrNotExist) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, s.errf("reading %s: %v", s.marker(), err)
	}
	return fi.ModTime(), true, nil
}

// storageData is what Restore needs: the directories (node paths, outermost first) Apply
// makes, source's, target's, then the marker's.
type storageData struct {
	Missing []string `json:"missing_dirs,omitempty"`
}

// Read holds when the top mount on target is a mount of source's directory: target then
// stats as source (same device and inode) and the mount table lists a mount at target.
func (s *storage) Read(context.Context) (tuner.Value, error) {
	if err := s.spec.check(); err != nil {
		return tuner.Value{}, fmt.Errorf("%s: %w", s.ID(), err)
	}
	var dt storageData
	for _, p := range []string{s.spec.Source, s.spec.Target, markerDir} {
		for _, d := range s.h.MissingDirs(p) {
			if !slices.Contains(dt.Missing, d) {
				dt.Missing = append(dt.Missing, d)
			}
		}
	}
	v := tuner.Value{Data: mustJSON(dt)}
	top, err := s.top()
	if err != nil || top == nil {
		return v, err
	}
	v.Present = true
	if s.ours() {
		v.Text = s.Desired()
	} else {
		v.Text = fmt.Sprintf("other mount: %s %s, path %s", top.FSType, top.Source, procpath.Unescape(top.Root))
	}
	return v, nil
}

// top is the mount on top of target, nil when target is not a mount point.
func (s *storage) top() (*procfs.MountInfo, error) {
	mp, err := s.h.Resolve(s.spec.Target)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, s.errf("resolving: %v", err)
	}
	if mp, err = filepath.Abs(mp); err != nil {
		return nil, s.errf("resolving: %v", err)
	}
	pfs, err := procfs.NewFS(s.h.Procfs)
	if err != nil {
		return nil, s.errf("reading the mount table: %v", err)
	}
	mounts, err := pfs.GetMounts()
	if err != nil {
		return nil, s.errf("reading the mount table %s/self/mountinfo: %v", s.h.Procfs, err)
	}
	var at []*procfs.MountInfo
	for _, m := range mounts {
		if procpath.Unescape(m.MountPoint) == mp {
			at = append(at, m)
		}
	}
	// Mounts stacked on one point: each is the child of the one below it.
	for _, m := range at {
		below := false
		for _, o := range at {
			below = below || o.ParentID == m.MountID
		}
		if !below {
			return m, nil
		}
	}
	return nil, nil
}

// ours reports whether target is source's directory, as it is through our bind mount.
func (s *storage) ours() bool {
	srcPath, err1 := s.h.Resolve(s.spec.Source)
	tgtPath, err2 := s.h.Resolve(s.spec.Target)
	if err1 != nil || err2 != nil {
		return false
	}
	src, err1 := os.Stat(srcPath)
	tgt, err2 := os.Stat(tgtPath)
	return err1 == nil && err2 == nil && os.SameFile(src, tgt)
}

// Apply bind-mounts the source onto the target unless it is there already, and restarts
// journald (where systemd runs) after mounting or when none has started since the mount.
func (s *storage) Apply(ctx context.Context) error {
	cur, err := s.Read(ctx)
	if err != nil {
		return err
	}
	changed := !cur.Present || cur.Text != s.Desired()
	if changed {
		if err := s.mount(); err != nil {
			return err
		}
	} else if _, ok, err := s.marked(); err != nil {
		return err
	} else if !ok {
		// Mounted at a time nothing records: dated now, so that the restart below settles it.
		if err := s.mark(); err != nil {
			return err
		}
	}
	return s.settle(ctx, changed)
}

// reachesNode refuses a bind mount the node would not see: under a mounted root (a tuner pod's
// /host) that is not shared with the node's mount namespace, the mount would be the pod's
// alone and would go with it. A root that is no mount point (a scratch tree) is this
// namespace's own.
func (s *storage) reachesNode() error {
	root := filepath.Clean(s.h.Root)
	if s.h.Root == "" || root == "/" {
		return nil
	}
	pfs, err := procfs.NewFS(s.h.Procfs)
	if err != nil {
		return s.errf("reading the mount table: %v", err)
	}
	mounts, err := pfs.GetMounts()
	if err != nil {
		return s.errf("reading the mount table %s/self/mountinfo: %v", s.h.Procfs, err)
	}
	for _, m := range mounts {
		if procpath.Unescape(m.MountPoint) != root {
			continue
		}
		if _, shared := m.OptionalFields["shared"]; !shared {
			return s.errf("the node's root at %s is not a shared mount: a bind mount made under it would not be the node's (a tuner pod needs / mounted with Bidirectional propagation, which needs the node's / shared, as systemd makes it); apply this setting on the node itself", root)
		}
	}
	return nil
}

// mount dates the mount by its marker, just before making it, so that a journald started
// after the marker sees it; when the mount fails, a marker made for it goes again.
func (s *storage) mount() error {
	_, existed, err := s.marked()
	if err != nil {
		return err
	}
	if err := s.mark(); err != nil {
		return err
	}
	err = func() error {
		if err := s.reachesNode(); err != nil {
			return err
		}
		src, err := s.h.Resolve(s.spec.Source)
		if err != nil {
			return s.errf("%v", err)
		}
		tgt, err := s.h.Resolve(s.spec.Target)
		if err != nil {
			return s.errf("%v", err)
		}
		for _, d := range []string{src, tgt} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return s.errf("making directory %s: %v", d, err)
			}
		}
		if err := bindMount(src, tgt); err != nil {
			return s.errf("bind-mounting %s: %v", src, err)
		}
		return nil
	}()
	if err != nil && !existed {
		os.Remove(s.h.Path(s.marker()))
	}
	return err
}

// Restore unmounts our bind from target, only ours: a mount stacked on top of it is someone
// else's and is left alone, with an error. It then restarts journald as Apply does: after
// unmounting, or when none has started since the unmount, which a rollback that could not
// restart journald leaves behind (its marker stays until the restart succeeds, for the next
// rollback to see). The directories Apply made are removed when empty; journal files written
// into source while it was mounted are kept.
func (s *storage) Restore(ctx context.Context, prev tuner.Value) error {
	var dt storageData
	if len(prev.Data) > 0 {
		if err := json.Unmarshal(prev.Data, &dt); err != nil {
			return s.errf("decoding the recorded value: %v", err)
		}
	}
	if prev.Present && prev.Text == s.Desired() {
		return s.settle(ctx, false) // it was our bind before: nothing to undo
	}
	top, err := s.top()
	if err != nil {
		return err
	}
	changed := false
	if top != nil {
		if !s.ours() {
			if !prev.Present {
				return s.errf("another mount is on top (%s %s, path %s), not the bind of %s; not unmounting it: unmount it first",
					top.FSType, top.Source, procpath.Unescape(top.Root), s.spec.Source)
			}
		} else {
			if err := s.mark(); err != nil {
				return err
			}
			// Detached: journald keeps its journal files open in the bind until it restarts
			// (below), so a plain unmount would fail as busy.
			tgt, err := s.h.Resolve(s.spec.Target)
			if err != nil {
				return s.errf("%v", err)
			}
			if err := unmount(tgt); err != nil {
				return s.errf("unmounting: %v", err)
			}
			changed = true
		}
	}
	if err := s.settle(ctx, changed); err != nil {
		return err
	}
	if err := os.Remove(s.h.Path(s.marker())); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return s.errf("removing %s: %v", s.marker(), err)
	}
	if err := s.h.RemoveDirs(dt.Missing); err != nil {
		return s.errf("%v", err)
	}
	return nil
}

func (s *storage) settle(ctx context.Context, changed bool) error {
	if err := settle(ctx, s.h, changed, s.Pending, s.restart); err != nil {
		return s.errf("%v", err)
	}
	return nil
}

// Pending reports whether no journald has started since the mount last changed, as its
// marker dates it. Without a marker, a bind of ours is pending (when it was made is unknown;
// a restart is the safe side) and no bind is pending only when no journald runs.
func (s *storage) Pending(context.Context) (bool, error) {
	changed, ok, err := s.marked()
	if err != nil {
		return false, err
	}
	if !ok {
		top, err := s.top()
		if err != nil {
			return false, err
		}
		if top != nil && s.ours() {
			return true, nil
		}
	}
	p, err := pendingSince(s.h, changed)
	if err != nil {
		return false, s.errf("%v", err)
	}
	return p, nil
}

// Note says when journald moves to the new storage where systemd does not run.
func (s *storage) Note() string {
	return note(s.h, "the journal moves when journald next starts")
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // plain structs of strings, bytes and ints always encode
	}
	return b
}

// Unfinished reports whether a restart of journald is owed: systemd runs and none has
// started since the setting last changed (tuner.Finisher), so a re-apply restarts it.
func (s *storage) Unfinished(ctx context.Context) (bool, error) {
	return needRestart(s.h.Systemd(), false, func() (bool, error) { return s.Pending(ctx) })
}
