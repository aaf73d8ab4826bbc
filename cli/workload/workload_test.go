package workload

import (
	"testing"

	wl "github.com/nodectl/nodectl/stress/workload"
)

// TestEveryCommandIsAWorkload: each subcommand but exec is a workload whose command line
// wl.Parse reads.
func TestEveryCommandIsAWorkload(t *testing.T) {
	for _, c := range New().Commands() {
		if c.Name() == "exec" {
			continue
		}
		if _, err := wl.Parse([]string{wl.Group, c.Name()}); err != nil {
			t.Errorf("subcommand %s: %v", c.Name(), err)
		}
	}
}

// TestHelpDoesNotRun: cobra leaves the flags to wl.Parse, help included. The threads are
// invalid, so a workload started by mistake fails instead of running.
func TestHelpDoesNotRun(t *testing.T) {
	cmd := New()
	cmd.SetArgs([]string{"cpu-hog", "--threads", "0", "--help"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
}
