// Package hist holds the log2 latency histogram that the BPF programs aggregate in the kernel
// and that the recorder and analyzer carry: bucket i counts values in [2^i, 2^(i+1))
// nanoseconds (bucket 0 also counts 0).
package hist

import "math"

// Slots is the number of buckets, matching HIST_SLOTS in bpf/include/common.h.
const Slots = 40

// Log2 is a cumulative log2 histogram of nanosecond values.
type Log2 struct {
	Buckets []uint64 `json:"buckets"` // trailing empty buckets are trimmed
	Count   uint64   `json:"count"`
	SumNs   uint64   `json:"sum_ns"`
}

// FromSlots builds a histogram from per-CPU slot arrays summed by the caller.
func FromSlots(slots []uint64, count, sum uint64) Log2 {
	h := Log2{Buckets: append([]uint64(nil), slots...), Count: count, SumNs: sum}
	h.trim()
	return h
}

func (h *Log2) trim() {
	n := len(h.Buckets)
	for n > 0 && h.Buckets[n-1] == 0 {
		n--
	}
	h.Buckets = h.Buckets[:n]
}

// Add returns h + o.
func (h Log2) Add(o Log2) Log2 {
	n := max(len(h.Buckets), len(o.Buckets))
	out := Log2{Buckets: make([]uint64, n), Count: h.Count + o.Count, SumNs: h.SumNs + o.SumNs}
	for i := range out.Buckets {
		if i < len(h.Buckets) {
			out.Buckets[i] += h.Buckets[i]
		}
		if i < len(o.Buckets) {
			out.Buckets[i] += o.Buckets[i]
		}
	}
	out.trim()
	return out
}

// Sub returns h - o, the events between two cumulative snapshots. A bucket that went
// backwards (the cgroup was removed and its entry recreated) is clamped at zero.
func (h Log2) Sub(o Log2) Log2 {
	out := Log2{Buckets: make([]uint64, len(h.Buckets))}
	for i := range out.Buckets {
		var ov uint64
		if i < len(o.Buckets) {
			ov = o.Buckets[i]
		}
		if h.Buckets[i] > ov {
			out.Buckets[i] = h.Buckets[i] - ov
		}
	}
	if h.Count > o.Count {
		out.Count = h.Count - o.Count
	}
	if h.SumNs > o.SumNs {
		out.SumNs = h.SumNs - o.SumNs
	}
	out.trim()
	return out
}

// Mean returns the mean value in seconds, 0 for an empty histogram.
func (h Log2) Mean() float64 {
	if h.Count == 0 {
		return 0
	}
	return float64(h.SumNs) / float64(h.Count) / 1e9
}

// Quantile returns the q-quantile (0..1) in seconds, interpolating linearly inside the bucket
// that holds it. Log2 buckets bound the error to a factor of two.
func (h Log2) Quantile(q float64) float64 {
	var total uint64
	for _, c := range h.Buckets {
		total += c
	}
	if total == 0 {
		return 0
	}
	rank := q * float64(total)
	var seen float64
	for i, c := range h.Buckets {
		if c == 0 {
			continue
		}
		if seen+float64(c) >= rank {
			lo := math.Ldexp(1, i)
			if i == 0 {
				lo = 0
			}
			hi := math.Ldexp(1, i+1)
			frac := (rank - seen) / float64(c)
			return (lo + frac*(hi-lo)) / 1e9
		}
		seen += float64(c)
	}
	return math.Ldexp(1, len(h.Buckets)) / 1e9
}

// LongestAtLeast returns, in seconds, a lower bound of the largest value: the floor of the
// highest non-empty bucket (0 for an empty histogram). One huge wait hides in a p99; this
// shows it.
func (h Log2) LongestAtLeast() float64 {
	for i := len(h.Buckets) - 1; i > 0; i-- {
		if h.Buckets[i] > 0 {
			return math.Ldexp(1, i) / 1e9
		}
	}
	return 0
}
