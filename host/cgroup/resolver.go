package cgroup

import (
	"errors"
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
	// rewalkFollowed is rewalkEvery when a feed tells every cgroup made since the last walk
	// and lost none: a miss then is an id of no cgroup, which a walk would not find either.
	rewalkFollowed = time.Minute
	// drainEvery bounds how often Live drains the feed: an rmdir older than this is known,
	// a newer one is found by the stat Live makes anyway.
	drainEvery = 100 * time.Millisecond
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

// Resolver maps kernfs ids, as BPF programs record them, to cgroup paths. With a Feed
// (Follow: the kernel's mkdirs and rmdirs, record/trace/cgnames) it learns each cgroup as it
// is made, on top of one walk of each hierarchy. A miss asks the kernel for the cgroup by file
// handle (open_by_handle_at: exact, and it tells a removed cgroup from one created since the
// last look), where that is allowed (CAP_DAC_READ_SEARCH); otherwise it walks the hierarchy,
// at most every rewalkEvery (rewalkFollowed while a feed loses nothing). It is safe for
// concurrent use.
type Resolver struct {
	l       *Layout
	handles bool // try file handles first; off in tests of the walk, and once refused
	mu      sync.Mutex
	trees   map[string]*tree // by hierarchy mount dir
	feed    Feed
	byHier  map[int]string // hierarchy id -> mount dir, for the feed's changes
	drained time.Time      // the feed's last drain
	asked   int            // ids Live asked the kernel about, for tests and benchmarks
}

// Change is a cgroup the kernel made or removed: its kernfs id, its path from its hierarchy's
// root, and the hierarchy's id (/proc/self/cgroup's first field; 0 for v2).
type Change struct {
	Hierarchy int
	ID        uint64
	Path      string
	Removed   bool
}

// A Feed hands fn every Change since its last call, and says whether it lost any since.
type Feed func(fn func(Change)) (lost bool, err error)

type tree struct {
	byID    map[uint64]entry
	room    maproom.Room // byID's
	walked  time.Time
	pruned  time.Time
	walks   int  // for tests and benchmarks
	lossy   bool // the feed lost a change since the last walk
	skipped bool // a change's path could not be used
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
	t := r.tree(root, now)
	if now.Sub(t.pruned) > keepConfirmedGone {
		t.prune(now, r.followed(t))
	}
	if e, ok := t.byID[id]; ok && (now.Sub(e.seen) < keepGone || r.followed(t) && !e.gone) {
		return e.path, true
	}
	if r.feed != nil && !t.walked.IsZero() {
		r.follow(now)
		if e, ok := t.byID[id]; ok {
			return e.path, true
		}
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
		if errors.Is(err, syscall.EPERM) {
			r.handles = false // no CAP_DAC_READ_SEARCH: it will not be allowed later either
		}
	}
	every := rewalkEvery
	if r.followed(t) {
		every = rewalkFollowed
	}
	if now.Sub(t.walked) >= every {
		if r.feed != nil {
			r.follow(now) // what the walk sees is newer than what the feed holds
		}
		t.walk(root, now)
	}
	e, ok := t.byID[id]
	return e.path, ok
}

// tree is the hierarchy at root's, made empty if new. Called with r.mu held.
func (r *Resolver) tree(root string, now time.Time) *tree {
	t := r.trees[root]
	if t == nil {
		t = &tree{byID: map[uint64]entry{}, pruned: now}
		r.trees[root] = t
	}
	return t
}

// Follow makes the resolver learn cgroups from feed as the kernel makes and removes them.
func (r *Resolver) Follow(feed Feed) error {
	byHier, err := r.l.Hierarchies()
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.feed, r.byHier = feed, byHier
	return nil
}

// Walks counts the walks of a hierarchy the resolver made: what its misses cost.
func (r *Resolver) Walks() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, t := range r.trees {
		n += t.walks
	}
	return n
}

// followed says whether every cgroup made or removed in t since its last walk is known: then
// an entry not removed is alive, however long ago it was confirmed. Called with r.mu held.
func (r *Resolver) followed(t *tree) bool {
	return r.feed != nil && !t.walked.IsZero() && !t.lossy && !t.skipped
}

// follow applies what the feed holds to the trees it has walked (a tree not walked yet learns
// it all from its first walk). Called with r.mu held.
func (r *Resolver) follow(now time.Time) {
	r.drained = now
	lost, err := r.feed(func(c Change) {
		root, ok := r.byHier[c.Hierarchy]
		t := r.trees[root]
		if !ok || t == nil || t.walked.IsZero() {
			return
		}
		if c.Path == "" {
			t.skipped = true
			return
		}
		if c.Removed {
			if e, ok := t.byID[c.ID]; ok && !e.gone {
				t.byID[c.ID] = entry{path: e.path, seen: now, gone: true}
			}
			return
		}
		t.byID[c.ID] = entry{path: c.Path, seen: now}
	})
	if lost || err != nil {
		for _, t := range r.trees {
			t.lossy = true
		}
	}
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
		r.tree(root, now).byID[st.Ino] = entry{path: path, seen: now}
	}
}

// Live says whether the cgroup with id still exists in controller's hierarchy.
func (r *Resolver) Live(controller string, id uint64) bool {
	live, done := r.Sweep(controller)
	defer done()
	return live(id)
}

