//go:build linux

package journald

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nodectl/nodectl/host"
	"github.com/nodectl/nodectl/internal/procpath"

	"golang.org/x/sys/unix"

	"github.com/nodectl/nodectl/tuner"
)

// mountsBelow counts the mounts at or below dir in this process's mount table.
func mountsBelow(t *testing.T, dir string) int {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		mp := procpath.Unescape(strings.Fields(sc.Text())[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			n++
		}
	}
	return n
}

// unmountAll unmounts, when the test ends, whatever is still mounted at dir, so a failing
// test leaves no mount behind.
func unmountAll(t *testing.T, dir string) {
	t.Helper()
	t.Cleanup(func() {
		for range 10 {
			if mountsBelow(t, dir) == 0 {
				return
			}
			if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
				t.Errorf("cleaning up the mount at %s: %v", dir, err)
				return
			}
		}
	})
}

func TestStorage(t *testing.T) {
	for name, tc := range map[string]struct {
		source, target string
		existing       []string // directories there before
	}{
		"nothing_there":      {"/var/lib/containerd/systemd-journal", "/var/log/journal", nil},
		"directories_exist":  {"/var/lib/containerd/systemd-journal", "/var/log/journal", []string{"/var/lib/containerd/systemd-journal", "/var/log/journal"}},
		"target_exists":      {"/mnt/ssd/journal", "/var/log/journal", []string{"/var/log/journal", "/mnt"}},
		"space_in_the_paths": {"/mnt/local ssd/journal", "/var/log/the journal", nil},
	} {
		t.Run(name, func(t *testing.T) {
			h := scratch(t)
			ctx := context.Background()
			tgt, src := h.Path(tc.target), h.Path(tc.source)
			unmountAll(t, tgt)
			for _, d := range tc.existing {
				if err := os.MkdirAll(h.Path(d), 0o750); err != nil {
					t.Fatal(err)
				}
			}
			if slices.Contains(tc.existing, tc.target) {
				// An old journal, hidden while the bind is mounted and back after.
				if err := os.WriteFile(filepath.Join(tgt, "old.journal"), []byte("old"), 0o640); err != nil {
					t.Fatal(err)
				}
			}
			before := tree(t, h.Root)
			s := NewStorage(h, tc.source, tc.target)
			if s.ID() != "journal-storage:"+tc.target || s.Backend() != StorageBackend || s.Desired() != "bind "+tc.source {
				t.Errorf("ID %s, backend %s, desired %q", s.ID(), s.Backend(), s.Desired())
			}
			prev := read(t, s)
			if prev.Present {
				t.Fatalf("reads %+v before apply", prev)
			}
			if err := s.Apply(ctx); err != nil {
				t.Fatal(err)
			}
			if v := read(t, s); !v.Present || v.Text != s.Desired() {
				t.Fatalf("reads %+v after apply", v)
			}
			if n := mountsBelow(t, tgt); n != 1 {
				t.Errorf("%d mounts at %s after apply, want 1", n, tgt)
			}
			// journald writing to the target writes to the source.
			if err := os.WriteFile(filepath.Join(tgt, "system.journal"), []byte("new"), 0o640); err != nil {
				t.Fatal(err)
			}
			if b, err := os.ReadFile(filepath.Join(src, "system.journal")); err != nil || string(b) != "new" {
				t.Errorf("a file written to the target is not in the source: %q, %v", b, err)
			}
			os.Remove(filepath.Join(tgt, "system.journal"))

			if err := s.Apply(ctx); err != nil {
				t.Fatal(err)
			}
			if n := mountsBelow(t, tgt); n != 1 {
				t.Errorf("%d mounts at %s after applying twice, want 1", n, tgt)
			}

			spec, _ := json.Marshal(s.Spec())
			d, err := DecodeStorage(h, spec)
			if err != nil {
				t.Fatal(err)
			}
			if d.ID() != s.ID() || d.Desired() != s.Desired() {
				t.Errorf("DecodeStorage(%s) = %s %q", spec, d.ID(), d.Desired())
			}
			if err := d.Restore(ctx, prev); err != nil {
				t.Fatal(err)
			}
			if n := mountsBelow(t, h.Root); n != 0 {
				t.Errorf("%d mounts left below %s after restore", n, h.Root)
			}
			if got := tree(t, h.Root); !slices.Equal(got, before) {
				t.Errorf("after restore:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(before, "\n"))
			}
			if v := read(t, s); v.Present != prev.Present || v.Text != prev.Text {
				t.Errorf("reads %+v after restore, want %+v", v, prev)
			}
		})
	}
}

// TestStorageOverOtherMount stacks the bind on a tmpfs already at the target; restore leaves
// the tmpfs.
func TestStorageOverOtherMount(t *testing.T) {
	h := scratch(t)
	ctx := context.Background()
	tgt := h.Path("/var/log/journal")
	unmountAll(t, tgt)
	if err := os.MkdirAll(tgt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("nodectl-test", tgt, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	s := NewStorage(h, "/ssd/journal", "/var/log/journal")
	prev := read(t, s)
	if !prev.Present || !strings.HasPrefix(prev.Text, "other mount: tmpfs nodectl-test") {
		t.Fatalf("reads %+v over a tmpfs", prev)
	}
	if err := s.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	if v := read(t, s); v.Text != s.Desired() {
		t.Fatalf("reads %+v after apply", v)
	}
	if err := s.Restore(ctx, prev); err != nil {
		t.Fatal(err)
	}
	if v := read(t, s); v.Present != prev.Present || v.Text != prev.Text {
		t.Errorf("reads %+v after restore, want %+v", v, prev)
	}
	if n := mountsBelow(t, tgt); n != 1 {
		t.Errorf("%d mounts at %s after restore, want the tmpfs alone", n, tgt)
	}
	if _, err := os.Stat(h.Path("/ssd")); !os.IsNotExist(err) {
		t.Errorf("the source Apply made is left: %v", err)
	}
}

// TestStorageRefusesStackedMount: a mount someone put on top of ours is not unmounted.
func TestStorageRefusesStackedMount(t *testing.T) {
	h := scratch(t)
	ctx := context.Background()
	tgt := h.Path("/var/log/journal")
	unmountAll(t, tgt)
	s := NewStorage(h, "/ssd/journal", "/var/log/journal")
	prev := read(t, s)
	if err := s.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("nodectl-test", tgt, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	err := s.Restore(ctx, prev)
	if err == nil || !strings.Contains(err.Error(), "another mount is on top (tmpfs nodectl-test") || !strings.Contains(err.Error(), "not unmounting it") {
		t.Errorf("Restore under another mount: %v", err)
	}
	if n := mountsBelow(t, tgt); n != 2 {
		t.Errorf("%d mounts at %s, want both left", n, tgt)
	}
	// Once the other mount is gone, restore finishes.
	if err := unix.Unmount(tgt, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Restore(ctx, prev); err != nil {
		t.Fatal(err)
	}
	if n := mountsBelow(t, h.Root); n != 0 {
		t.Errorf("%d mounts left", n)
	}
}

func TestStorageDecodeErrors(t *testing.T) {
	for name, spec := range map[string]string{
		"relative":      `{"source":"ssd","target":"/var/log/journal"}`,
		"root":          `{"source":"/","target":"/var/log/journal"}`,
		"same":          `{"source":"/var/log/journal","target":"/var/log/journal"}`,
		"inside":        `{"source":"/var/log/journal/ssd","target":"/var/log/journal"}`,
		"missing_field": `{"source":"/ssd"}`,
		"not_json":      `[`,
	} {
		if _, err := DecodeStorage(host.FS{}, json.RawMessage(spec)); err == nil {
			t.Errorf("%s: DecodeStorage(%s) succeeded", name, spec)
		}
	}
}

// TestEngineRollsBack applies the drop-in and the storage under a scratch root with a failure
// injected at each step of each, and checks the root and the mount table are as before.
func TestEngineRollsBack(t *testing.T) {
	h := scratch(t)
	unmountAll(t, h.Path("/var/log/journal"))
	before := tree(t, h.Root)
	settings := []tuner.Setting{
		NewDropIn(h, DefaultDropIn, entries),
		NewStorage(h, "/var/lib/containerd/systemd-journal", "/var/log/journal"),
	}
	decode := func(backend string, spec json.RawMessage) (tuner.Setting, error) {
		if backend == StorageBackend {
			return DecodeStorage(h, spec)
		}
		return DecodeDropIn(h, spec)
	}
	state := filepath.Join(t.TempDir(), "state.json")
	for _, s := range settings {
		for _, step := range []tuner.Step{tuner.StepApply, tuner.StepVerify} {
			t.Run(s.Backend()+"_"+string(step), func(t *testing.T) {
				e := &tuner.Engine{Profile: "test", Settings: settings, State: state, Decode: decode,
					Fault: func(st tuner.Step, id string) error {
						if st == step && id == s.ID() {
							return errors.New("injected")
						}
						return nil
					}}
				if _, err := e.Apply(context.Background()); err == nil || !strings.Contains(err.Error(), "rolled back") {
					t.Fatalf("Apply: %v, want the injected failure, rolled back", err)
				}
				if got := tree(t, h.Root); !slices.Equal(got, before) {
					t.Errorf("after the failed apply the root holds:\n%s", strings.Join(got, "\n"))
				}
				if n := mountsBelow(t, h.Root); n != 0 {
					t.Errorf("%d mounts left below %s", n, h.Root)
				}
			})
		}
	}
	// Without a fault: apply, then rollback from the state file alone.
	e := &tuner.Engine{Profile: "test", Settings: settings, State: state, Decode: decode}
	if _, err := e.Apply(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := mountsBelow(t, h.Root); n != 1 {
		t.Errorf("%d mounts below %s after apply, want 1", n, h.Root)
	}
	if _, err := (&tuner.Engine{State: state, Decode: decode}).Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := tree(t, h.Root); !slices.Equal(got, before) {
		t.Errorf("after rollback the root holds:\n%s", strings.Join(got, "\n"))
	}
	if n := mountsBelow(t, h.Root); n != 0 {
		t.Errorf("%d mounts left below %s after rollback", n, h.Root)
	}
}

// Under a mounted root that is not shared (a tuner pod's /host without Bidirectional
// propagation), the bind would be the pod's alone: refused, and nothing is mounted. Once the
// root is shared with the node's namespace, it is made.
func TestStorageRefusesAPrivateMountedRoot(t *testing.T) {
	h := scratch(t)
	if err := unix.Mount("tmpfs", h.Root, "tmpfs", 0, ""); err != nil {
		t.Skipf("mounting a tmpfs root: %v (needs root)", err)
	}
	unmountAll(t, h.Root)
	if err := unix.Mount("", h.Root, "", unix.MS_PRIVATE, ""); err != nil {
		t.Fatal(err)
	}
	tgt := h.Path("/var/log/journal")
	s := NewStorage(h, "/var/lib/containerd/systemd-journal", "/var/log/journal")
	err := s.Apply(context.Background())
	if err == nil || !strings.Contains(err.Error(), "is not a shared mount") {
		t.Fatalf("Apply under a private root: %v, want it refused", err)
	}
	if n := mountsBelow(t, tgt); n != 0 {
		t.Errorf("%d mounts at %s after the refusal", n, tgt)
	}
	if err := unix.Mount("", h.Root, "", unix.MS_SHARED, ""); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(context.Background()); err != nil {
		t.Fatalf("Apply under a shared root: %v", err)
	}
	if n := mountsBelow(t, tgt); n != 1 {
		t.Errorf("%d mounts at %s after apply, want 1", n, tgt)
	}
	if err := s.Restore(context.Background(), tuner.Value{}); err != nil {
		t.Error(err)
	}
}
