package stress

import (
	"testing"
	"time"
)

// Each scenario's span is its phases at their longest, its defaults filled in.
func TestSpans(t *testing.T) {
	for name, c := range map[string]struct{ got, want time.Duration }{
		"noisy":   {NoisyConfig{Baseline: 20 * time.Second, Duration: 30 * time.Second}.Span(), 50 * time.Second},
		"wake":    {WakeConfig{Count: 5, CPULimits: []int64{50, 1000}}.Span(), 10 * DefaultWakeTimeout},
		"density": {DensityConfig{Step: 10, Max: 25, Pace: 100 * time.Millisecond, StepDuration: 30 * time.Second}.Span(), 3 * (time.Second + DefaultReadyTimeout + 30*time.Second)},
		"storm":   {StormConfig{Rounds: 3}.Span(), 3 * (DefaultStormTimeout + DefaultStormPause)},
	} {
		if c.got != c.want {
			t.Errorf("%s: span %v, want %v", name, c.got, c.want)
		}
	}
}
