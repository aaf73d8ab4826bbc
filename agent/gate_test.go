package agent

import (
	"context"
	"errors"
	"testing"
	"time"
)

// The gate runs one at a time, queues a bounded few, refuses the rest, and lets a waiter that
// gives up go without holding its place.
func TestGateBoundsAnalyses(t *testing.T) {
	g := newGate(1, 2)
	leave, err := g.enter(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		leave func()
		err   error
	}
	waiting := make(chan result, 2)
	gaveUp, giveUp := context.WithCancel(context.Background())
	go func() { l, err := g.enter(gaveUp); waiting <- result{l, err} }()
	go func() { l, err := g.enter(context.Background()); waiting <- result{l, err} }()
	for len(g.queue) < 3 {
		time.Sleep(time.Millisecond)
	}
	if _, err := g.enter(context.Background()); !errors.Is(err, errBusy) {
		t.Errorf("a fourth analysis with one running and two waiting: %v, want errBusy", err)
	}
	giveUp()
	if r := <-waiting; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("the waiter that gave up: %v, want canceled", r.err)
	}
	if len(g.queue) != 2 {
		t.Errorf("%d places held after a waiter gave up, want 2", len(g.queue))
	}
	leave()
	r := <-waiting
	if r.err != nil {
		t.Fatalf("the waiter left: %v", r.err)
	}
	r.leave()
	if len(g.queue) != 0 || len(g.slots) != 0 {
		t.Errorf("%d queued and %d running after all left", len(g.queue), len(g.slots))
	}
}

// stopOn closes when its context is done or its stop channel closes, not before.
func TestStopOn(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	stop := make(chan struct{})
	c, release := stopOn(ctx, stop)
	defer release()
	select {
	case <-c:
		t.Fatal("closed before anything happened")
	case <-time.After(10 * time.Millisecond):
	}
	cancel()
	<-c // closes on the context; a test timeout otherwise
	c2, release2 := stopOn(context.Background(), stop)
	defer release2()
	close(stop)
	<-c2
}
