//go:build linux

package swap

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/nodectl/nodectl/host"

	"github.com/nodectl/nodectl/host/swapfile"
	"github.com/nodectl/nodectl/tuner"
)

const size = 64 << 20

// scratch makes a directory on a real disk (/var/tmp: /tmp may be a tmpfs, which cannot hold
// swap) and, when the test ends even by failing, turns off every swap area below it, deletes
// it and checks the machine's swap is as it was.
func scratch(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for swapon")
	}
	before, err := swapfile.Active("/proc")
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("/var/tmp", "nodectl-tune-swap-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		areas, err := swapfile.Areas("/proc")
		if err != nil {
			t.Error(err)
		}
		for _, a := range areas {
			if strings.HasPrefix(a.Path, dir+"/") {
				f, err := swapfile.Open(a.Path, true)
				if err == nil {
					err = f.Disable()
				}
				if err != nil {
					t.Errorf("cleaning up: %v", err)
				}
			}
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Error(err)
		}
		if after, err := swapfile.Active("/proc"); err != nil || !slices.Equal(before, after) {
			t.Errorf("swaps %v after the test (%v), %v before", after, err, before)
		}
	})
	return dir
}

func hostAt(root string) host.FS {
	return host.FS{Root: root, Procfs: "/proc", Sysfs: "/sys", Cgroupfs: "/sys/fs/cgroup"}
}

func read(t *testing.T, s tuner.Setting) (tuner.Value, data) {
	t.Helper()
	v, err := s.Read(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var d data
	if v.Data != nil {
		if err := json.Unmarshal(v.Data, &d); err != nil {
			t.Fatal(err)
		}
	}
	return v, d
}

// priority is the priority of the area at path in /proc/swaps, or false when it is off.
func priority(t *testing.T, path string) (int, bool) {
	t.Helper()
	areas, err := swapfile.Areas("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range areas {
		if a.Path == path {
			return a.Priority, true
		}
	}
	return 0, false
}

func mustApply(t *testing.T, s tuner.Setting) {
	t.Helper()
	if err := s.Apply(context.Background()); err != nil {
		t.Fatal(err)
	}
	if v, _ := read(t, s); !v.Present || v.Text != s.Desired() {
		t.Fatalf("%s reads %q after apply, want %q", s.ID(), v.Text, s.Desired())
	}
}

func mustRestore(t *testing.T, s tuner.Setting, prev tuner.Value) {
	t.Helper()
	if err := s.Restore(context.Background(), prev); err != nil {
		t.Fatal(err)
	}
	if v, _ := read(t, s); v.Present != prev.Present || v.Text != prev.Text {
		t.Fatalf("%s reads %v %q after restore, want %v %q", s.ID(), v.Present, v.Text, prev.Present, prev.Text)
	}
}

// A swap file nodectl creates, below a scratch host root, is turned on at its priority and
// deleted on restore; applying twice changes nothing.
func TestFileCreatedAndRemoved(t *testing.T) {
	dir := scratch(t)
	s := New(hostAt(dir), Area{File: "/swap", Size: size, Priority: 10, Enabled: true})
	if s.ID() != "swap:/swap" || s.Backend() != "swap" || s.Desired() != "on, priority 10" {
		t.Fatalf("id %q backend %q desired %q", s.ID(), s.Backend(), s.Desired())
	}
	path := filepath.Join(dir, "swap")
	prev, d := read(t, s)
	if !prev.Present || prev.Text != "off" || d.Exists {
		t.Fatalf("before apply: %+v %+v, want off and no file", prev, d)
	}
	mustApply(t, s)
	if p, on := priority(t, path); !on || p != 10 {
		t.Fatalf("/proc/swaps: on %v priority %d, want on at 10", on, p)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != size {
		t.Errorf("swap file of %d bytes, want %d", fi.Size(), size)
	}
	mustApply(t, s) // a no-op: the same file stays on
	if again, err := os.Stat(path); err != nil || !os.SameFile(fi, again) || !again.ModTime().Equal(fi.ModTime()) {
		t.Fatalf("second apply replaced the swap file (%v)", err)
	}
	mustRestore(t, s, prev)
	if _, on := priority(t, path); on {
		t.Fatal("still on after restore")
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the swap file nodectl made is still there after restore: %v", err)
	}
}

// As in a DaemonSet, /proc/swaps names the area by its node path, not by the path below the
// host root this process reaches it by; it is found all the same. The host root here reaches
// the node's /var through a symlink.
func TestNodePathBelowHostRoot(t *testing.T) {
	dir := scratch(t)
	root := t.TempDir()
	if err := os.Symlink("/var", filepath.Join(root, "var")); err != nil {
		t.Fatal(err)
	}
	node := filepath.Join(dir, "swap") // below /var/tmp
	s := New(hostAt(root), Area{File: node, Size: size, Priority: 4, Enabled: true})
	prev, _ := read(t, s)
	mustApply(t, s)
	if p, on := priority(t, node); !on || p != 4 {
		t.Fatalf("/proc/swaps: %s on %v priority %d", node, on, p)
	}
	mustRestore(t, s, prev)
	if _, err := os.Stat(node); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("swap file left behind: %v", err)
	}
}

// An area on at one priority is moved to another (or the kernel's default, or off) and put
// back at its own on restore. The host root is / and the file a full path, as on a node.
func TestPriorityChangeAndRestore(t *testing.T) {
	dir := scratch(t)
	path := filepath.Join(dir, "swap")
	f, err := swapfile.Create(path, size)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Enable(5); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		area Area
		want string
	}{
		{"higher_priority", Area{File: path, Size: size, Priority: 20, Enabled: true}, "on, priority 20"},
		{"default_priority", Area{File: path, Size: size, Priority: -1, Enabled: true}, "on"},
		{"off", Area{File: path, Priority: -1}, "off"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := New(hostAt("/"), tc.area)
			if s.Desired() != tc.want {
				t.Fatalf("desired %q, want %q", s.Desired(), tc.want)
			}
			prev, d := read(t, s)
			if prev.Text != "on, priority 5" || !d.Exists {
				t.Fatalf("before apply: %+v, want on at 5", prev)
			}
			mustApply(t, s)
			p, on := priority(t, path)
			switch {
			case tc.area.Enabled != on:
				t.Fatalf("/proc/swaps: on %v after apply", on)
			case on && tc.area.Priority >= 0 && p != tc.area.Priority:
				t.Fatalf("/proc/swaps: priority %d, want %d", p, tc.area.Priority)
			case on && tc.area.Priority < 0 && p >= 0:
				t.Fatalf("/proc/swaps: priority %d, want a default (negative) one", p)
			}
			mustRestore(t, s, prev)
			if p, on := priority(t, path); !on || p != 5 {
				t.Fatalf("after restore: on %v priority %d, want on at 5", on, p)
			}
		})
	}
}

