package workload

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	wl "github.com/nodectl/nodectl/stress/workload"
)

// TestEveryCommandIsAWorkload: each subcommand but exec and install is a workload whose
// command line wl.Parse reads.
func TestEveryCommandIsAWorkload(t *testing.T) {
	for _, c := range New().Commands() {
		if c.Name() == "exec" || c.Name() == wl.Install {
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

// install copies this executable, whole and executable, where a pod of another image runs it.
func TestInstallCopiesItself(t *testing.T) {
	dir := t.TempDir()
	cmd := New()
	cmd.SetArgs(wl.InstallArgs(dir)[1:])
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "nodectl"))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the copy differs from %s (%v)", self, err)
	}
	if st, err := os.Stat(filepath.Join(dir, "nodectl")); err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("mode %v (%v), want 0755", st.Mode(), err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("left %d files in %s, want only nodectl", len(entries), dir)
	}
}
