package stress

import "testing"

// Clean removes only what runs made: their ids, not other cgroups under the shared parent.
func TestRunIDPattern(t *testing.T) {
	for _, scenario := range []string{"noisy", "fsync-storm"} {
		if id := NewRunID(scenario); !runIDPattern.MatchString(id) {
			t.Errorf("run id %q does not match %s", id, runIDPattern)
		}
	}
	// system is where nodectl tune's CPU partition keeps daemons; Clean must never take it.
	for _, name := range []string{"test-1a2b3c4d", "test-record-4242", "sample-4242-0a1b2c3d", "noisy", "system"} {
		if runIDPattern.MatchString(name) {
			t.Errorf("%q taken for a run id", name)
		}
	}
}
