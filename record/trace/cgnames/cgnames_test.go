//go:build linux

package cgnames

import (
	"log/slog"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/record/trace/internal/cgtest"
)

// The kernel's own mkdirs and rmdirs come through with each cgroup's id (its directory's inode
// number), its path from its hierarchy's root, and its hierarchy, in every hierarchy a cgroup
// is made in (v1: one each).
func TestFeedNamesWhatTheKernelMakes(t *testing.T) {
	tr, l := load(t)
	byHier, err := l.Hierarchies()
	if err != nil {
		t.Fatal(err)
	}
	groups := map[string]*cgtest.Group{}
	for _, controller := range []string{cgroup.CPU, cgroup.Memory} {
		groups[controller] = cgtest.Make(t, controller, "made")["made"]
	}
	seen := map[uint64]cgroup.Change{}
	if _, err := tr.Feed(func(c cgroup.Change) { seen[c.ID] = c }); err != nil {
		t.Fatal(err)
	}
	for controller, g := range groups {
		c, ok := seen[g.ID]
		if !ok || c.Removed || c.Path != g.Path || byHier[c.Hierarchy] != cgtest.Mount(controller) {
			t.Errorf("%s: change %+v (%v), want mkdir of %s (id %d) in %s", controller, c, ok, g.Path, g.ID, cgtest.Mount(controller))
		}
	}
	clear(seen)
	groups[cgroup.CPU].Remove(t)
	if _, err := tr.Feed(func(c cgroup.Change) { seen[c.ID] = c }); err != nil {
		t.Fatal(err)
	}
	if c, ok := seen[groups[cgroup.CPU].ID]; !ok || !c.Removed || c.Path != groups[cgroup.CPU].Path {
		t.Errorf("after rmdir: change %+v (%v), want the rmdir of %s", c, ok, groups[cgroup.CPU].Path)
	}
}

// Without CAP_DAC_READ_SEARCH (open_by_handle_at refused), a resolver following the feed walks
// a hierarchy once, then names every cgroup made since without another walk, and knows the
// removed ones gone without asking the filesystem.
func TestResolverFollowsWithoutFileHandles(t *testing.T) {
	tr, l := load(t)
	withoutCapability(t, unix.CAP_DAC_READ_SEARCH)
	r := cgroup.NewResolver(l)
	if err := r.Follow(tr.Feed); err != nil {
		t.Fatal(err)
	}
	first := cgtest.Make(t, cgroup.CPU, "first")["first"]
	if p, ok := r.Path(cgroup.CPU, first.ID); !ok || p != first.Path {
		t.Fatalf("Path of %s = %q, %v", first.Path, p, ok)
	}
	walks := r.Walks()
	if walks != 1 {
		t.Errorf("%d walks to name the first cgroup, want 1", walks)
	}
	later := cgtest.Make(t, cgroup.CPU, "a", "b", "c")
	for _, g := range later {
		if p, ok := r.Path(cgroup.CPU, g.ID); !ok || p != g.Path {
			t.Errorf("Path of %s = %q, %v", g.Path, p, ok)
		}
	}
	if got := r.Walks(); got != walks {
		t.Errorf("%d walks after naming cgroups made since the first, want still %d: the feed named them", got, walks)
	}
	gone := later["a"]
	gone.Remove(t)
	if r.Live(cgroup.CPU, gone.ID) {
		t.Errorf("%s is live after its rmdir", gone.Path)
	}
	if p, ok := r.Path(cgroup.CPU, gone.ID); !ok || p != gone.Path {
		t.Errorf("Path of the removed %s = %q, %v; want it kept a while, for late samples", gone.Path, p, ok)
	}
	if !r.Live(cgroup.CPU, later["b"].ID) {
		t.Errorf("%s is not live", later["b"].Path)
	}
}

// With file handles allowed, a resolver following the feed walks a hierarchy at its first
// sweep, then answers sweeps from the feed without asking the kernel: alive for a cgroup made
// before or after the walk, removed for one the feed saw removed; LivePaths lists the same.
// Only an id the feed does not know is asked.
func TestSweepAnswersFromTheFeed(t *testing.T) {
	tr, l := load(t)
	r := cgroup.NewResolver(l)
	if err := r.Follow(tr.Feed); err != nil {
		t.Fatal(err)
	}
	before := cgtest.Make(t, cgroup.CPU, "a", "b")
	if _, ok := r.LivePaths(cgroup.CPU); ok {
		t.Error("LivePaths answered before a walk")
	}
	live, done := r.Sweep(cgroup.CPU)
	for _, g := range before {
		if !live(g.ID) {
			t.Errorf("%s is not live", g.Path)
		}
	}
	done()
	walks := r.Walks()
	after := cgtest.Make(t, cgroup.CPU, "c")["c"]
	before["a"].Remove(t)
	live, done = r.Sweep(cgroup.CPU)
	defer done()
	if live(before["a"].ID) || !live(before["b"].ID) || !live(after.ID) {
		t.Errorf("after %s's rmdir: live %v, %s %v, %s made since %v; want false, true, true", before["a"].Path,
			live(before["a"].ID), before["b"].Path, live(before["b"].ID), after.Path, live(after.ID))
	}
	if got := r.Asked(); got != 0 {
		t.Errorf("the kernel was asked about %d ids the feed knew", got)
	}
	if paths, ok := r.LivePaths(cgroup.CPU); !ok || paths[before["a"].Path] || !paths[before["b"].Path] || !paths[after.Path] {
		t.Errorf("LivePaths (%v): %s %v, %s %v, %s %v; want false, true, true", ok, before["a"].Path, paths[before["a"].Path],
			before["b"].Path, paths[before["b"].Path], after.Path, paths[after.Path])
	}
	if live(1 << 62) {
		t.Error("an id of no cgroup is live")
	}
	if got := r.Asked(); got != 1 {
		t.Errorf("the kernel was asked about %d ids after one the feed did not know, want 1", got)
	}
	if got := r.Walks(); got != walks || walks != 1 {
		t.Errorf("%d walks at the first sweep and %d after, want 1 and 1", walks, got)
	}
}

// load loads the programs, closed when the test ends, and finds the host's hierarchies.
func load(t testing.TB) (*Tracer, *cgroup.Layout) {
	t.Helper()
	cgtest.RequireRoot(t)
	tr, err := New(slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	l, err := cgroup.Detect("/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	return tr, l
}

// withoutCapability drops capability from every thread's effective set until the test ends
// (it stays permitted, so it comes back).
func withoutCapability(t testing.TB, capability int) {
	t.Helper()
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		t.Fatal(err)
	}
	set := func(d [2]unix.CapUserData) error {
		h := hdr
		_, _, errno := syscall.AllThreadsSyscall(syscall.SYS_CAPSET, uintptr(unsafe.Pointer(&h)), uintptr(unsafe.Pointer(&d[0])), 0)
		if errno != 0 {
			return errno
		}
		return nil
	}
	dropped := data
	dropped[capability/32].Effective &^= 1 << (capability % 32)
	if err := set(dropped); err != nil {
		t.Fatalf("dropping capability %d from every thread: %v (syscall.AllThreadsSyscall needs CGO_ENABLED=0, as make test sets)", capability, err)
	}
	t.Cleanup(func() {
		if err := set(data); err != nil {
			t.Errorf("restoring capability %d: %v", capability, err)
		}
	})
}
