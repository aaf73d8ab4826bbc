//go:build linux

package loader

import (
	"os"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
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