// Sweep is Live for many ids in a row (a tracer's forget sweep): it holds the hierarchy's
// root open until done, where opening it for each id doubled a sweep's syscalls.
//
// With a feed, a sweep drains it first, and the first sweep of a hierarchy walks it (as a miss
// does without file handles); from then on, while the feed loses nothing, the ids it knows
// are answered from what it said: alive unless removed, with no syscall. Asking the kernel
// took two each (open by handle, close): at 1,000 cgroups, a fifth of the agent's syscalls
// (BenchmarkAgent1000Cgroups). An id the feed does not know, or any once it lost a change,
// is asked as before.
func (r *Resolver) Sweep(controller string) (live func(id uint64) bool, done func()) {
	mfd := -1
	if root := r.l.Dir(controller, "/"); root != "" {
		r.catchUp(root)
		if fd, err := rootDir(root); err == nil {
			mfd = fd
		}
	}
	return func(id uint64) bool { return r.live(controller, id, mfd) }, func() {
		if mfd >= 0 {
			syscall.Close(mfd)
		}
	}
}

// live is Live with the hierarchy's root open at mfd (-1: it could not be opened, and the
// kernel is not asked by file handle).
func (r *Resolver) live(controller string, id uint64, mfd int) bool {
	root := r.l.Dir(controller, "/")
	if root == "" {
		return false
	}
	if known, live := r.followedLive(root, id); known {
		return live
	}
	r.mu.Lock()
	handles := r.handles // Path turns it off, under mu, once refused
	r.asked++
	r.mu.Unlock()
	if handles && mfd >= 0 {
		err := byHandleExistsAt(mfd, id)
		if errors.Is(err, errGone) {
			r.confirmGone(root, id)
		}
		if err == nil || errors.Is(err, errGone) {
			return err == nil
		}
	}
	if r.removed(root, id) {
		return false
	}
	p, ok := r.Path(controller, id)
	if !ok {
		return false
	}
	var st syscall.Stat_t
	return syscall.Stat(filepath.Join(root, p), &st) == nil && st.Ino == id
}

// catchUp drains the feed, if the resolver follows one, and walks the hierarchy at root after
// it if it was never walked: from then on the feed says which of its cgroups exist.
func (r *Resolver) catchUp(root string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.feed == nil {
		return
	}
	now := time.Now()
	r.follow(now) // what a walk sees is newer than what the feed holds
	if t := r.tree(root, now); t.walked.IsZero() {
		t.walk(root, now)
	}
}

// followedLive answers Live from the feed when it lost nothing since the hierarchy at root
// was walked and knows id: known is false otherwise. The sweep drained the feed as it began
// (catchUp), and drains it again at most every drainEvery.
func (r *Resolver) followedLive(root string, id uint64) (known, live bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t := r.trees[root]
	if t == nil || !r.followed(t) {
		return false, false
	}
	if now := time.Now(); now.Sub(r.drained) >= drainEvery {
		r.follow(now)
	}
	e, ok := t.byID[id]
	if !ok || !r.followed(t) {
		return false, false
	}
	return true, !e.gone
}

// LivePaths is the paths of the cgroups of controller's hierarchy the feed says exist, drained
// first: ok is false unless the resolver follows a feed that lost nothing since the
// hierarchy's walk (its first Sweep walks it). A path it lacks may still exist elsewhere (in
// another v1 hierarchy); a rename, which no runtime makes, is not followed.
func (r *Resolver) LivePaths(controller string) (paths map[string]bool, ok bool) {
	root := r.l.Dir(controller, "/")
	if root == "" {
		return nil, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	t := r.trees[root]
	if t == nil || !r.followed(t) {
		return nil, false
	}
	r.follow(time.Now())
	if !r.followed(t) {
		return nil, false
	}
	paths = make(map[string]bool, len(t.byID))
	for _, e := range t.byID {
		if !e.gone {
			paths[e.path] = true
		}
	}
	return paths, true
}

// Asked counts the ids Live and Sweep asked the kernel about: what the feed did not answer.
func (r *Resolver) Asked() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.asked
}

// removed says whether the feed said the cgroup with id in the hierarchy at root was removed.
func (r *Resolver) removed(root string, id uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	t := r.trees[root]
	if r.feed == nil || t == nil || t.walked.IsZero() {
		return false
	}
	// A forget sweep asks of every id its maps hold: one drain serves them all.
	if now := time.Now(); now.Sub(r.drained) >= drainEvery {
		r.follow(now)
	}
	e, ok := t.byID[id]
	return ok && e.gone
}

// walk records every cgroup below root.
func (t *tree) walk(root string, now time.Time) {
	t.walked, t.lossy, t.skipped = now, false, false
	t.walks++
	cgroupIDs(root, func(rel string, id uint64) { t.byID[id] = entry{path: rel, seen: now} })
	t.prune(now, false)
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

// prune forgets what the kernel has not confirmed for keepGone (unless followed: the feed
// would have said it was removed), and what was found removed keepConfirmedGone ago.
func (t *tree) prune(now time.Time, followed bool) {
	t.pruned = now
	t.room.Saw(len(t.byID))
	for id, e := range t.byID {
		if age := now.Sub(e.seen); age > keepGone && !followed || e.gone && age > keepConfirmedGone {
			delete(t.byID, id)
		}
	}
	t.byID = maproom.Fit(&t.room, t.byID)
}
