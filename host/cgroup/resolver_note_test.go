package cgroup

import (
	"testing"
	"time"
)

// A cgroup noted while it existed still resolves after it is gone: the tracer collects once a
// second, and a churned sandbox's cgroup can come and go in between.
func TestResolverNoteOutlivesTheCgroup(t *testing.T) {
	l, parent := testLayout(t)
	path := parent + "/short-lived"
	if err := l.Create(path, Limits{}); err != nil {
		t.Fatal(err)
	}
	controller := "cpu"
	if !l.V1 {
		controller = ""
	}
	id, err := l.ID(controller, path)
	if err != nil {
		t.Fatal(err)
	}
	r := NewResolver(l)
	r.Note(path)
	if err := l.Remove(path); err != nil {
		t.Fatal(err)
	}
	if got, ok := r.Path(controller, id); !ok || got != path {
		t.Errorf("Path of a noted, removed cgroup = %q, %v; want %s", got, ok, path)
	}
	if r.Live(controller, id) {
		t.Error("Live says a removed cgroup lives")
	}
	// Found removed, its path still answers a while, then a prune forgets it, where an
	// unconfirmed one would stay keepGone.
	if got, ok := r.Path(controller, id); !ok || got != path {
		t.Errorf("Path of a cgroup Live found removed = %q, %v; want %s for a while", got, ok, path)
	}
	tr := r.trees[l.Dir(controller, "/")]
	e := tr.byID[id]
	if !e.gone {
		t.Fatal("Live did not note the cgroup removed")
	}
	tr.prune(e.seen.Add(keepConfirmedGone/2), false)
	if _, ok := tr.byID[id]; !ok {
		t.Error("a prune forgot a removed cgroup before keepConfirmedGone")
	}
	tr.prune(e.seen.Add(keepConfirmedGone+time.Second), false)
	if _, ok := tr.byID[id]; ok {
		t.Error("a prune kept a removed cgroup past keepConfirmedGone")
	}
	// Without the note, the id of a removed cgroup resolves to nothing.
	if got, ok := NewResolver(l).Path(controller, id); ok {
		t.Errorf("an un-noted removed cgroup resolved to %q", got)
	}
}
