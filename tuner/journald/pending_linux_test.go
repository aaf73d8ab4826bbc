//go:build linux

package journald

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodectl/nodectl/host"

	"github.com/nodectl/nodectl/host/daemons"
	"github.com/nodectl/nodectl/tuner"
)

// fakeJournald starts a copy of sleep named systemd-journald (comm systemd-journal, as the
// real one's) and returns once it runs under that name; it is killed when the test ends.
func fakeJournald(t *testing.T) {
	t.Helper()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep to stand in for journald")
	}
	b, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), Daemon)
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		ps, err := daemons.Procs("/proc", Daemon)
		if err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(ps, func(p daemons.Proc) bool { return p.PID == cmd.Process.Pid }) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the fake journald (pid %d) is not found as %s", cmd.Process.Pid, Daemon)
		}
	}
}

// Times well clear of any process here: a change an hour ahead is after every journald's
// start (pending), one a minute ago before the fake journald's.
var (
	future = func() time.Time { return time.Now().Add(time.Hour) }
	past   = func() time.Time { return time.Now().Add(-time.Minute) }
)

func touch(t *testing.T, p string, at time.Time) {
	t.Helper()
	if err := os.Chtimes(p, at, at); err != nil {
		t.Fatal(err)
	}
}

func pending(t *testing.T, s tuner.Setting) bool {
	t.Helper()
	p, err := s.(tuner.Restarter).Pending(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The drop-in is pending while the running journald started before it was written, and
// after a restore while it started before the removal.
func TestDropInPendingFollowsJournald(t *testing.T) {
	h := scratch(t)
	ctx := context.Background()
	s := NewDropIn(h, DefaultDropIn, entries)
	if got := s.(tuner.Restarter).Restart(); got != "systemd-journald" {
		t.Errorf("Restart = %q", got)
	}
	prev := read(t, s)
	if err := s.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	p := h.Path(DefaultDropIn)
	touch(t, p, future())
	if !pending(t, s) {
		t.Error("not pending although every journald started before the drop-in was written")
	}
	touch(t, p, past())
	fakeJournald(t)
	if pending(t, s) {
		t.Error("pending although a journald started after the drop-in was written")
	}
	touch(t, p, future())
	if !pending(t, s) {
		t.Error("not pending after the drop-in was written again")
	}

	// Restored (removed with the directories apply made): the root's time dates it.
	if err := s.Restore(ctx, prev); err != nil {
		t.Fatal(err)
	}
	touch(t, h.Root, future())
	if !pending(t, s) {
		t.Error("not pending although journald started before the drop-in was removed")
	}
	touch(t, h.Root, past())
	if pending(t, s) {
		t.Error("pending although journald started after the drop-in was removed")
	}
}

// The storage has no time of its own: its marker dates the mount and the unmount.
func TestStoragePendingFollowsJournald(t *testing.T) {
	h := scratch(t)
	ctx := context.Background()
	unmountAll(t, h.Path("/var/log/journal"))
	before := tree(t, h.Root)
	s := NewStorage(h, "/ssd/journal", "/var/log/journal")
	if got := s.(tuner.Restarter).Restart(); got != "systemd-journald" {
		t.Errorf("Restart = %q", got)
	}
	prev := read(t, s)
	if err := s.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	marker := h.Path(s.(*storage).marker())
	if want := h.Path("/run/nodectl/journal-storage/%2Fvar%2Flog%2Fjournal"); marker != want {
		t.Errorf("marker %s, want %s", marker, want)
	}
	touch(t, marker, future())
	if !pending(t, s) {
		t.Error("not pending although every journald started before the mount")
	}
	touch(t, marker, past())
	fakeJournald(t)
	if pending(t, s) {
		t.Error("pending although a journald started after the mount")
	}
	// Without its marker, when the bind was made is unknown: pending, and applying dates it.
	if err := os.Remove(marker); err != nil {
		t.Fatal(err)
	}
	if !pending(t, s) {
		t.Error("not pending with no marker for the bind")
	}
	dated := time.Now().Add(-time.Second) // file times lag the clock by up to a tick
	if err := s.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(marker); err != nil || fi.ModTime().Before(dated) {
		t.Errorf("applying a bind without marker did not date it now: %v", err)
	}

	if err := s.Restore(ctx, prev); err != nil {
		t.Fatal(err)
	}
	if got := tree(t, h.Root); !slices.Equal(got, before) {
		t.Errorf("after restore the root holds:\n%s", strings.Join(got, "\n"))
	}
	// Unmounted, no marker: pending only when no journald runs, and one does.
	if pending(t, s) {
		t.Error("pending with nothing mounted, no marker and a journald running")
	}
}

func TestNeedRestart(t *testing.T) {
	errRead := errors.New("reading /proc failed")
	for name, tc := range map[string]struct {
		systemd, changed bool
		pending          bool
		pendingErr       error
		want, asked      bool
		wantErr          error
	}{
		"no_systemd_changed":   {changed: true, pending: true},
		"no_systemd_pending":   {pending: true},
		"changed":              {systemd: true, changed: true, want: true},
		"unchanged_pending":    {systemd: true, pending: true, want: true, asked: true},
		"unchanged_restarted":  {systemd: true, asked: true},
		"unchanged_read_fails": {systemd: true, pendingErr: errRead, asked: true, wantErr: errRead},
	} {
		t.Run(name, func(t *testing.T) {
			asked := false
			got, err := needRestart(tc.systemd, tc.changed, func() (bool, error) {
				asked = true
				return tc.pending, tc.pendingErr
			})
			if got != tc.want || !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) || asked != tc.asked {
				t.Errorf("needRestart = %v, %v (pending asked: %v); want %v, %v (asked: %v)", got, err, asked, tc.want, tc.wantErr, tc.asked)
			}
		})
	}
}

// restarts stands in for systemctl, failing while *fail is set, and counts its calls.
func restarts(fail *bool, calls *int) restartFunc {
	return func(context.Context, host.FS) error {
		*calls++
		if *fail {
			return errors.New("injected: journald did not restart")
		}
		return nil
	}
}

// withSystemd is a scratch root where systemd counts as running (sd_booted: the directory
// run/systemd/system), so the settings decide to restart journald; the restart itself is the
// test's stand-in, never systemctl.
func withSystemd(t *testing.T) host.FS {
	t.Helper()
	h := scratch(t)
	if err := os.MkdirAll(h.Path("/run/systemd/system"), 0o755); err != nil {
		t.Fatal(err)
	}
	if !h.Systemd() {
		t.Fatal("systemd does not count as running in the scratch root")
	}
	return h
}

// A restart that fails after the drop-in was written is done by the next apply, which finds
// the file written already; one that fails after restore by the next restore, which finds the
// file restored already. Once journald has started since, neither restarts it again.
func TestDropInFinishesAFailedRestart(t *testing.T) {
	h := withSystemd(t)
	ctx := context.Background()
	before := tree(t, h.Root)
	d := NewDropIn(h, DefaultDropIn, entries).(*dropIn)
	fail, calls := true, 0
	d.restart = restarts(&fail, &calls)
	prev := read(t, d)

	if err := d.Apply(ctx); err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("Apply with a failing restart: %v", err)
	}
	if v := read(t, d); v.Text != d.Desired() || calls != 1 {
		t.Fatalf("after the failed restart: reads %q, %d restarts", v.Text, calls)
	}
	fail = false
	touch(t, h.Path(DefaultDropIn), future()) // newer than any journald running here
	if err := d.Apply(ctx); err != nil || calls != 2 {
		t.Fatalf("re-apply: %v, %d restarts, want the missed one done", err, calls)
	}
	touch(t, h.Path(DefaultDropIn), past())
	fakeJournald(t)
	if err := d.Apply(ctx); err != nil || calls != 2 {
		t.Errorf("apply with journald restarted since: %v, %d restarts, want none more", err, calls)
	}

	fail = true
	if err := d.Restore(ctx, prev); err == nil || !strings.Contains(err.Error(), "injected") || calls != 3 {
		t.Fatalf("Restore with a failing restart: %v, %d restarts", err, calls)
	}
	fail = false
	touch(t, h.Root, future()) // the removal's time, newer than any journald running here
	if err := d.Restore(ctx, prev); err != nil || calls != 4 {
		t.Fatalf("second restore: %v, %d restarts, want the missed one done", err, calls)
	}
	if got := tree(t, h.Root); !slices.Equal(got, before) {
		t.Errorf("after restore the root holds:\n%s", strings.Join(got, "\n"))
	}
	touch(t, h.Root, past())
	if err := d.Restore(ctx, prev); err != nil || calls != 4 {
		t.Errorf("restore with journald restarted since: %v, %d restarts, want none more", err, calls)
	}
}

