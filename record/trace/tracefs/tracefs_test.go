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

	"github.com/nodectl/nodectl/record/trace/internal/cgtest"
	"github.com/nodectl/nodectl/record/trace/tracefs"
)

// dir returns an empty directory to mount on, unmounted again (lazily, whatever is there)
// before it is removed, even when the test fails.
func dir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	t.Cleanup(func() {
		for _, p := range slices.Backward(cgtest.MountsUnder(d)) {
			if err := unix.Unmount(p, unix.MNT_DETACH); err != nil {
				t.Errorf("unmounting %s: %v", p, err)
			}
		}
	})
	return d
}

func mountedAt(t *testing.T, dir string) bool {
	t.Helper()
	return slices.Contains(slices.Collect(maps.Values(cgtest.TracefsMounts(t))), dir)
}

func mount(t *testing.T, fstype, dir string) {
	t.Helper()
	if err := unix.Mount(fstype, dir, fstype, 0, ""); err != nil {
		t.Fatalf("mounting %s at %s: %v", fstype, dir, err)
	}
}

// What Find finds on this host is a tracefs, and it finds one whenever one is mounted.
func TestFindOnHost(t *testing.T) {
	cgtest.RequireRoot(t)
	d, ok := tracefs.Find()
	t.Logf("found %q (%v); tracefs mounts %v", d, ok, cgtest.TracefsMounts(t))
	if !ok {
		if m := cgtest.TracefsMounts(t); len(m) > 0 {
			t.Fatalf("tracefs is mounted (%v), Find found none", m)
		}
		return
	}
	if fi, err := os.Stat(filepath.Join(d, "events")); err != nil || !fi.IsDir() {
		t.Errorf("found %s, which has no events directory: %v", d, err)
	}
}

func TestEnsureMountsAndReleaseUnmounts(t *testing.T) {
	if !cgtest.WithoutTracefs(t) {
		return
	}
	d := dir(t)
	m, err := tracefs.Ensure(d)
	if err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	found, ok := tracefs.Find()
	if !m.Mounted() || !mountedAt(t, d) || found != d || !ok {
		t.Fatalf("after Ensure: Mounted %v, in mountinfo %v, Find %q %v; want true, true, %q true",
			m.Mounted(), mountedAt(t, d), found, ok, d)
	}
	if err := m.Release(); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if mountedAt(t, d) {
		t.Error("tracefs still mounted after Release")
	}
	if found, ok := tracefs.Find(); ok {
		t.Errorf("Find %q after Release, want none", found)
	}
	if err := m.Release(); err != nil {
		t.Errorf("second Release: %v", err)
	}
}

// A tracefs the host mounted anywhere is what cilium/ebpf uses: Ensure mounts no second one,
// and leaves that one alone.
func TestEnsureUsesMountElsewhere(t *testing.T) {
	if !cgtest.WithoutTracefs(t) {
		return
	}
	elsewhere, want := dir(t), dir(t)
	mount(t, "tracefs", elsewhere)
	m, err := tracefs.Ensure(want)
	if err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	if m.Mounted() || mountedAt(t, want) {
		t.Errorf("Ensure mounted at %s (Mounted %v), though tracefs is at %s", want, m.Mounted(), elsewhere)
	}
	if found, _ := tracefs.Find(); found != elsewhere {
		t.Errorf("Find %q, want %q", found, elsewhere)
	}
	if err := m.Release(); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if !mountedAt(t, elsewhere) {
		t.Error("Release unmounted a tracefs it did not mount")
	}
}

// debugfs carries tracefs in its tracing directory, where older hosts have it.
func TestFindInDebugfs(t *testing.T) {
	if !cgtest.WithoutTracefs(t) {
		return
	}
	d := dir(t)
	mount(t, "debugfs", d)
	found, ok := tracefs.Find()
	if want := filepath.Join(d, "tracing"); found != want || !ok {
		t.Fatalf("Find %q %v, want %q", found, ok, want)
	}
	if _, err := os.Stat(filepath.Join(found, "events", "sched")); err != nil {
		t.Errorf("no events under %s: %v", found, err)
	}
}

// A bind mount of a part of tracefs is not tracefs's root: it does not count.
func TestFindSkipsPartialBind(t *testing.T) {
	if !cgtest.WithoutTracefs(t) {
		return
	}
	whole, part := dir(t), dir(t)
	mount(t, "tracefs", whole)
	if err := unix.Mount(filepath.Join(whole, "events"), part, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind-mounting events: %v", err)
	}
	if err := unix.Unmount(whole, 0); err != nil {
		t.Fatalf("unmounting %s: %v", whole, err)
	}
	if found, ok := tracefs.Find(); ok {
		t.Errorf("Find %q from a bind mount of tracefs's events directory, want none", found)
	}
}

// A file held open in tracefs makes the unmount lazy rather than fail.
func TestReleaseBusy(t *testing.T) {
	if !cgtest.WithoutTracefs(t) {
		return
	}
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
	if !cgtest.WithoutTracefs(t) {
		return
	}
	d := filepath.Join(dir(t), "missing")
	_, err := tracefs.Ensure(d)
	if err == nil || !strings.Contains(err.Error(), d) {
		t.Fatalf("Ensure(%s) = %v, want an error naming the directory", d, err)
	}
}
