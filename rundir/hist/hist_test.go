package hist

import "testing"

func TestLongestAtLeast(t *testing.T) {
	// 1000 waits of ~1 µs and one of ~17 s (bucket 34: [2^34, 2^35) ns).
	b := make([]uint64, 35)
	b[10], b[34] = 1000, 1
	h := FromSlots(b, 1001, 0)
	if got := h.LongestAtLeast(); got < 17.1 || got > 17.2 {
		t.Errorf("LongestAtLeast = %.3fs, want 2^34 ns = 17.18s", got)
	}
	if p99 := h.Quantile(0.99); p99 > 0.001 {
		t.Errorf("p99 %.6fs: the one long wait must not show in it (that is why LongestAtLeast exists)", p99)
	}
	if got := (Log2{}).LongestAtLeast(); got != 0 {
		t.Errorf("empty histogram: %v", got)
	}
}
