package stress

import "time"

// The longest each scenario's phases can last, its workloads' starts aside: what a run of pods
// gives its pods as their deadline (with a margin for starts and image pulls), so that pods a
// killed CLI left behind stop by themselves.

// Span is the baseline and the stress phase.
func (c NoisyConfig) Span() time.Duration { return c.Baseline + c.Duration }

// Span is every start, each within its timeout.
func (c WakeConfig) Span() time.Duration {
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = DefaultWakeTimeout
	}
	return time.Duration(c.Count*len(c.CPULimits)) * timeout
}

// Span is every step up to Max: its launches paced, its sandboxes' readiness, its hold.
func (c DensityConfig) Span() time.Duration {
	ready := c.ReadyTimeout
	if ready <= 0 {
		ready = DefaultReadyTimeout
	}
	steps := 1
	if c.Step > 0 {
		steps = (c.Max + c.Step - 1) / c.Step
	}
	return time.Duration(steps) * (time.Duration(c.Step)*c.Pace + ready + c.StepDuration)
}

// Span is every storm within its timeout, and the pauses between them.
func (c StormConfig) Span() time.Duration {
	timeout, pause := c.Timeout, c.Pause
	if timeout <= 0 {
		timeout = DefaultStormTimeout
	}
	if pause <= 0 {
		pause = DefaultStormPause
	}
	return time.Duration(c.Rounds) * (timeout + pause)
}
