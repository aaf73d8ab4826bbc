package analyzer

import (
	"math"
	"strings"
	"testing"
)

func TestExceedanceChance(t *testing.T) {
	for _, c := range []struct {
		n, m, k int
		want    float64
	}{
		{1, 1, 1, 0.5},            // the one stress draw is the larger of two
		{1, 2, 2, 1.0 / 3},        // the one baseline draw is the smallest of three
		{8, 8, 4, 70.0 / 1820},    // C(8,4)/C(16,4)
		{6, 11, 6, 462.0 / 12376}, // C(11,6)/C(17,6)
		{8, 8, 0, 1},
	} {
		if got := exceedanceChance(c.n, c.m, c.k); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("exceedanceChance(%d, %d, %d) = %g, want %g", c.n, c.m, c.k, got, c.want)
		}
	}
}

func TestCompareProbe(t *testing.T) {
	for _, c := range []struct {
		name         string
		base, stress []float64
		body, tail   bool
		says         string
	}{
		// The gVisor victim: p50 1.2x, p95 7.3x, every stress iteration above the baseline.
		{"tail", []float64{0.0698, 0.0701, 0.0695, 0.0710, 0.0720, 0.0699},
			[]float64{0.0836, 0.0810, 0.0837, 0.0850, 0.0829, 0.529, 0.0860, 0.0790, 0.41, 0.0831, 0.0835},
			false, true, "the tail slowed (p95 of 11 iterations against 6 in the baseline, 11 of them over 5ms slower than every baseline one: a "},
		{"body_and_tail", []float64{0.085, 0.087, 0.086, 0.086, 0.087, 0.085, 0.084, 0.083},
			[]float64{0.165, 0.449, 0.167, 0.155, 0.160, 0.173, 0.151, 0.168},
			true, true, "8 stress iterations against 8 in the baseline"},
		{"body", []float64{0.10, 0.11, 0.10, 0.12, 0.11, 0.10, 0.11, 0.10},
			[]float64{0.13, 0.14, 0.13, 0.135, 0.14, 0.13, 0.13, 0.14},
			true, false, "p50 of 8 iterations against 8 in the baseline: a "},
		// The same distribution in both phases.
		{"quiet", []float64{0.100, 0.087, 0.089, 0.087, 0.087, 0.085, 0.084, 0.085},
			[]float64{0.092, 0.088, 0.084, 0.084, 0.085, 0.083, 0.084, 0.084}, false, false, ""},
		// Two slow iterations of eight: a larger p95, but nothing chance does not do.
		{"two_outliers", []float64{0.040, 0.034, 0.036, 0.041, 0.038, 0.044, 0.035, 0.041},
			[]float64{0.040, 0.039, 0.037, 0.100, 0.036, 0.124, 0.039, 0.035}, false, false, ""},
		// A body shifted by about a millisecond and one outlier (a CI run of a harmless
		// neighbour): 6 of 8 past the slowest baseline iteration, p95 1.6x, yet no tail.
		{"shift_and_outlier", []float64{0.0240, 0.0243, 0.0245, 0.0246, 0.0244, 0.0248, 0.0250, 0.0251},
			[]float64{0.0253, 0.0255, 0.0259, 0.0256, 0.0260, 0.0252, 0.0249, 0.0398}, false, false, ""},
		// A baseline that already had a slow iteration hides a tail of the same size.
		{"wide_baseline", []float64{0.061, 0.049, 0.151, 0.060, 0.045, 0.307},
			[]float64{0.251, 0.042, 0.044, 0.062, 0.126, 0.279, 0.043, 0.068, 0.068, 0.292, 0.060}, false, false, ""},
		// Every iteration slower, but by less than probeMinRiseSeconds.
		{"tiny", []float64{0.010, 0.010, 0.011, 0.010}, []float64{0.014, 0.014, 0.013, 0.014}, false, false, ""},
		// Two against three: even all slower is a 60% chance.
		{"too_few", []float64{0.1, 0.1}, []float64{0.5, 0.6, 0.7}, false, false, ""},
		// All equal: no rise and no error.
		{"equal", []float64{0.1, 0.1}, []float64{0.1, 0.1}, false, false, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			ch, ok := compareProbe(measureCPUWork, c.base, c.stress)
			if !ok {
				t.Fatal("no change")
			}
			if ch.bodyRose() != c.body || ch.tailRose() != c.tail {
				t.Fatalf("body %v (p %.4g) tail %v (p %.4g, %d above), want body %v tail %v",
					ch.bodyRose(), ch.bodyP, ch.tailRose(), ch.tailP, ch.above, c.body, c.tail)
			}
			if ch.slowed() != (c.body || c.tail) {
				t.Errorf("slowed = %v", ch.slowed())
			}
			if c.says != "" && !strings.Contains(ch.describe(), c.says) {
				t.Errorf("%q does not say %q", ch.describe(), c.says)
			}
		})
	}
	if _, ok := compareProbe(measureCPUWork, nil, []float64{1}); ok {
		t.Error("a phase without iterations compared")
	}
}

func TestSlowdownIsTheRiseThatCounted(t *testing.T) {
	tail, _ := compareProbe(measureCPUWork, []float64{0.0698, 0.0701, 0.0695, 0.0710, 0.0720, 0.0699},
		[]float64{0.0836, 0.0810, 0.0837, 0.0850, 0.0829, 0.529, 0.0860, 0.0790, 0.41, 0.0831, 0.0835})
	if got, want := tail.slowdown(), tail.p95S/tail.p95B; got != want {
		t.Errorf("tail slowdown %v, want the p95's %v", got, want)
	}
	if severity(tail.slowdown()) != SeverityCritical {
		t.Errorf("a 7x slower tail is %s", severity(tail.slowdown()))
	}
	if p := tail.chance(); p != tail.tailP {
		t.Errorf("chance %v, want the tail test's %v", p, tail.tailP)
	}
}

func TestMinChance(t *testing.T) {
	if p := minChance(2, 3); p <= probeAlpha {
		t.Errorf("2 against 3: %v, want above %v", p, probeAlpha)
	}
	if p := minChance(4, 4); p <= probeAlpha {
		t.Errorf("4 against 4: %v, want above %v", p, probeAlpha)
	}
	if p := minChance(5, 5); p > probeAlpha {
		t.Errorf("5 against 5: %v, want at most %v", p, probeAlpha)
	}
}
