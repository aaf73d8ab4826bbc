package kube

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"
)

var t0 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

func nodeLease(node string, renew time.Time) *coordinationv1.Lease {
	d, h := int32(40), node
	rt := metav1.NewMicroTime(renew)
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: node, Namespace: NodeLeaseNamespace},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &h, LeaseDurationSeconds: &d, RenewTime: &rt},
	}
}

// TestWatchLeaseReportsEachRenewalOnce drives the watch by hand: renewals from the watch, a
// repeated renewTime, a watch closed by the server and one ended by 410 Gone, each rebuilt
// from a Get whose renewal is reported only when it is new.
func TestWatchLeaseReportsEachRenewalOnce(t *testing.T) {
	cs := newFake(nodeLease("node1", t0))
	watches := make(chan *watch.FakeWatcher, 8)
	cs.PrependWatchReactor("leases", func(a k8stesting.Action) (bool, watch.Interface, error) {
		if f := a.(k8stesting.WatchActionImpl).GetWatchRestrictions().Fields.String(); f != "metadata.name=node1" {
			t.Errorf("lease watched with field selector %q", f)
		}
		fw := watch.NewFakeWithChanSize(8, false)
		watches <- fw
		return true, fw, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan Renewal, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		WatchLease(ctx, cs, "node1", func(r Renewal) {
			select {
			case got <- r:
			default:
				t.Error("renewal dropped: the test's channel is full")
			}
		}, nil)
	}()
	defer func() { cancel(); <-done }()

	next := func(renew time.Time, gap time.Duration, resync bool) {
		t.Helper()
		select {
		case r := <-got:
			if !r.RenewTime.Equal(renew) || r.Gap != gap || r.Resync != resync || r.Holder != "node1" || r.LeaseDuration != 40*time.Second {
				t.Fatalf("renewal %+v, want renewTime %s gap %v resync %v", r, renew.Format(time.TimeOnly), gap, resync)
			}
			if lag := r.Seen.Sub(r.RenewTime); r.Lag != lag {
				t.Errorf("lag %v, want Seen - RenewTime = %v", r.Lag, lag)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no renewal at %s reported", renew.Format(time.TimeOnly))
		}
	}
	nextWatch := func() *watch.FakeWatcher {
		t.Helper()
		select {
		case fw := <-watches:
			return fw
		case <-time.After(10 * time.Second):
			t.Fatal("the watch was not re-established")
			return nil
		}
	}
	setLease := func(renew time.Time) {
		t.Helper()
		if _, err := cs.CoordinationV1().Leases(NodeLeaseNamespace).Update(ctx, nodeLease("node1", renew), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }

	next(at(0), 0, false) // the first Get
	w1 := nextWatch()
	w1.Modify(nodeLease("node1", at(10)))
	next(at(10), 10*time.Second, false)
	w1.Modify(nodeLease("node1", at(10))) // another field changed: not a renewal
	w1.Modify(nodeLease("node1", at(20)))
	next(at(20), 10*time.Second, false)

	// The server ends the watch: watched on from the last version seen, with no Get.
	w1.Stop()
	w2 := nextWatch()
	w2.Modify(nodeLease("node1", at(30)))
	next(at(30), 10*time.Second, false)
	w2.Modify(nodeLease("node1", at(25))) // older: replayed, not a renewal

	// 410 Gone: watched from now at once, whose first event (the Lease as it is, with a
	// renewal the watches never delivered) is a resync.
	w2.Error(&metav1.Status{Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonExpired, Message: "too old resource version"})
	w3 := nextWatch()
	w3.Add(nodeLease("node1", at(50)))
	next(at(50), 20*time.Second, true)
	w3.Modify(nodeLease("node1", at(60)))
	next(at(60), 10*time.Second, false)

	// Any other failure: a wait, then a Get, whose renewal is a resync.
	setLease(at(70))
	w3.Error(&metav1.Status{Status: metav1.StatusFailure, Code: 500, Reason: metav1.StatusReasonInternalError, Message: "etcd unavailable"})
	next(at(70), 10*time.Second, true)
	w4 := nextWatch()
	w4.Modify(nodeLease("node1", at(80)))
	next(at(80), 10*time.Second, false)

	gets := 0
	for _, a := range cs.Actions() {
		if a.GetResource().Resource == "leases" && a.GetVerb() == "get" {
			gets++
		}
	}
	if gets != 2 {
		t.Errorf("%d gets of the Lease, want 2: at the start and after the failure other than 410", gets)
	}
	select {
	case r := <-got:
		t.Errorf("unexpected renewal %+v", r)
	default:
	}
	for _, a := range cs.Actions() {
		if a.GetResource().Resource == "leases" && a.GetVerb() != "get" && a.GetVerb() != "watch" && a.GetVerb() != "update" {
			t.Errorf("leases %s: the RBAC allows get and watch only", a.GetVerb())
		}
	}
}

func TestWatchLeaseWaitsForTheLease(t *testing.T) {
	cs := newFake()
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan Renewal, 4)
	done := make(chan struct{})
	go func() {
		defer close(done)
		WatchLease(ctx, cs, "node1", func(r Renewal) { got <- r }, nil)
	}()
	time.Sleep(100 * time.Millisecond) // the first Get finds nothing
	if _, err := cs.CoordinationV1().Leases(NodeLeaseNamespace).Create(ctx, nodeLease("node1", t0), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if !r.RenewTime.Equal(t0) || r.Gap != 0 {
			t.Errorf("first renewal %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the lease created late was never reported")
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("WatchLease did not return when its context was done")
	}
}
