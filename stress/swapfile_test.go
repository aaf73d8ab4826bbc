package stress

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nodectl/nodectl/stress/swapfile"
)

// Sysctls are noted before they change, and put back from the note: by the run, or by stress
// clean after a kill.
func TestHostChangesAreNotedAndUndone(t *testing.T) {
	p := Paths{Procfs: t.TempDir(), State: t.TempDir()}
	const id = "density-20260101-120000-a1b2c3"
	if err := os.MkdirAll(filepath.Join(p.Procfs, "sys/vm"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(p.State, id), 0o755); err != nil {
		t.Fatal(err)
	}
	sysctl := filepath.Join(p.Procfs, "sys/vm/swappiness")
	if err := os.WriteFile(sysctl, []byte("60\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h := &hostUndo{paths: p, id: id}
	if err := h.setSysctl("vm/swappiness", "100"); err != nil {
		t.Fatal(err)
	}
	if err := h.setSysctl("vm/swappiness", "90"); err != nil { // the first old value is kept
		t.Fatal(err)
	}
	// As after a kill: only the note is left.
	what, errs := undoNotedHostChanges(p, id)
	if len(errs) > 0 || what != "vm.swappiness=60" {
		t.Fatalf("undo: %q, %v", what, errs)
	}
	if b, _ := os.ReadFile(sysctl); string(b) != "60" {
		t.Errorf("vm.swappiness %q after undo, want 60", b)
	}
}

// A swap device the user formatted is only turned on for the run and off afterwards, also by
// stress clean after a kill; one without a swap signature is refused, not formatted.
func TestSwapDeviceIsTurnedOnAndOffNeverFormatted(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: loop devices and swapon")
	}
	dir, err := os.MkdirTemp("/var/tmp", "nodectl-swapdev-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	loop := func(name string, swap bool) string {
		img := filepath.Join(dir, name)
		if swap {
			if _, err := swapfile.Create(img, 32<<20); err != nil {
				t.Fatal(err)
			}
		} else if err := os.WriteFile(img, make([]byte, 32<<20), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("losetup", "--find", "--show", img).Output()
		if err != nil {
			t.Fatalf("losetup: %v", err)
		}
		dev := strings.TrimSpace(string(out))
		t.Cleanup(func() {
			_ = swapOff("/proc", dev)
			if err := exec.Command("losetup", "--detach", dev).Run(); err != nil {
				t.Errorf("detaching %s: %v", dev, err)
			}
		})
		return dev
	}
	p := Paths{Procfs: "/proc", State: t.TempDir()}
	const id = "density-20260101-120000-a1b2c3"
	if err := os.MkdirAll(filepath.Join(p.State, id), 0o755); err != nil {
		t.Fatal(err)
	}

	blank := loop("blank.img", false)
	h := &hostUndo{paths: p, id: id}
	if err := h.enableSwap(blank, 0); err == nil || !strings.Contains(err.Error(), "mkswap") {
		t.Errorf("a device without a swap signature: %v, want a refusal naming mkswap", err)
	}

	dev := loop("swap.img", true)
	before, _ := swapfile.Active("/proc")
	if err := h.enableSwap(dev, 0); err != nil {
		t.Fatal(err)
	}
	if used, _ := swapUsed("/proc", dev); used < 0 {
		t.Fatalf("%s is not on after enableSwap", dev)
	}
	// As after a kill: only the note is left, and stress clean turns the device off.
	what, errs := undoNotedHostChanges(p, id)
	if len(errs) > 0 || !strings.Contains(what, dev) {
		t.Fatalf("undo: %q, %v", what, errs)
	}
	if used, _ := swapUsed("/proc", dev); used >= 0 {
		t.Errorf("%s still on after the undo", dev)
	}
	if _, err := os.Stat(dev); err != nil {
		t.Errorf("the device node is gone: %v", err)
	}
	if after, _ := swapfile.Active("/proc"); !slices.Equal(before, after) {
		t.Errorf("swap areas %v after, %v before", after, before)
	}
	// The device still carries its signature: it was never written.
	if _, err := swapfile.OpenDevice(dev); err != nil {
		t.Errorf("the device lost its swap signature: %v", err)
	}
}
