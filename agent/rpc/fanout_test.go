package rpc

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestHubCountsLossesInTheNextValue(t *testing.T) {
	h := newHub[int]("value", 2, 4, time.Hour)
	s, err := h.subscribe()
	if err != nil {
		t.Fatal(err)
	}
	for v := range 5 {
		h.publish(v) // 0 and 1 fit, 2..4 are lost
	}
	if d := <-s.c; d.v != 0 || d.lost != 0 {
		t.Errorf("first: %+v", d)
	}
	h.publish(5)
	if d := <-s.c; d.v != 1 || d.lost != 0 {
		t.Errorf("second: %+v", d)
	}
	if d := <-s.c; d.v != 5 || d.lost != 3 {
		t.Errorf("after the losses: %+v, want 5 after 3 lost", d)
	}
	if got := h.lost.Load(); got != 3 {
		t.Errorf("hub lost %d", got)
	}
	if got := h.unsubscribe(s); got != 3 {
		t.Errorf("subscriber lost %d", got)
	}
}

func TestHubDropsAStuckSubscriber(t *testing.T) {
	h := newHub[int]("value", 1, 4, 0)
	stuck, _ := h.subscribe()
	h.publish(1)
	h.publish(2)
	<-stuck.gone
	if status.Code(stuck.why) != codes.ResourceExhausted {
		t.Errorf("dropped with %v", stuck.why)
	}
	other, _ := h.subscribe() // the dropped one no longer counts, nor gets values
	h.publish(3)
	if d := <-other.c; d.v != 3 {
		t.Errorf("got %+v", d)
	}
	if len(stuck.c) != 1 {
		t.Errorf("the dropped subscriber was offered more")
	}
}

func TestHubLimitsAndClose(t *testing.T) {
	h := newHub[int]("value", 1, 1, time.Hour)
	s, _ := h.subscribe()
	if _, err := h.subscribe(); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("second subscriber: %v", err)
	}
	h.close()
	<-s.gone
	if status.Code(s.why) != codes.Unavailable {
		t.Errorf("closed with %v", s.why)
	}
	if _, err := h.subscribe(); status.Code(err) != codes.Unavailable {
		t.Errorf("subscribing after close: %v", err)
	}
}

// A full hub gives the slot of the subscriber behind longest to a new one; with every
// subscriber keeping up, the new one is refused.
func TestHubGivesASlowSubscribersSlotAway(t *testing.T) {
	h := newHub[int]("value", 1, 3, time.Hour)
	slow, _ := h.subscribe()
	h.publish(0)
	h.publish(1) // slow loses it: behind from now on
	time.Sleep(time.Millisecond)
	slower, _ := h.subscribe()
	keeping, _ := h.subscribe() // three: the most
	h.publish(2)                // slower and keeping queue it
	<-keeping.c
	h.publish(3) // slower loses it: behind since after slow
	<-keeping.c

	gone := func(s *subscriber[int]) bool {
		select {
		case <-s.gone:
			return status.Code(s.why) == codes.ResourceExhausted
		default:
			return false
		}
	}
	if _, err := h.subscribe(); err != nil || !gone(slow) || gone(slower) {
		t.Fatalf("a new subscriber: %v; the one behind longest dropped %v, the other %v", err, gone(slow), gone(slower))
	}
	if _, err := h.subscribe(); err != nil || !gone(slower) || gone(keeping) {
		t.Fatalf("a second new subscriber: %v; the other behind dropped %v, the one keeping up %v", err, gone(slower), gone(keeping))
	}
	if _, err := h.subscribe(); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a subscriber beside three keeping up: %v, want refused", err)
	}
}
