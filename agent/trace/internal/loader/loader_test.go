//go:build linux

package loader

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/nodectl/nodectl/agent/trace/internal/features"
)

func TestHistSum(t *testing.T) {
	var s HistSum
	s.Add([]uint64{1, 0, 2}, 3, 30)
	s.Add([]uint64{0, 4}, 4, 40)
	h := s.Log2()
	if !slices.Equal(h.Buckets, []uint64{1, 4, 2}) || h.Count != 7 || h.SumNs != 70 {
		t.Errorf("sum = %+v, want buckets [1 4 2], count 7, sum 70", h)
	}
}

// DeleteIf deletes exactly the keys it is told to, including when they are most of the map.
func TestDeleteIf(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes a BPF map")
	}
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 8, ValueSize: 8, MaxEntries: 64})
	if err != nil {
		t.Fatalf("making map: %v", err)
	}
	defer m.Close()
	for k := range uint64(50) {
		if err := m.Put(k, k); err != nil {
			t.Fatal(err)
		}
	}
	n, err := DeleteIf(m, func(k uint64) bool { return k%10 != 0 })
	if err != nil || n != 45 {
		t.Fatalf("DeleteIf = %d, %v; want 45", n, err)
	}
	var left []uint64
	var k, v uint64
	it := m.Iterate()
	for it.Next(&k, &v) {
		left = append(left, k)
	}
	slices.Sort(left)
	if !slices.Equal(left, []uint64{0, 10, 20, 30, 40}) {
		t.Errorf("left %v, want the multiples of 10", left)
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
}

// countHandler counts the records logged at warning level or above.
type countHandler struct{ warnings atomic.Int32 }

func (h *countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		h.warnings.Add(1)
	}
	return nil
}
func (h *countHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countHandler) WithGroup(string) slog.Handler      { return h }

// An inconclusive allocator probe is cached for the process, so it is reported once however
// many objects load; absent and present say nothing.
func TestLazyAllocWarnsOnce(t *testing.T) {
	probe := features.HaveBPFMemAlloc
	t.Cleanup(func() { features.HaveBPFMemAlloc = probe })
	h := &countHandler{}
	log := slog.New(h)
	for _, c := range []struct {
		name string
		err  error
		lazy bool
	}{
		{"present", nil, true},
		{"absent", ebpf.ErrNotSupported, false},
		{"inconclusive", errors.New("reading kernel BTF: boom"), false},
	} {
		features.HaveBPFMemAlloc = func() error { return c.err }
		for range 3 { // as runq, fsync and blkio do
			if got := lazyAlloc(log); got != c.lazy {
				t.Errorf("%s: lazyAlloc = %v, want %v", c.name, got, c.lazy)
			}
		}
	}
	if n := h.warnings.Load(); n != 1 {
		t.Errorf("%d warnings over three inconclusive probes, want 1", n)
	}
}
