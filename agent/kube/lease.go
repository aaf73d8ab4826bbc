package kube

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
)

// NodeLeaseNamespace holds one Lease per node, renewed by its kubelet.
const NodeLeaseNamespace = corev1.NamespaceNodeLease

const (
	// getTimeout bounds one Get of the Lease or the Node.
	getTimeout = 10 * time.Second
	// watchTimeout is how long the server keeps a lease watch open before ending it; it is
	// then rebuilt from a Get, so a watch that silently stopped delivering costs at most this.
	watchTimeout = 5 * time.Minute
	// retryMin and retryMax bound the wait after a failed Get or watch, doubled each time.
	retryMin, retryMax = time.Second, 30 * time.Second
)

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
	// Resync: seen by the Get that rebuilt the state after a watch ended, not by the watch;
	// renewals between the two may have gone unseen.
	Resync bool
}

// WatchLease reports each renewal of node's Lease in kube-node-lease to out until ctx is done.
// It gets the Lease and watches it by name (RBAC allows get and watch on leases, not list);
// a watch that ends or fails is rebuilt from a new Get, and a renewal is reported once however
// often it is seen. out is called from WatchLease's goroutine and must not block: a slow out
// delays the renewals after it and so inflates their Lag.
func WatchLease(ctx context.Context, api API, node string, out func(Renewal), log *slog.Logger) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	bridgeKlog(log)
	w := &leaseWatch{api: api, node: node, out: out, log: log.With("component", "lease", "node", node)}
	w.run(ctx)
}

type leaseWatch struct {
	api  API
	node string
	out  func(Renewal)
	log  *slog.Logger
	last time.Time // renewTime of the last renewal reported
}

func (w *leaseWatch) run(ctx context.Context) {
	retry := retryMin
	first := true
	for ctx.Err() == nil {
		rv, err := w.get(ctx, !first)
		start := time.Now()
		if err == nil {
			first = false
			err = w.watch(ctx, rv)
		}
		if ctx.Err() != nil {
			return
		}
		wait := retryMin
		switch {
		case err != nil:
			w.log.Warn("following the node lease", "err", err, "retry", retry)
			wait, retry = retry, min(2*retry, retryMax)
		case time.Since(start) >= retryMin:
			retry = retryMin // a watch that ended in its time: rebuild at once
			continue
		}
		// A failure, or a watch ended at once: not a tight loop of gets.
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// get reads the Lease, reports its renewal if new, and returns its resourceVersion.
func (w *leaseWatch) get(ctx context.Context, resync bool) (string, error) {
	gctx, cancel := context.WithTimeout(ctx, getTimeout)
	defer cancel()
	l, err := w.api.GetLease(gctx, NodeLeaseNamespace, w.node)
	if apierrors.IsNotFound(err) {
		return "", fmt.Errorf("getting lease %s/%s: not found (has the kubelet registered the node?)", NodeLeaseNamespace, w.node)
	}
	if err != nil {
		return "", fmt.Errorf("getting lease %s/%s: %w", NodeLeaseNamespace, w.node, err)
	}
	w.seen(l, resync)
	return l.ResourceVersion, nil
}

// watch follows the Lease from resourceVersion rv until the server ends the watch (nil) or
// it fails.
func (w *leaseWatch) watch(ctx context.Context, rv string) error {
	// Jittered so that a fleet's agents do not all come back at once.
	timeout := int64((watchTimeout - time.Duration(rand.Int64N(int64(watchTimeout/5)))).Seconds())
	wi, err := w.api.WatchLeases(ctx, NodeLeaseNamespace, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", w.node).String(),
		ResourceVersion: rv,
		TimeoutSeconds:  &timeout,
	})
	if err != nil {
		return fmt.Errorf("watching lease %s/%s: %w", NodeLeaseNamespace, w.node, err)
	}
	defer wi.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-wi.ResultChan():
			if !ok {
				return nil
			}
			switch ev.Type {
			case watch.Added, watch.Modified:
				if l, ok := ev.Object.(*coordinationv1.Lease); ok {
					w.seen(l, false)
				}
			case watch.Deleted:
				w.log.Info("lease deleted", "lease", NodeLeaseNamespace+"/"+w.node)
			case watch.Error:
				// 410 Gone among them: the resourceVersion is too old; a Get starts afresh.
				return fmt.Errorf("watching lease %s/%s: %w", NodeLeaseNamespace, w.node, apierrors.FromObject(ev.Object))
			}
		}
	}
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