// A swap file that existed and was off is turned on, then off again and kept on restore.
func TestExistingOffFileKept(t *testing.T) {
	dir := scratch(t)
	if _, err := swapfile.Create(filepath.Join(dir, "swap"), size); err != nil {
		t.Fatal(err)
	}
	s := New(hostAt(dir), Area{File: "/swap", Size: size, Priority: -1, Enabled: true})
	prev, d := read(t, s)
	if prev.Text != "off" || !d.Exists {
		t.Fatalf("before apply: %+v %+v, want an existing file, off", prev, d)
	}
	mustApply(t, s)
	mustRestore(t, s, prev)
	if _, err := swapfile.Open(filepath.Join(dir, "swap"), false); err != nil {
		t.Fatalf("the user's swap file was not kept: %v", err)
	}
}

// Suspects are the fstab entries and systemd swap units below the host root.
func TestSuspects(t *testing.T) {
	root := t.TempDir()
	for path, content := range map[string]string{
		"/etc/fstab":                         "# /swap none swap sw 0 0\n/dev/vda / ext4 defaults 0 1\n/swap none swap sw,pri=5 0 0\n/other none swap sw 0 0\n",
		"/etc/systemd/system/dev-sdb.swap":   "[Swap]\nWhat=/dev/sdb\n",
		"/run/systemd/generator/swap-x.swap": "[Swap]\n",
	} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, path)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, path), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	h := hostAt(root)
	got := New(h, Area{File: "/swap", Size: size, Priority: 1, Enabled: true}).(tuner.Suspecter).Suspects(context.Background(), tuner.Value{})
	want := []string{"/etc/fstab: /swap none swap sw,pri=5 0 0", "systemd unit /etc/systemd/system/dev-sdb.swap", "systemd unit /run/systemd/generator/swap-x.swap"}
	if !slices.Equal(got, want) {
		t.Errorf("suspects %q, want %q", got, want)
	}
	got = New(h, Area{Priority: -1}).(tuner.Suspecter).Suspects(context.Background(), tuner.Value{})
	if len(got) != 4 {
		t.Errorf("suspects for any swap %q, want both fstab entries and both units", got)
	}
}

