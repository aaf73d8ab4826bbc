package stress

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nodectl/nodectl/host/swapfile"
	"github.com/nodectl/nodectl/tuner"
)

const hostTestRun = "density-20260101-120000-a1b2c3"

// hostTestRun's density run on p, changing what cfg asks for.
func hostRun(t *testing.T, p Paths, cfg DensityConfig) *localSweeper {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(p.State, hostTestRun), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg.Paths = p
	if err := cfg.RunOptions.defaults(); err != nil {
		t.Fatal(err)
	}
	return &localSweeper{runHost: runHost{id: hostTestRun}, cfg: cfg}
}

// Sysctls are recorded in the run's state before they change, and put back from it: by the run,
// or by stress clean after a kill.
func TestHostSettingsAreRecordedAndRolledBack(t *testing.T) {
	var p Paths
	p.Procfs, p.State = t.TempDir(), t.TempDir()
	if err := os.MkdirAll(filepath.Join(p.Procfs, "sys/vm"), 0o755); err != nil {
		t.Fatal(err)
	}
	read := func(name string) string {
		b, _ := os.ReadFile(filepath.Join(p.Procfs, "sys/vm", name))
		return strings.TrimSpace(string(b))
	}
	for name, v := range map[string]string{"swappiness": "60", "watermark_scale_factor": "10"} {
		if err := os.WriteFile(filepath.Join(p.Procfs, "sys/vm", name), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r := hostRun(t, p, DensityConfig{Swappiness: 100, WatermarkScaleFactor: -1})
	if err := r.changeHost(t.Context()); err != nil {
		t.Fatal(err)
	}
	if read("swappiness") != "100" || read("watermark_scale_factor") != "10" {
		t.Fatalf("after the change: swappiness %s, watermark_scale_factor %s; want 100 and 10 (left)", read("swappiness"), read("watermark_scale_factor"))
	}
	state := filepath.Join(p.State, hostTestRun, hostStateFile)
	if st, err := tuner.LoadState(state); err != nil || st == nil || !st.Complete() {
		t.Fatalf("no completed host state recorded: %+v, %v", st, err)
	}
	// As after a kill: only the state is left.
	what, err := rollbackHost(p, hostTestRun, nil)
	if err != nil || what != "sysctl:vm.swappiness (was 60)" {
		t.Fatalf("rollback: %q, %v", what, err)
	}
	if read("swappiness") != "60" {
		t.Errorf("vm.swappiness %q after the rollback, want 60", read("swappiness"))
	}
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Errorf("the host state is left after the rollback: %v", err)
	}
	if what, err := rollbackHost(p, hostTestRun, nil); what != "" || err != nil {
		t.Errorf("a second rollback: %q, %v; want nothing to do", what, err)
	}
}

// A run's swap file is created and turned on, refused when it exists, and turned off and deleted
// by the rollback.
func TestSwapFileIsCreatedAndRemoved(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: swapon")
	}
	dir, err := os.MkdirTemp("/var/tmp", "nodectl-swaprun-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	file := filepath.Join(dir, "swap")
	t.Cleanup(func() {
		if f, err := swapfile.Open(file, true); err == nil {
			_ = f.Remove()
		}
	})
	before, _ := swapfile.Active("/proc")
	p := DefaultPaths()
	p.State = t.TempDir()
	r := hostRun(t, p, DensityConfig{SwapFile: file, SwapBytes: 32<<20 + 100, Swappiness: -1, WatermarkScaleFactor: -1})
	if err := r.changeHost(t.Context()); err != nil {
		t.Fatal(err)
	}
	if r.swapSize != 32<<20 {
		t.Errorf("swap size %d, want %d: the header's, whole pages", r.swapSize, 32<<20)
	}
	if on, _ := swapfile.Active("/proc"); !slices.Contains(on, file) {
		t.Fatalf("%s is not on after the change: %v", file, on)
	}
	if err := hostRun(t, p, r.cfg).changeHost(t.Context()); err == nil || !strings.Contains(err.Error(), "the file exists") {
		t.Errorf("a second run on the same file: %v, want a refusal", err)
	}
	if what, err := rollbackHost(p, hostTestRun, nil); err != nil || !strings.Contains(what, "swap:"+file) {
		t.Fatalf("rollback: %q, %v", what, err)
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("the swap file is left: %v", err)
	}
	if after, _ := swapfile.Active("/proc"); !slices.Equal(before, after) {
		t.Errorf("swap areas %v after, %v before", after, before)
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
			if f, err := swapfile.Open(dev, true); err == nil {
				_ = f.Disable()
			}
			if err := exec.Command("losetup", "--detach", dev).Run(); err != nil {
				t.Errorf("detaching %s: %v", dev, err)
			}
		})
		return dev
	}
	p := DefaultPaths()
	p.State = t.TempDir()
	cfg := DensityConfig{Swappiness: -1, WatermarkScaleFactor: -1}

	cfg.SwapFile = loop("blank.img", false)
	if err := hostRun(t, p, cfg).changeHost(t.Context()); err == nil || !strings.Contains(err.Error(), "mkswap") {
		t.Errorf("a device without a swap signature: %v, want a refusal naming mkswap", err)
	}

	dev := loop("swap.img", true)
	cfg.SwapFile = dev
	before, _ := swapfile.Active("/proc")
	r := hostRun(t, p, cfg)
	if err := r.changeHost(t.Context()); err != nil {
		t.Fatal(err)
	}
	if on, _ := swapfile.Active("/proc"); !slices.Contains(on, dev) {
		t.Fatalf("%s is not on after the change: %v", dev, on)
	}
	if r.swapSize != 32<<20 {
		t.Errorf("swap size %d, want %d: the header's", r.swapSize, 32<<20)
	}
	if err := hostRun(t, p, cfg).changeHost(t.Context()); err == nil || !strings.Contains(err.Error(), "already in use as swap") {
		t.Errorf("a device that is on: %v, want a refusal", err)
	}
	// As after a kill: only the state is left, and stress clean turns the device off.
	what, err := rollbackHost(p, hostTestRun, nil)
	if err != nil || !strings.Contains(what, dev) {
		t.Fatalf("rollback: %q, %v", what, err)
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
