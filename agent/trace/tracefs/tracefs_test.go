//go:build linux

package tracefs_test

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nodectl/nodectl/agent/trace/internal/cgtest"
	"github.com/nodectl/nodectl/agent/trace/tracefs"
)

// dir returns an empty directory to mount on, unmounted again (lazily, whatever is there)
// before it is removed, even when the test fails.
func dir(t *testing.T) string {
	t.Helper()
	cgtest.RequireRoot(t)
	d := t.TempDir()
	t.Cleanup(func() {
		for mountedAt(t, d) {
			if err := unix.Unmount(d, unix.MNT_DETACH); err != nil {
				t.Errorf("unmounting %s: %v", d, err)
				return
			}
		}
	})
	return d
}

func mountedAt(t *testing.T, dir string) bool {
	t.Helper()
	return slices.Contains(slices.Collect(maps.Values(cgtest.TracefsMounts(t))), dir)
}

func TestEnsureMountsAndReleaseUnmounts(t *testing.T) {
	d := dir(t)
	if tracefs.Available(d) {
		t.Fatalf("empty directory %s taken for tracefs", d)
	}
	m, err := tracefs.Ensure(d)
	if err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	if !m.Mounted() || !mountedAt(t, d) || !tracefs.Available(d) {
		t.Fatalf("after Ensure: Mounted %v, in mountinfo %v, Available %v; want all true",
			m.Mounted(), mountedAt(t, d), tracefs.Available(d))
	}
	if err := m.Release(); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if mountedAt(t, d) {
		t.Error("tracefs still mounted after Release")
	}
	if err := m.Release(); err != nil {
		t.Errorf("second Release: %v", err)
	}
}

// A tracefs that was there before is used and left alone.
func TestEnsureKeepsExistingMount(t *testing.T) {
	d := dir(t)
	if err := unix.Mount("tracefs", d, "tracefs", 0, ""); err != nil {
		t.Fatalf("mounting tracefs: %v", err)
	}
	m, err := tracefs.Ensure(d)
	if err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	if m.Mounted() {
		t.Error("Ensure mounted over an existing tracefs")
	}
	if err := m.Release(); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if !mountedAt(t, d) {
		t.Error("Release unmounted a tracefs it did not mount")
	}
}

// A file held open in tracefs makes the unmount lazy rather than fail.
func TestReleaseBusy(t *testing.T) {
	d := dir(t)
	m, err := tracefs.Ensure(d)
	if err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	f, err := os.Open(filepath.Join(d, "events", "sched", "sched_switch", "id"))
	if err != nil {
		t.Fatalf("opening a tracefs file: %v", err)
	}
	defer f.Close()
	if err := m.Release(); err != nil {
		t.Fatalf("Release while busy: %v", err)
	}
	if mountedAt(t, d) || m.Mounted() {
		t.Errorf("after Release while busy: in mountinfo %v, Mounted %v; want both false", mountedAt(t, d), m.Mounted())
	}
}

// Mounting where no directory is fails and says where.
func TestEnsureFails(t *testing.T) {
	d := filepath.Join(dir(t), "missing")
	_, err := tracefs.Ensure(d)
	if err == nil || !strings.Contains(err.Error(), d) {
		t.Fatalf("Ensure(%s) = %v, want an error naming the directory", d, err)
	}
}
