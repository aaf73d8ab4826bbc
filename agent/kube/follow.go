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

// watchTimeout is how long the server keeps a watch open before ending it (less a fifth, at
// random); it is then opened again from the last version seen, so a watch that silently
// stopped delivering costs at most this. A variable for the fleet test only.
var watchTimeout = 5 * time.Minute

const (
	// getTimeout bounds one Get of the Lease or the Node.
	getTimeout = 10 * time.Second
	// retryMin and retryMax bound the wait after a failed Get or watch, doubled each time and
	// drawn at random from its upper half, so that a fleet's agents that lost the API server
	// together do not come back together.
	retryMin, retryMax = time.Second, 30 * time.Second
)

// object is what a follower follows: an API object with a name and a resourceVersion.
type object interface {
	runtime.Object
	GetName() string
	GetResourceVersion() string
}

// follower keeps one named object followed with the fewest requests. It gets the object
// (an error then names what is missing) and watches it by name from the Get's version; when
// the server ends the watch in its time, it watches on from the last version seen (bookmarks
// keep it recent), with no Get. A version the server no longer holds (410 Gone: after an API
// server restart, or the Get's own, the object's last change, older than the server's watch
// cache) is followed at once by a watch from now (fromNow); any other failure, that one's
// too, by a wait and a Get afresh. An agent steady on its node
// so makes about one request per object per watchTimeout (docs/agent.md, "API cost").
type follower[T object] struct {
	what  string // "lease kube-node-lease/x": logs and errors
	name  string
	get   func(ctx context.Context) (T, error)
	watch func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	// seen is called with each version of the object: resync when it comes after a failure
	// (from a Get, or the first of a watch from now after a 410), versions between
	// having perhaps gone unseen.
	seen func(obj T, resync bool)
	log  *slog.Logger
}

func (f *follower[T]) run(ctx context.Context) {
	retry := retryMin
	get, resync := true, false
	rv := ""
	for ctx.Err() == nil {
		var err error
		if get {
			// What the Get reports is the resync; the watch from its version misses nothing.
			rv, err = f.getOnce(ctx, resync)
			resync = err != nil
		}
		start := time.Now()
		if err == nil {
			get = false
			rv, resync, err = f.watchFrom(ctx, rv, resync)
		}
		if ctx.Err() != nil {
			return
		}
		ran := time.Since(start)
		var wait time.Duration
		switch {
		case isGone(err) && rv != fromNow:
			// The version is too old for the server (the Get's own may be as old: the
			// object's last change): the object as the server holds it, at once.
			f.log.Debug("following the "+f.what+": watching from now", "err", err)
			rv, resync = fromNow, true
			continue
		case err != nil:
			f.log.Warn("following the "+f.what, "err", err, "retry", retry)
			if ran >= retryMax {
				retry = retryMin // it had been working: start the waits over
			}
			get, resync = true, true
			wait, retry = jittered(retry), min(2*retry, retryMax)
		case ran >= retryMin:
			retry = retryMin // a watch that ended in its time: watch on at once
			continue
		default:
			// A watch the server ended at once: not a tight loop.
			wait, retry = jittered(retry), min(2*retry, retryMax)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// isGone reports a resourceVersion the server no longer holds.
func isGone(err error) bool { return apierrors.IsResourceExpired(err) || apierrors.IsGone(err) }

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

// fromNow is the resourceVersion of a watch that starts with the object as the server holds it
// ("0", any version: from the watch cache). An API server whose storage lacks progress
// notifications (RequestWatchProgress; the test cluster's etcd) refuses it, and the follower
// then gets the object again, until its version is one the server holds.
const fromNow = "0"

// watchFrom follows the object from version rv (fromNow: starting with the object as it is)
// until the server ends the watch (nil) or it fails, and returns the last version seen and
// whether a resync is still to be reported (the first version a watch from now delivers is the
// resync, if one was due).
func (f *follower[T]) watchFrom(ctx context.Context, rv string, resync bool) (string, bool, error) {
	timeout := int64((watchTimeout - rand.N(watchTimeout/5)).Seconds())
	wi, err := f.watch(ctx, metav1.ListOptions{
		FieldSelector:       fields.OneTermEqualSelector("metadata.name", f.name).String(),
		ResourceVersion:     rv,
		TimeoutSeconds:      &timeout,
		AllowWatchBookmarks: true,
	})
	if err != nil {
		return rv, resync, fmt.Errorf("watching %s: %w", f.what, err)
	}
	defer wi.Stop()
	for {
		select {
		case <-ctx.Done():
			return rv, resync, nil
		case ev, ok := <-wi.ResultChan():
			if !ok {
				return rv, resync, nil
			}
			if ev.Type == watch.Error {
				return rv, resync, fmt.Errorf("watching %s: %w", f.what, apierrors.FromObject(ev.Object))
			}
			obj, ok := ev.Object.(T)
			if !ok || ev.Type != watch.Bookmark && obj.GetName() != f.name {
				continue
			}
			if v := obj.GetResourceVersion(); v != "" {
				rv = v
			}
			switch ev.Type {
			case watch.Added, watch.Modified:
				f.seen(obj, resync)
				resync = false
			case watch.Deleted:
				f.log.Info(f.what + " deleted")
			}
		}
	}
}