// A file that is not swap is never formatted: Apply refuses it and leaves it as it was.
func TestRefusesNonSwapFile(t *testing.T) {
	dir := scratch(t)
	path := filepath.Join(dir, "data")
	content := []byte(strings.Repeat("someone's data\n", 1000))
	if err := os.WriteFile(path, content, 0o644); err != nil {
		t.Fatal(err)
	}
	s := New(hostAt(dir), Area{File: "/data", Size: size, Priority: 3, Enabled: true})
	err := s.Apply(context.Background())
	if !errors.Is(err, swapfile.ErrNotSwap) || !strings.Contains(err.Error(), "is not a swap file") {
		t.Fatalf("apply over a data file: %v, want a refusal naming it", err)
	}
	t.Log(err)
	if got, _ := os.ReadFile(path); string(got) != string(content) {
		t.Fatal("the data file was changed")
	}
	if v, _ := read(t, s); v.Text != "off" {
		t.Fatalf("reads %q after a refused apply", v.Text)
	}
}

// The "any swap" area of a node pool's swapConfig reads whether some swap is on, and refuses
// to change anything.
func TestAnyIsCheckOnly(t *testing.T) {
	dir := scratch(t)
	if on, _ := swapfile.Active("/proc"); len(on) > 0 {
		t.Skipf("the machine has swap on (%v): this test wants none", on)
	}
	h := hostAt(dir)
	none := New(h, Area{Priority: -1})
	some := New(h, Area{Priority: -1, Enabled: true})
	if none.ID() != "swap:any" || none.Desired() != "off" || some.Desired() != "on" {
		t.Fatalf("id %q, desired %q and %q", none.ID(), none.Desired(), some.Desired())
	}
	if v, _ := read(t, none); !v.Present || v.Text != "off" {
		t.Fatalf("no swap on reads %+v, want off", v)
	}
	prev, _ := read(t, some)
	err := some.Apply(context.Background())
	if err == nil || !strings.Contains(err.Error(), "does not know which swap file or device") {
		t.Fatalf("apply of the check-only area: %v, want a refusal", err)
	}
	if err := some.Restore(context.Background(), tuner.Value{Present: true, Text: "on"}); err == nil {
		t.Fatal("restore of the check-only area to another value was accepted")
	}
	if err := some.Restore(context.Background(), prev); err != nil {
		t.Fatalf("restore to what it reads: %v, want nothing to do", err)
	}
	if err := none.Apply(context.Background()); err != nil { // already holds
		t.Fatal(err)
	}

	f, err := swapfile.Create(filepath.Join(dir, "swap"), size)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Enable(-1); err != nil {
		t.Fatal(err)
	}
	if v, _ := read(t, some); v.Text != "on" {
		t.Fatalf("with a swap file on, reads %q, want on", v.Text)
	}
	if err := f.Remove(); err != nil {
		t.Fatal(err)
	}
}

