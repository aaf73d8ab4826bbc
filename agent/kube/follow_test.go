package kube

import (
	"context"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// scriptedLeases is an API whose Lease watches the test drives: it records each Get and the
// resourceVersion each watch starts from.
type scriptedLeases struct {
	API
	mu       sync.Mutex
	gets     int
	from     []string
	watches  chan *watch.FakeWatcher
	getLease func() *coordinationv1.Lease
}

func (s *scriptedLeases) GetLease(context.Context, string, string) (*coordinationv1.Lease, error) {
	s.mu.Lock()
	s.gets++
	s.mu.Unlock()
	return s.getLease(), nil
}

func (s *scriptedLeases) WatchLeases(_ context.Context, _ string, o metav1.ListOptions) (watch.Interface, error) {
	s.mu.Lock()
	s.from = append(s.from, o.ResourceVersion)
	s.mu.Unlock()
	w := watch.NewFake()
	s.watches <- w
	return w, nil
}

func (s *scriptedLeases) counts() (int, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gets, append([]string(nil), s.from...)
}

// A watch the server ends is opened again from the last version it delivered (a bookmark's
// too), with no Get; a watch that fails (410 Gone: the version is too old) is followed by a
// Get, whose renewal is a resync.
func TestFollowerWatchesOnFromTheLastVersion(t *testing.T) {
	lease := func(rv string, renew time.Time) *coordinationv1.Lease {
		l := nodeLease("n1", renew)
		l.ResourceVersion = rv
		return l
	}
	api := &scriptedLeases{watches: make(chan *watch.FakeWatcher, 1), getLease: func() *coordinationv1.Lease { return lease("10", t0) }}
	renewals := make(chan Renewal, 8)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); WatchLease(ctx, api, "n1", func(r Renewal) { renewals <- r }, nil) }()
	defer func() { cancel(); <-done }()
	next := func() *watch.FakeWatcher {
		t.Helper()
		select {
		case w := <-api.watches:
			return w
		case <-time.After(10 * time.Second):
			t.Fatal("no watch opened")
			return nil
		}
	}
	renewal := func(want time.Time, resync bool) {
		t.Helper()
		select {
		case r := <-renewals:
			if !r.RenewTime.Equal(want) || r.Resync != resync {
				t.Fatalf("renewal at %v (resync %v), want %v (resync %v)", r.RenewTime, r.Resync, want, resync)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no renewal at %v", want)
		}
	}
	w := next()
	renewal(t0, false) // the first Get's
	w.Modify(lease("11", t0.Add(10*time.Second)))
	renewal(t0.Add(10*time.Second), false)
	bookmark := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "15"}}
	w.Action(watch.Bookmark, bookmark)
	w.Stop() // the server ends the watch in its time

	w = next()
	if gets, from := api.counts(); gets != 1 || len(from) != 2 || from[0] != "10" || from[1] != "15" {
		t.Fatalf("after a watch ended: %d gets, watches from %v; want 1 get, watches from 10 then 15", gets, from)
	}
	gone := apierrors.NewResourceExpired("too old resource version: 15 (20)")
	api.getLease = func() *coordinationv1.Lease { return lease("21", t0.Add(20*time.Second)) }
	w.Error(&gone.ErrStatus)
	next()
	renewal(t0.Add(20*time.Second), true)
	if gets, from := api.counts(); gets != 2 || from[len(from)-1] != "21" {
		t.Fatalf("after a watch failed: %d gets, watches from %v; want a second get, and a watch from its version 21", gets, from)
	}
}
