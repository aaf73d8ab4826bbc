package cgroup

import (
	"errors"
	"io/fs"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/nodectl/nodectl/internal/maproom"
)

const (
	// rewalkEvery bounds how often a miss walks a hierarchy again when file handles are not
	// available: ids of cgroups that never existed must not turn every lookup into a walk.
	rewalkEvery = 500 * time.Millisecond
	// keepGone is how long a resolved path is trusted without asking the kernel again, so
	// samples read just after a workload's cgroup went away are still attributed.
	keepGone = 10 * time.Minute
	// keepConfirmedGone is how long a path stays once Live found its cgroup removed: by then
	// the tracer has forgotten the id, and a churn's thousands of paths would otherwise stay
	// for keepGone.
	keepConfirmedGone = time.Minute
)

// errGone says the kernel knows no cgroup with that id (any more).
var errGone = errors.New("no cgroup with that id")

// Resolver maps kernfs ids, as BPF programs record them, to cgroup paths. A miss asks the
// kernel for the cgroup by file handle (open_by_handle_at: exact, and it tells a removed
// cgroup from one created since the last look); where that is not allowed it walks the
// hierarchy, at most every rewalkEvery. It is safe for concurrent use.
type Resolver struct {
	l       *Layout
	handles bool // try file handles first; off in tests of the walk
	mu      sync.Mutex
	trees   map[string]*tree // by hierarchy mount dir
}

type tree struct {
	byID   map[uint64]entry
	room   maproom.Room // byID's
	walked time.Time
	pruned time.Time
}

type entry struct {
	path string
	seen time.Time // when the kernel last confirmed it, or that it is gone
	gone bool      // Live found it removed
}

// NewResolver returns a resolver over l's hierarchies.
func NewResolver(l *Layout) *Resolver {
	return &Resolver{l: l, handles: true, trees: map[string]*tree{}}
}

// Path returns the path of the cgroup with id in controller's hierarchy (Unified for v2 ids).
// It reports false only for ids of no existing cgroup; a cgroup removed in the last minutes
// may still resolve (Live tells).
func (r *Resolver) Path(controller string, id uint64) (string, bool) {
	root := r.l.Dir(controller, "/")
	if root == "" {
		return "", false
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	t := r.trees[root]
	if t == nil {
		t = &tree{byID: map[uint64]entry{}, pruned: now}
		r.trees[root] = t
	}
	if now.Sub(t.pruned) > keepConfirmedGone {
		t.prune(now)
	}
	if e, ok := t.byID[id]; ok && now.Sub(e.seen) < keepGone {
		return e.path, true
	}
	if r.handles {
		p, err := byHandle(root, id)
		if err == nil {
			t.byID[id] = entry{path: p, seen: now}
			return p, true
		}
		if errors.Is(err, errGone) {
			delete(t.byID, id)
			return "", false
		}
	}
	if now.Sub(t.walked) >= rewalkEvery {
		t.walk(root, now)
	}
	e, ok := t.byID[id]
	return e.path, ok
}

// Note remembers path's id in every hierarchy where it exists, so that a cgroup that lives
// shorter than a collection (a churned sandbox's) still resolves after it is gone.
func (r *Resolver) Note(path string) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, root := range r.l.roots() {
		var st syscall.Stat_t
		if syscall.Stat(filepath.Join(root, path), &st) != nil {
			continue
		}
		t := r.trees[root]
		if t == nil {
			t = &tree{byID: map[uint64]entry{}, pruned: now}
			r.trees[root] = t
		}
		t.byID[st.Ino] = entry{path: path, seen: now}
	}
}

// Live says whether the cgroup with id still exists in controller's hierarchy.
func (r *Resolver) Live(controller string, id uint64) bool {
	root := r.l.Dir(controller, "/")
	if root == "" {
		return false
	}
	if r.handles {
		err := byHandleExists(root, id)
		if errors.Is(err, errGone) {
			r.confirmGone(root, id)
		}
		if err == nil || errors.Is(err, errGone) {
			return err == nil
		}
	}
	p, ok := r.Path(controller, id)
	if !ok {
		return false
	}
	var st syscall.Stat_t
	return syscall.Stat(filepath.Join(root, p), &st) == nil && st.Ino == id
}

// walk records every cgroup below root.
func (t *tree) walk(root string, now time.Time) {
	t.walked = now
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			// A cgroup removed during the walk; keep going.
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.IsDir() {
			return nil
		}
		var st syscall.Stat_t
		if syscall.Stat(p, &st) != nil {
			return filepath.SkipDir
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		t.byID[st.Ino] = entry{path: filepath.Join("/", rel), seen: now}
		return nil
	})
	t.prune(now)
}

// confirmGone notes that the cgroup with id in the hierarchy at root was removed: its path
// is kept keepConfirmedGone from now.
func (r *Resolver) confirmGone(root string, id uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t := r.trees[root]; t != nil {
		if e, ok := t.byID[id]; ok && !e.gone {
			t.byID[id] = entry{path: e.path, seen: time.Now(), gone: true}
		}
	}
}

// prune forgets what the kernel has not confirmed for keepGone, and what Live found removed
// keepConfirmedGone ago.
func (t *tree) prune(now time.Time) {
	t.pruned = now
	t.room.Saw(len(t.byID))
	for id, e := range t.byID {
		if age := now.Sub(e.seen); age > keepGone || e.gone && age > keepConfirmedGone {
			delete(t.byID, id)
		}
	}
	t.byID = maproom.Fit(&t.room, t.byID)
}