// Through the engine: a failure at any step leaves no swap file and no state file, and
// rollback after a full apply removes the file.
func TestEngine(t *testing.T) {
	dir := scratch(t)
	h := hostAt(dir)
	path := filepath.Join(dir, "swap")
	for _, step := range []tuner.Step{tuner.StepRead, tuner.StepRecord, tuner.StepApply, tuner.StepVerify, ""} {
		name := "fail_" + string(step)
		if step == "" {
			name = "no_fault_then_rollback"
		}
		t.Run(name, func(t *testing.T) {
			e := &tuner.Engine{
				Profile:  "test",
				Settings: []tuner.Setting{New(h, Area{File: "/swap", Size: size, Priority: 7, Enabled: true})},
				State:    filepath.Join(dir, "state.json"),
				Decode: func(backend string, spec json.RawMessage) (tuner.Setting, error) {
					return Decode(h, spec)
				},
				Fault: func(s tuner.Step, id string) error {
					if s == step {
						return errors.New("injected")
					}
					return nil
				},
			}
			_, err := e.Apply(context.Background())
			if step != "" {
				if err == nil {
					t.Fatal("apply succeeded despite the fault")
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				if p, on := priority(t, path); !on || p != 7 {
					t.Fatalf("after apply: on %v priority %d", on, p)
				}
				e.Fault = nil
				if _, err := e.Rollback(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			if _, on := priority(t, path); on {
				t.Fatal("swap file left on")
			}
			for _, p := range []string{path, e.State} {
				if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("%s left behind: %v", p, err)
				}
			}
		})
	}
}

// loop attaches a loop device to file and detaches it when the test ends.
func loop(t *testing.T, file string) string {
	t.Helper()
	out, err := exec.Command("losetup", "--find", "--show", file).CombinedOutput()
	if err != nil {
		t.Skipf("no loop device: losetup: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if f, err := swapfile.Open(dev, true); err == nil {
			f.Disable() // on only when the test failed half-way
		}
		if out, err := exec.Command("losetup", "--detach", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup --detach %s: %v: %s", dev, err, out)
		}
	})
	return dev
}

// A block device formatted as swap is turned on and off, found in /proc/swaps also through a
// symlink to it (as /dev/disk/by-id names are), and never written to or removed; one without
// a swap signature is refused.
func TestDevice(t *testing.T) {
	dir := scratch(t)
	if _, err := swapfile.Create(filepath.Join(dir, "formatted"), size); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "blank"), make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	dev := loop(t, filepath.Join(dir, "formatted"))
	blank := loop(t, filepath.Join(dir, "blank"))
	link := filepath.Join(dir, "by-id-swap")
	if err := os.Symlink(dev, link); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{dev, link} {
		t.Run(filepath.Base(path), func(t *testing.T) {
			s := New(hostAt("/"), Area{Device: path, Priority: 3, Enabled: true})
			prev, d := read(t, s)
			if prev.Text != "off" || !d.Exists {
				t.Fatalf("before apply: %+v %+v", prev, d)
			}
			mustApply(t, s)
			if p, on := priority(t, dev); !on || p != 3 {
				t.Fatalf("/proc/swaps: %s on %v priority %d, want on at 3", dev, on, p)
			}
			mustRestore(t, s, prev)
			if _, err := swapfile.Open(dev, false); err != nil {
				t.Fatalf("the device lost its swap signature: %v", err)
			}
		})
	}
	err := New(hostAt("/"), Area{Device: blank, Priority: -1, Enabled: true}).Apply(context.Background())
	if !errors.Is(err, swapfile.ErrNotSwap) || !strings.Contains(err.Error(), "mkswap") {
		t.Fatalf("apply on an unformatted device: %v, want a refusal saying to run mkswap", err)
	}
	t.Log(err)
}

func TestDecode(t *testing.T) {
	h := hostAt("/host")
	for _, a := range []Area{
		{File: "/var/swap", Size: size, Priority: 10, Enabled: true},
		{File: "/var/swap", Priority: -1},
		{Device: "/dev/disk/by-id/nvme-swap", Priority: 0, Enabled: true},
		{Priority: -1, Enabled: true},
	} {
		s := New(h, a)
		spec, err := json.Marshal(s.Spec())
		if err != nil {
			t.Fatal(err)
		}
		got, err := Decode(h, spec)
		if err != nil {
			t.Fatalf("decoding %s: %v", spec, err)
		}
		if got.ID() != s.ID() || got.Desired() != s.Desired() || !reflect.DeepEqual(got.Spec(), s.Spec()) {
			t.Errorf("%s decodes to %s %q %+v", spec, got.ID(), got.Desired(), got.Spec())
		}
	}
	for name, spec := range map[string]string{
		"file_and_device":   `{"file":"/swap","device":"/dev/sdb","size":67108864,"priority":-1,"enabled":true}`,
		"relative_path":     `{"file":"swap","size":67108864,"priority":-1,"enabled":true}`,
		"priority_too_high": `{"file":"/swap","size":67108864,"priority":40000,"enabled":true}`,
		"priority_below_-1": `{"device":"/dev/sdb","priority":-2,"enabled":true}`,
		"file_without_size": `{"file":"/swap","priority":-1,"enabled":true}`,
		"size_on_a_device":  `{"device":"/dev/sdb","size":67108864,"priority":-1,"enabled":true}`,
		"any_with_priority": `{"priority":3,"enabled":true}`,
		"unknown_field":     `{"file":"/swap","size":67108864,"priority":-1,"enabled":true,"prio":1}`,
	} {
		if _, err := Decode(h, json.RawMessage(spec)); err == nil {
			t.Errorf("%s: %s accepted", name, spec)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}
