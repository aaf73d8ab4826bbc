//go:build linux

package main

import "testing"

// A per-event row regressed only in a round past both its guards: against bpftrace and
// against the empty program on the same hook. 2026-12-07's CI run read 185 ns against
// bpftrace's 418 and an empty program's 52: past the first guard, within the second.
func TestRegressedNeedsBothGuards(t *testing.T) {
	perRun := func(own, ref, floor float64) map[string]map[string][]float64 {
		return map[string]map[string][]float64{
			nodectl:  {"sched_switch": {own, own, own}},
			bpftrace: {"sched_switch": {ref, ref, ref}},
			empty:    {"sched_switch": {floor, floor, floor}},
		}
	}
	for _, c := range []struct {
		name            string
		own, ref, floor float64
		want            bool
	}{
		{"bpftrace cheap, the handler as before", 185, 418, 52, false},
		{"within both", 180, 600, 60, false},
		{"bpftrace dear, the handler 100 ns dearer", 280, 800, 60, false},
		{"twice as dear, bpftrace dear too", 370, 800, 60, true},
		{"twice as dear against both", 370, 418, 52, true},
	} {
		if got := hookRow(goalSwitch, "sched_switch", perRun(c.own, c.ref, c.floor)).regressed(); got != c.want {
			t.Errorf("%s: regressed %v, want %v", c.name, got, c.want)
		}
	}
	// A round without an empty program's is judged against bpftrace alone, and the rounds
	// after it still against their own empty program's.
	if !hookRow(goalSwitch, "sched_switch", map[string]map[string][]float64{
		nodectl:  {"sched_switch": {370, 370}},
		bpftrace: {"sched_switch": {418, 418}},
		empty:    {"sched_switch": {0, 52}},
	}).regressed() {
		t.Error("past the guard against bpftrace in both rounds, and x7 the empty program in the one that has it: not regressed")
	}
	if hookRow(goalSwitch, "sched_switch", map[string]map[string][]float64{
		nodectl:  {"sched_switch": {370, 185}},
		bpftrace: {"sched_switch": {418, 418}},
		empty:    {"sched_switch": {0, 52}},
	}).regressed() {
		t.Error("the second round within the floor guard (x3.6): regressed")
	}
	// Without a floor guard, the guard against bpftrace alone decides.
	if !hookRow(goalWakeup, "sched_wakeup", map[string]map[string][]float64{
		nodectl:  {"sched_wakeup": {200}},
		bpftrace: {"sched_wakeup": {300}},
		empty:    {"sched_wakeup": {80}},
	}).regressed() {
		t.Error("sched_wakeup at 0.67 of bpftrace's, guard 0.45: not regressed")
	}
}
