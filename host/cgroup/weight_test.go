package cgroup

import "testing"

// The kubelet's numbers: pkg/kubelet/cm MilliCPUToShares, and getCPUWeight for cgroup v2.
func TestCPUSharesAndWeight(t *testing.T) {
	tests := map[string]struct {
		milli          int64
		shares, weight uint64
	}{
		"below_the_minimum": {milli: 1, shares: 2, weight: 1},
		"100m":              {milli: 100, shares: 102, weight: 4},
		"250m":              {milli: 250, shares: 256, weight: 10},
		"500m":              {milli: 500, shares: 512, weight: 20},
		"one_cpu":           {milli: 1000, shares: 1024, weight: 39},
		"four_cpus":         {milli: 4000, shares: 4096, weight: 157},
		"above_the_maximum": {milli: 1024 * 1000, shares: 262144, weight: 10000},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			shares := CPUShares(tc.milli)
			if shares != tc.shares {
				t.Errorf("CPUShares(%d) = %d, want %d", tc.milli, shares, tc.shares)
			}
			if w := CPUWeight(shares); w != tc.weight {
				t.Errorf("CPUWeight(%d) = %d, want %d", shares, w, tc.weight)
			}
		})
	}
	// Shares outside the kernel's range are clamped to it first.
	if lo, hi := CPUWeight(0), CPUWeight(1<<20); lo != 1 || hi != 10000 {
		t.Errorf("CPUWeight(0), CPUWeight(1<<20) = %d, %d; want 1, 10000", lo, hi)
	}
}
