package kube

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

const (
	// getTimeout bounds one Get of the Lease or the Node.
	getTimeout = 10 * time.Second
	// watchTimeout is how long the server keeps a watch open before ending it (less a fifth,
	// at random); it is then opened again from the last version seen, so a watch that
	// silently stopped delivering costs at most this.
	watchTimeout = 5 * time.Minute
	// retryMin and retryMax bound the wait after a failed Get or watch, doubled each time and
	// drawn at random from its upper half, so that a fleet's agents that lost the API server
	// together do not come back together.
	retryMin, retryMax = time.Second, 30 * time.Second
)

// object is what a follower follows: an API object with a resourceVersion.
type object interface {
	runtime.Object
	GetResourceVersion() string
}

// follower keeps one named object followed with the fewest requests: a Get, then a watch by
// name from the Get's version; when the server ends the watch in its time, a new one from
// the last version seen (bookmarks keep it recent), and a Get afresh only after a failure
// (410 Gone among them: the version is too old). An agent steady on its node so makes about
// one request per object per watchTimeout (docs/agent.md, "API cost").
type follower[T object] struct {
	what  string // "lease kube-node-lease/x": logs and errors
	name  string
	get   func(ctx context.Context) (T, error)
	watch func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	// seen is called with each version of the object: from a Get (resync: it rebuilt the
	// state after a failure, and versions between may have gone unseen) or the watch.
	seen func(obj T, resync bool)
	log  *slog.Logger
}

func (f *follower[T]) run(ctx context.Context) {
	retry := retryMin
	rv, first := "", true
	for ctx.Err() == nil {
		var err error
		if rv == "" {
			rv, err = f.getOnce(ctx, !first)
			first = first && err != nil
		}
		start := time.Now()
		if err == nil {
			rv, err = f.watchFrom(ctx, rv)
		}
		if ctx.Err() != nil {
			return
		}
		var wait time.Duration
		switch {
		case err != nil:
			f.log.Warn("following the "+f.what, "err", err, "retry", retry)
			rv = ""
			wait, retry = jittered(retry), min(2*retry, retryMax)
		case time.Since(start) >= retryMin:
			retry = retryMin // a watch that ended in its time: watch on at once
			continue
		default:
			wait = jittered(retryMin) // a watch ended at once: not a tight loop
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// jittered is a wait drawn from [d/2, d).
func jittered(d time.Duration) time.Duration { return d/2 + rand.N(d/2) }

// getOnce gets the object, reports it and returns its version.
func (f *follower[T]) getOnce(ctx context.Context, resync bool) (string, error) {
	gctx, cancel := context.WithTimeout(ctx, getTimeout)
	defer cancel()
	obj, err := f.get(gctx)
	if err != nil {
		return "", err
	}
	f.seen(obj, resync)
	return obj.GetResourceVersion(), nil
}

// watchFrom follows the object from version rv until the server ends the watch (nil) or it
// fails, and returns the last version seen.
func (f *follower[T]) watchFrom(ctx context.Context, rv string) (string, error) {
	timeout := int64((watchTimeout - rand.N(watchTimeout/5)).Seconds())
	wi, err := f.watch(ctx, metav1.ListOptions{
		FieldSelector:       fields.OneTermEqualSelector("metadata.name", f.name).String(),
		ResourceVersion:     rv,
		TimeoutSeconds:      &timeout,
		AllowWatchBookmarks: true,
	})
	if err != nil {
		return rv, fmt.Errorf("watching %s: %w", f.what, err)
	}
	defer wi.Stop()
	for {
		select {
		case <-ctx.Done():
			return rv, nil
		case ev, ok := <-wi.ResultChan():
			if !ok {
				return rv, nil
			}
			switch ev.Type {
			case watch.Error:
				return rv, fmt.Errorf("watching %s: %w", f.what, apierrors.FromObject(ev.Object))
			case watch.Deleted:
				f.log.Info(f.what + " deleted")
			}
			obj, ok := ev.Object.(T)
			if !ok {
				continue
			}
			if v := obj.GetResourceVersion(); v != "" {
				rv = v
			}
			if ev.Type == watch.Added || ev.Type == watch.Modified {
				f.seen(obj, false)
			}
		}
	}
}
