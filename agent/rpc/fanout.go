package rpc

import (
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// hub fans published values out to stream subscribers without ever blocking the publisher:
// each subscriber has a bounded queue, a value that does not fit is lost to that subscriber
// alone, and the next value it gets carries the count.
type hub[T any] struct {
	what       string        // what a value is, for errors: "sample batch", "incident update"
	queue      int           // each subscriber's queue length
	stuckAfter time.Duration // a subscriber losing every value this long is dropped; 0 at the first loss
	max        int           // subscribers at once

	lost atomic.Uint64 // values lost, across subscribers, since the hub started

	mu     sync.Mutex // publish holds it: a subscriber's losses are counted in order
	subs   map[*subscriber[T]]struct{}
	closed bool
}

// delivery is a value and how many values its subscriber lost just before it.
type delivery[T any] struct {
	v    T
	lost uint64
}

type subscriber[T any] struct {
	c    chan delivery[T]
	gone chan struct{} // closed when the hub drops the subscriber; why says why
	why  error

	// Guarded by the hub's mu.
	lost      uint64    // lost since the last value queued
	lostTotal uint64    // lost since it subscribed
	fullSince time.Time // when it lost the first of the values lost since the last one queued
}

func newHub[T any](what string, queue, max int, stuckAfter time.Duration) *hub[T] {
	return &hub[T]{what: what, queue: queue, max: max, stuckAfter: stuckAfter, subs: map[*subscriber[T]]struct{}{}}
}

// subscribe adds a subscriber. When the hub has its most, the one behind longest (losing
// values now) gives up its slot: watchers too slow to keep up cannot hold every slot until
// stuckAfter; when all keep up, the new one is refused.
func (h *hub[T]) subscribe() (*subscriber[T], error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, status.Error(codes.Unavailable, "agent shutting down")
	}
	if len(h.subs) >= h.max {
		var behind *subscriber[T]
		for s := range h.subs {
			if s.lost > 0 && (behind == nil || s.fullSince.Before(behind.fullSince)) {
				behind = s
			}
		}
		if behind == nil {
			return nil, status.Errorf(codes.ResourceExhausted, "%d watchers already, all keeping up: the most the agent serves", h.max)
		}
		h.drop(behind, status.Errorf(codes.ResourceExhausted, "too slow: lost %d %ss in a row, and a new watcher needed the slot", behind.lost, h.what))
	}
	s := &subscriber[T]{c: make(chan delivery[T], h.queue), gone: make(chan struct{})}
	h.subs[s] = struct{}{}
	return s, nil
}

// unsubscribe forgets s and returns how many values it lost.
func (h *hub[T]) unsubscribe(s *subscriber[T]) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.subs, s)
	return s.lostTotal
}

// publish offers v to every subscriber and returns at once.
func (h *hub[T]) publish(v T) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var now time.Time
	for s := range h.subs {
		select {
		case s.c <- delivery[T]{v: v, lost: s.lost}:
			s.lost, s.fullSince = 0, time.Time{}
			continue
		default:
		}
		s.lost++
		s.lostTotal++
		h.lost.Add(1)
		if now.IsZero() {
			now = time.Now()
		}
		if s.fullSince.IsZero() {
			s.fullSince = now
		}
		if now.Sub(s.fullSince) >= h.stuckAfter {
			h.drop(s, status.Errorf(codes.ResourceExhausted, "too slow: lost %d %ss in a row", s.lost, h.what))
		}
	}
}

// drop ends s's stream with why; the caller holds mu.
func (h *hub[T]) drop(s *subscriber[T], why error) {
	delete(h.subs, s)
	s.why = why
	close(s.gone)
}

// close ends every stream and refuses new subscribers.
func (h *hub[T]) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for s := range h.subs {
		h.drop(s, status.Error(codes.Unavailable, "agent shutting down"))
	}
}