// The same for the storage: its marker outlives a restore whose restart failed, so the next
// restore knows that journald still writes to the unmounted bind.
func TestStorageFinishesAFailedRestart(t *testing.T) {
	h := withSystemd(t)
	ctx := context.Background()
	unmountAll(t, h.Path("/var/log/journal"))
	before := tree(t, h.Root)
	s := NewStorage(h, "/ssd/journal", "/var/log/journal").(*storage)
	fail, calls := true, 0
	s.restart = restarts(&fail, &calls)
	prev := read(t, s)
	marker := h.Path(s.marker())

	if err := s.Apply(ctx); err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("Apply with a failing restart: %v", err)
	}
	if v := read(t, s); v.Text != s.Desired() || calls != 1 {
		t.Fatalf("after the failed restart: reads %q, %d restarts", v.Text, calls)
	}
	fail = false
	touch(t, marker, future())
	if err := s.Apply(ctx); err != nil || calls != 2 {
		t.Fatalf("re-apply: %v, %d restarts, want the missed one done", err, calls)
	}

	fail = true
	if err := s.Restore(ctx, prev); err == nil || !strings.Contains(err.Error(), "injected") || calls != 3 {
		t.Fatalf("Restore with a failing restart: %v, %d restarts", err, calls)
	}
	if v := read(t, s); v.Present {
		t.Errorf("still mounted after the restore: %+v", v)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("the marker went with the failed restart: %v", err)
	}
	fail = false
	touch(t, marker, future())
	if err := s.Restore(ctx, prev); err != nil || calls != 4 {
		t.Fatalf("second restore: %v, %d restarts, want the missed one done", err, calls)
	}
	if got := tree(t, h.Root); !slices.Equal(got, before) {
		t.Errorf("after restore the root holds:\n%s", strings.Join(got, "\n"))
	}
}
