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

// The first watch starts from the Get's version; a watch the server ends is opened again from
// the last version it delivered (a bookmark's too), with no Get; a watch whose version is gone
// (410) is opened again from now, and its first renewal is a resync.
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
		t.Fatalf("after a watch ended: %d gets, watches from %q; want 1 get, watches from its version 10 then from 15", gets, from)
	}
	// The version is gone (an API server restarted, say), and the Lease's own version, which a
	// Get would give, may be as old: watched from now at once, no Get.
	gone := apierrors.NewResourceExpired("too old resource version: 15 (20)")
	w.Error(&gone.ErrStatus)
	w = next()
	w.Add(lease("21", t0.Add(20*time.Second)))
	renewal(t0.Add(20*time.Second), true)
	if gets, from := api.counts(); gets != 1 || from[len(from)-1] != fromNow {
		t.Fatalf("after a 410: %d gets, watches from %q; want no second get, and a watch from now", gets, from)
	}
}
