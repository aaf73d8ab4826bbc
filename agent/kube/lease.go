package kube

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// NodeLeaseNamespace holds one Lease per node, renewed by its kubelet.
const NodeLeaseNamespace = corev1.NamespaceNodeLease

// Renewal is one renewal of the node's Lease as the agent saw it.
type Renewal struct {
	RenewTime time.Time // spec.renewTime
	Seen      time.Time // when the agent saw it
	// Gap is the time since the previous renewal seen (0 for the first). A renewal missed
	// while the watch was down makes it span two intervals: Resync says so.
	Gap time.Duration
	// Lag is Seen - RenewTime. RenewTime is the lease holder's clock (the kubelet's: on this
	// node, the agent's own clock, so Lag is the delivery delay through the API server and
	// the watch; for a holder elsewhere it also holds the clocks' skew, and can be negative).
	Lag           time.Duration
	LeaseDuration time.Duration // spec.leaseDurationSeconds
	Holder        string        // spec.holderIdentity: the node's name under a real kubelet
	// Resync: seen by the Get, or the watch from now, that rebuilt the state after a watch
	// failed, not by a watch that went on;
	// renewals between the two may have gone unseen.
	Resync bool
}

// WatchLease reports each renewal of node's Lease in kube-node-lease to out until ctx is done.
// It gets the Lease and watches it by name (RBAC allows get and watch on leases, not list;
// follower), and a renewal is reported once however often it is seen. out is called from
// WatchLease's goroutine and must not block: a slow out delays the renewals after it and so
// inflates their Lag.
func WatchLease(ctx context.Context, api API, node string, out func(Renewal), log *slog.Logger) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	bridgeKlog(log)
	w := &leaseWatch{out: out}
	what := "lease " + NodeLeaseNamespace + "/" + node
	f := &follower[*coordinationv1.Lease]{
		what: what, name: node, seen: w.seen, log: log.With("component", "lease", "node", node),
		get: func(ctx context.Context) (*coordinationv1.Lease, error) {
			l, err := api.GetLease(ctx, NodeLeaseNamespace, node)
			if apierrors.IsNotFound(err) {
				return nil, fmt.Errorf("getting %s: not found (has the kubelet registered the node?)", what)
			}
			if err != nil {
				return nil, fmt.Errorf("getting %s: %w", what, err)
			}
			return l, nil
		},
		watch: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return api.WatchLeases(ctx, NodeLeaseNamespace, opts)
		},
	}
	f.run(ctx)
}

// leaseWatch turns the Lease's versions into renewals.
type leaseWatch struct {
	out  func(Renewal)
	last time.Time // renewTime of the last renewal reported
}

// seen reports l's renewal if it is later than the last one reported: the same renewal seen
// again by a Get, or an older one replayed, is not a renewal. (A holder whose clock stepped
// back is silent here until its clock passes the last renewal again.)
func (w *leaseWatch) seen(l *coordinationv1.Lease, resync bool) {
	if l.Spec.RenewTime == nil {
		return
	}
	rt := l.Spec.RenewTime.Time
	if !rt.After(w.last) {
		return
	}
	now := time.Now()
	r := Renewal{RenewTime: rt, Seen: now, Lag: now.Sub(rt), Resync: resync}
	if !w.last.IsZero() {
		r.Gap = rt.Sub(w.last)
	}
	if d := l.Spec.LeaseDurationSeconds; d != nil {
		r.LeaseDuration = time.Duration(*d) * time.Second
	}
	if h := l.Spec.HolderIdentity; h != nil {
		r.Holder = *h
	}
	w.last = rt
	w.out(r)
}
