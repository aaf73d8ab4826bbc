//go:build linux

package loader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/nodectl/nodectl/record/trace/internal/features"
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
	var b Batch[uint64, uint64]
	n, err := b.DeleteIf(m, func(k uint64) bool { return k%10 != 0 })
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

// Each reads every entry of a per-CPU hash map once, over several batches, with each CPU's
// value, and of a plain hash map; a reused Batch reads the same again.
func TestBatchEach(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes BPF maps")
	}
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	const entries = 3*batchKeys + 7
	for _, typ := range []ebpf.MapType{ebpf.PerCPUHash, ebpf.Hash} {
		m, err := ebpf.NewMap(&ebpf.MapSpec{Type: typ, KeySize: 8, ValueSize: 8, MaxEntries: 2 * entries})
		if err != nil {
			t.Fatalf("making %v map: %v", typ, err)
		}
		defer m.Close()
		for k := range uint64(entries) {
			v := any(k)
			if typ == ebpf.PerCPUHash {
				per := make([]uint64, cpus)
				for c := range per {
					per[c] = k*100 + uint64(c)
				}
				v = per
			}
			if err := m.Put(k, v); err != nil {
				t.Fatal(err)
			}
		}
		var b Batch[uint64, uint64]
		for round := range 2 {
			seen := map[uint64]bool{}
			err := b.Each(m, func(k uint64, vs []uint64) {
				if seen[k] {
					t.Errorf("%v round %d: key %d seen twice", typ, round, k)
				}
				seen[k] = true
				want := []uint64{k}
				if typ == ebpf.PerCPUHash {
					want = want[:0]
					for c := range cpus {
						want = append(want, k*100+uint64(c))
					}
				}
				if !slices.Equal(vs, want) {
					t.Errorf("%v round %d: key %d has %v, want %v", typ, round, k, vs, want)
				}
			})
			if err != nil || len(seen) != entries {
				t.Fatalf("%v round %d: Each read %d keys, %v; want %d", typ, round, len(seen), err, entries)
			}
		}
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

// Changed passes on new and changed entries only, counts them all, and passes on again a key
// that left and came back.
func TestBatchChanged(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes a BPF map")
	}
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.PerCPUHash, KeySize: 8, ValueSize: 8, MaxEntries: 1024})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	put := func(k, v uint64) {
		per := make([]uint64, cpus)
		per[cpus-1] = v // the last CPU's copy only: a change anywhere counts
		if err := m.Put(k, per); err != nil {
			t.Fatal(err)
		}
	}
	const entries = 600 // more than a batch
	for k := range uint64(entries) {
		put(k, 1)
	}
	for _, sig := range []func(uint64) uint64{nil, func(v uint64) uint64 { return v }} {
		var b Batch[uint64, uint64]
		changed := func() []uint64 {
			t.Helper()
			var got []uint64
			n, err := b.Changed(m, sig, func(k uint64, _ []uint64) { got = append(got, k) })
			if err != nil || n != int(entries) {
				t.Fatalf("Changed counted %d entries, %v; want %d", n, err, entries)
			}
			slices.Sort(got)
			return got
		}
		if got := changed(); len(got) != entries {
			t.Fatalf("first Changed passed on %d entries, want all %d", len(got), entries)
		}
		if got := changed(); len(got) != 0 {
			t.Fatalf("unchanged map: passed on %v", got)
		}
		put(7, 2)
		put(500, 9)
		if got := changed(); !slices.Equal(got, []uint64{7, 500}) {
			t.Fatalf("passed on %v, want the two changed keys 7 and 500", got)
		}
		if err := m.Delete(uint64(3)); err != nil {
			t.Fatal(err)
		}
		put(entries, 1) // keeps the count
		if got := changed(); !slices.Equal(got, []uint64{entries}) {
			t.Fatalf("passed on %v, want the new key only", got)
		}
		m.Delete(uint64(entries))
		put(3, 1) // back, unchanged in value
		if got := changed(); !slices.Equal(got, []uint64{3}) {
			t.Fatalf("passed on %v, want the key that came back", got)
		}
		put(7, 1) // back to what it was first, for the next round
		put(500, 1)
	}
}

// BenchmarkBatchRead reads a per-CPU hash of 3,000-4,000 entries of a run-queue pair's size, as
// the tracer did every interval on a node of 1,000 cgroups: walked key by key and in batches,
// at two capacities (the kernel walks every bucket, which a capacity rounds up to a power of
// two).
func BenchmarkBatchRead(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root: makes a BPF map")
	}
	type key struct{ Victim, Preemptor, Kind uint64 }
	type val struct{ Count, WaitNs uint64 }
	for _, capacity := range []uint32{4096, 16384} {
		m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.PerCPUHash, KeySize: 24, ValueSize: 16, MaxEntries: capacity, Flags: 1 /* BPF_F_NO_PREALLOC */})
		if err != nil {
			b.Fatal(err)
		}
		defer m.Close()
		cpus, err := ebpf.PossibleCPU()
		if err != nil {
			b.Fatal(err)
		}
		const entries = 4000
		for i := range uint64(min(entries, uint64(capacity)*3/4)) {
			if err := m.Put(key{i / 4, i, i % 2}, make([]val, cpus)); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(fmt.Sprintf("walk/cap=%d", capacity), func(b *testing.B) {
			for b.Loop() {
				var k key
				var vs []val
				it := m.Iterate()
				for it.Next(&k, &vs) {
				}
				if err := it.Err(); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("batch/cap=%d", capacity), func(b *testing.B) {
			var batch Batch[key, val]
			for b.Loop() {
				if err := batch.Each(m, func(key, []val) {}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
