package collect

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nodectl/nodectl/rundir"
)

// tiered counts how it was sampled: in part (Sample) or in full (SampleFull).
type tiered struct{ part, full int }

func (s *tiered) Sample(now time.Time) ([]rundir.Record, error) {
	s.part++
	return []rundir.Record{{Type: rundir.TypeSample, Time: now, Metric: "part"}}, nil
}

func (s *tiered) SampleFull(now time.Time) ([]rundir.Record, error) {
	s.full++
	return []rundir.Record{{Type: rundir.TypeSample, Time: now, Metric: "full"}}, nil
}

type appended struct {
	mu      sync.Mutex
	batches int
}

func (a *appended) Append(...rundir.Record) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.batches++
	return nil
}

func (a *appended) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.batches
}

// Snapshots (the window edges) read a FullSampler in full, the interval ticks through Sample;
// a plain Source is sampled by both.
func TestSnapshotFullTicksPart(t *testing.T) {
	ts, plain := &tiered{}, 0
	sources := map[string]Source{
		"tiered": ts,
		"plain": SourceFunc(func(now time.Time) ([]rundir.Record, error) {
			plain++
			return nil, nil
		}),
	}
	out := &appended{}
	c := New(sources, out, 5*time.Millisecond, nil, slog.New(slog.DiscardHandler))
	if err := c.Snapshot(time.Now()); err != nil {
		t.Fatal(err)
	}
	if ts.full != 1 || ts.part != 0 || plain != 1 {
		t.Fatalf("snapshot: %d full, %d partial, %d plain samples; want 1, 0, 1", ts.full, ts.part, plain)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(ctx) }()
	for deadline := time.Now().Add(5 * time.Second); out.count() < 4 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Run has returned: the counters are no longer written.
	if ts.full != 1 || ts.part < 3 || plain != ts.part+1 {
		t.Fatalf("after ticks: %d full, %d partial, %d plain samples; want 1 full, at least 3 partial, plain one more than partial", ts.full, ts.part, plain)
	}
}

// First puts one source before the others, which follow in name order, in every collection.
func TestFirstSamplesBeforeTheOthers(t *testing.T) {
	var got []string
	src := func(name string) Source {
		return SourceFunc(func(now time.Time) ([]rundir.Record, error) {
			got = append(got, name)
			return nil, nil
		})
	}
	c := New(map[string]Source{"cgroups": src("cgroups"), "node": src("node"), "trace": src("trace")}, &appended{}, time.Second, nil,
		slog.New(slog.DiscardHandler)).First("trace")
	for range 3 {
		got = got[:0]
		if err := c.Snapshot(time.Now()); err != nil {
			t.Fatal(err)
		}
		if want := []string{"trace", "cgroups", "node"}; !slices.Equal(got, want) {
			t.Fatalf("sampled in order %v, want %v", got, want)
		}
	}
}
