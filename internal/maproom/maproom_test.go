package maproom

import (
	"runtime"
	"testing"
)

// heapAfter returns the live heap once m is reachable only through keep.
func heapAfter(keep func()) uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	keep()
	return ms.HeapAlloc
}

// A map that held 100,000 entries and keeps 10 is made again, holding the same entries in a
// fraction of the memory; a map that did not shrink much is left as it is.
func TestFitGivesBackTheRoomOfAShrunkMap(t *testing.T) {
	var r Room
	m := map[int]int{}
	for i := range 100_000 {
		m[i] = i
	}
	r.Saw(len(m))
	for i := 10; i < 100_000; i++ {
		delete(m, i)
	}
	grown := heapAfter(func() { _ = len(m) })
	m = Fit(&r, m)
	fit := heapAfter(func() { _ = len(m) })
	if len(m) != 10 || m[9] != 9 {
		t.Fatalf("Fit lost entries: %v", m)
	}
	if fit*2 > grown {
		t.Errorf("the heap was %d bytes with the shrunk map and is %d with its copy", grown, fit)
	}

	r.Saw(Floor)
	if r.Oversized(2) {
		t.Error("a map that never held more than twice its entries plus the floor is oversized")
	}
	r.Saw(3*Floor + 10)
	if !r.Oversized(Floor) {
		t.Error("a map that held 3,082 entries and holds 1,024 is not oversized")
	}
	r.Made(Floor)
	if r.Oversized(Floor) {
		t.Error("Made did not reset the room")
	}
}

// Delete removes the keys and gives back the room of a map that shrank far.
func TestDeleteShrinks(t *testing.T) {
	var r Room
	m := map[int]int{}
	var keys []int
	for i := range 10_000 {
		m[i] = i
		if i >= 10 {
			keys = append(keys, i)
		}
	}
	m = Delete(&r, m, keys)
	if len(m) != 10 || m[9] != 9 || r.most != 10 {
		t.Errorf("after Delete: %d entries, room %d; want the 10 kept, made again at their size", len(m), r.most)
	}
}
