package sysctl

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodectl/nodectl/host"

	"github.com/nodectl/nodectl/tuner"
)

var realHost = host.FS{Root: "/", Procfs: "/proc", Sysfs: "/sys", Cgroupfs: "/sys/fs/cgroup"}

func TestKeys(t *testing.T) {
	for name, tc := range map[string]struct{ key, slashed, dotted string }{
		"dotted":          {"vm.swappiness", "vm/swappiness", "vm.swappiness"},
		"slashed":         {"net/ipv4/neigh/default/gc_thresh1", "net/ipv4/neigh/default/gc_thresh1", "net.ipv4.neigh.default.gc_thresh1"},
		"dot_in_name":     {"net.ipv4.conf.eth0/1.rp_filter", "net/ipv4/conf/eth0.1/rp_filter", "net.ipv4.conf.eth0/1.rp_filter"},
		"slashed_dot":     {"net/ipv4/conf/eth0.1/rp_filter", "net/ipv4/conf/eth0.1/rp_filter", "net.ipv4.conf.eth0/1.rp_filter"},
		"leading_slash":   {"/vm/swappiness", "vm/swappiness", "vm.swappiness"},
		"single_name_key": {"kernel", "kernel", "kernel"},
	} {
		t.Run(name, func(t *testing.T) {
			if got := Path(tc.key); got != tc.slashed {
				t.Errorf("Path(%q) = %q, want %q", tc.key, got, tc.slashed)
			}
			if got := dotted(tc.key); got != tc.dotted {
				t.Errorf("dotted(%q) = %q, want %q", tc.key, got, tc.dotted)
			}
		})
	}
	for _, bad := range []string{"", "vm..swappiness", "../../etc/passwd", "vm/../../etc"} {
		if err := checkKey(bad); err == nil {
			t.Errorf("checkKey(%q) = nil, want an error", bad)
		}
		if Exists(realHost, bad) {
			t.Errorf("Exists(%q) = true", bad)
		}
	}
	if !Exists(realHost, "vm.swappiness") || !Exists(realHost, "net/ipv4/tcp_rmem") {
		t.Error("Exists is false for vm.swappiness or net/ipv4/tcp_rmem")
	}
	if Exists(realHost, "vm.no_such_sysctl") || Exists(realHost, "net.ipv4") {
		t.Error("Exists is true for a missing key or a directory")
	}
	if got := Canonical(" 4096\t131072 \t 33554432\n"); got != "4096 131072 33554432" {
		t.Errorf("Canonical = %q", got)
	}
}

// keep restores the sysctls' raw values when the test ends, whatever the code under test did.
func keep(t *testing.T, keys ...string) map[string]string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to write sysctls")
	}
	orig := map[string]string{}
	for _, k := range keys {
		b, err := os.ReadFile(file(realHost, k))
		if err != nil {
			t.Fatal(err)
		}
		orig[k] = string(b)
	}
	t.Cleanup(func() {
		for _, k := range keys {
			if err := os.WriteFile(file(realHost, k), []byte(orig[k]), 0); err != nil {
				t.Errorf("restoring %s to %q: %v", k, orig[k], err)
			}
		}
	})
	return orig
}

func raw(t *testing.T, key string) string {
	t.Helper()
	b, err := os.ReadFile(file(realHost, key))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// cycle is the backend contract on a real sysctl: read, apply, holds, apply again changes
// nothing, restore gives back the exact earlier value, and Decode(Spec()) is the same setting.
func cycle(t *testing.T, key, value string) {
	t.Helper()
	ctx := context.Background()
	s := New(realHost, key, value)
	before, err := s.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rawBefore := raw(t, key)
	if !before.Present || before.Text != Canonical(rawBefore) {
		t.Fatalf("%s reads %+v, file has %q", s.ID(), before, rawBefore)
	}
	if err := s.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	after, err := s.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !after.Present || after.Text != s.Desired() {
		t.Fatalf("%s reads %q after apply, want %q", s.ID(), after.Text, s.Desired())
	}
	if err := s.Apply(ctx); err != nil {
		t.Fatalf("applying twice: %v", err)
	}
	spec, err := json.Marshal(s.Spec())
	if err != nil {
		t.Fatal(err)
	}
	d, err := Decode(realHost, spec)
	if err != nil {
		t.Fatal(err)
	}
	if d.ID() != s.ID() || d.Desired() != s.Desired() || d.Backend() != Backend {
		t.Errorf("Decode(%s) = %s %q, want %s %q", spec, d.ID(), d.Desired(), s.ID(), s.Desired())
	}
	// Restore through the decoded setting, as rollback does from the state file.
	if err := d.Restore(ctx, before); err != nil {
		t.Fatal(err)
	}
	if got := raw(t, key); got != rawBefore {
		t.Errorf("%s file has %q after restore, want %q", s.ID(), got, rawBefore)
	}
	if v, err := s.Read(ctx); err != nil || v.Present != before.Present || v.Text != before.Text {
		t.Errorf("%s reads %+v, %v after restore, want %+v", s.ID(), v, err, before)
	}
}

func TestNeighbourThresholds(t *testing.T) {
	want := map[string]string{"gc_thresh1": "2048", "gc_thresh2": "4096", "gc_thresh3": "8192"}
	for _, family := range []string{"ipv4", "ipv6"} {
		for _, n := range []string{"gc_thresh1", "gc_thresh2", "gc_thresh3"} {
			key := "net." + family + ".neigh.default." + n
			t.Run(key, func(t *testing.T) {
				orig := keep(t, key)
				v := want[n]
				if Canonical(orig[key]) == v {
					v = "1" + v // still a change to make
				}
				cycle(t, key, v)
			})
		}
	}
}

func TestMultiValue(t *testing.T) {
	const key = "net.ipv4.tcp_rmem"
	orig := keep(t, key)
	if !strings.Contains(orig[key], "\t") {
		t.Fatalf("%s reads %q; the test expects the kernel's tabs", key, orig[key])
	}
	f := strings.Fields(orig[key])
	// Written with odd spacing; compared in canonical form.
	v := f[0] + "   " + f[1] + "\t" + "8388608"
	if f[2] == "8388608" {
		v = f[0] + "   " + f[1] + "\t" + "8388609"
	}
	s := New(realHost, key, v)
	if strings.ContainsAny(s.Desired(), "\t") || strings.Contains(s.Desired(), "  ") {
		t.Errorf("Desired %q is not canonical", s.Desired())
	}
	cycle(t, key, v)
}

func TestErrors(t *testing.T) {
	const key = "net.ipv4.neigh.default.gc_thresh1"
	keep(t, key)
	ctx := context.Background()
	s := New(realHost, key, "many")
	err := s.Apply(ctx)
	if err == nil || !strings.Contains(err.Error(), "sysctl:"+key) || !strings.Contains(err.Error(), file(realHost, key)) ||
		!strings.Contains(err.Error(), `"many"`) {
		t.Errorf("Apply of a bad value: %v, want an error naming the setting, the path and the value", err)
	}
	if err := s.Restore(ctx, tuner.Value{}); err == nil {
		t.Error("Restore of an absent value succeeded")
	}
	if _, err := New(realHost, "vm.no_such_sysctl", "1").Read(ctx); err == nil || !strings.Contains(err.Error(), "no such sysctl") {
		t.Errorf("Read of a missing sysctl: %v", err)
	}
	for _, spec := range []string{`{"key":"","value":"1"}`, `{"key":"vm.swappiness","value":" "}`, `{"key":"../x","value":"1"}`, `[`} {
		if _, err := Decode(realHost, json.RawMessage(spec)); err == nil {
			t.Errorf("Decode(%s) succeeded", spec)
		}
	}
}

// TestEngineRollsBack applies three real sysctls with the second failing at each step, and
// checks the machine is left as it was.
func TestEngineRollsBack(t *testing.T) {
	keys := []string{"net.ipv6.neigh.default.gc_thresh1", "net.ipv6.neigh.default.gc_thresh2", "net.ipv6.neigh.default.gc_thresh3"}
	keep(t, keys...)
	before := map[string]string{}
	for _, k := range keys {
		before[k] = raw(t, k)
	}
	for _, step := range []tuner.Step{tuner.StepApply, tuner.StepVerify} {
		t.Run(string(step), func(t *testing.T) {
			e := &tuner.Engine{Profile: "test", State: filepath.Join(t.TempDir(), "state.json"),
				Decode: func(_ string, spec json.RawMessage) (tuner.Setting, error) { return Decode(realHost, spec) },
				Fault: func(s tuner.Step, id string) error {
					if s == step && id == "sysctl:"+keys[1] {
						return errors.New("injected")
					}
					return nil
				}}
			for i, k := range keys {
				e.Settings = append(e.Settings, New(realHost, k, []string{"3001", "3002", "3003"}[i]))
			}
			if _, err := e.Apply(context.Background()); err == nil || !strings.Contains(err.Error(), "injected") {
				t.Fatalf("Apply: %v, want the injected failure", err)
			}
			for _, k := range keys {
				if got := raw(t, k); got != before[k] {
					t.Errorf("%s is %q after the failed apply, want %q", k, got, before[k])
				}
			}
			if _, err := os.Stat(e.State); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("state file left after a failed first apply: %v", err)
			}
		})
	}
}

func TestSuspects(t *testing.T) {
	root := t.TempDir()
	files := map[string]string{
		"/etc/sysctl.d/99-gke.conf":         "# GKE\nvm.swappiness = 60\nnet.ipv4.neigh.default.gc_thresh1=1024\n",
		"/usr/lib/sysctl.d/50-default.conf": "-net/ipv4/neigh/default/gc_thresh1 = 128\nkernel.pid_max = 4194304\n",
		// Masked by /etc/sysctl.d/99-gke.conf: never applied, never a suspect.
		"/usr/lib/sysctl.d/99-gke.conf": "vm.swappiness = 10\n",
		"/run/sysctl.d/60-glob.conf":    "net.ipv4.neigh.*.gc_thresh1 = 512\n; comment\n!net.ipv4.neigh.lo.gc_thresh1\n",
		"/etc/sysctl.d/README":          "vm.swappiness = 1\n",
		"/etc/sysctl.conf":              "vm.swappiness=100\n",
	}
	for p, c := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Debian's link to /etc/sysctl.conf is the same file, named once.
	if err := os.Symlink("../sysctl.conf", filepath.Join(root, "etc/sysctl.d/99-sysctl.conf")); err != nil {
		t.Fatal(err)
	}
	h := host.FS{Root: root, Procfs: "/proc", Sysfs: "/sys", Cgroupfs: "/sys/fs/cgroup"}

	// A running tuner: sleep started through a link, so its comm is node-tuner.
	tunerBin := filepath.Join(t.TempDir(), "node-tuner")
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(sleep, tunerBin); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(tunerBin, "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	waitComm(t, cmd.Process.Pid, "node-tuner")

	got := New(h, "vm.swappiness", "100").(tuner.Suspecter).Suspects(context.Background(), tuner.Value{Present: true, Text: "60"})
	want := []string{
		"/etc/sysctl.d/99-gke.conf sets vm.swappiness = 60 (the value now), applied at boot by sysctl --system",
		"/etc/sysctl.d/99-sysctl.conf (a link to /etc/sysctl.conf) sets vm.swappiness = 100 (not the value now), applied at boot by sysctl --system",
	}
	checkPrefix(t, got, want, cmd.Process.Pid)

	got = New(h, "net/ipv4/neigh/default/gc_thresh1", "2048").(tuner.Suspecter).Suspects(context.Background(), tuner.Value{Present: true, Text: "128"})
	want = []string{
		"/usr/lib/sysctl.d/50-default.conf sets net.ipv4.neigh.default.gc_thresh1 = 128 (the value now), applied at boot by sysctl --system",
		"/run/sysctl.d/60-glob.conf sets net.ipv4.neigh.default.gc_thresh1 = 512 (not the value now), applied at boot by sysctl --system",
		"/etc/sysctl.d/99-gke.conf sets net.ipv4.neigh.default.gc_thresh1 = 1024 (not the value now), applied at boot by sysctl --system",
	}
	checkPrefix(t, got, want, cmd.Process.Pid)

	// With systemd as init, the files are systemd-sysctl's.
	if err := os.MkdirAll(filepath.Join(root, "run/systemd/system"), 0o755); err != nil {
		t.Fatal(err)
	}
	got = New(h, "vm.swappiness", "100").(tuner.Suspecter).Suspects(context.Background(), tuner.Value{Present: true, Text: "60"})
	if len(got) == 0 || got[0] != "/etc/sysctl.d/99-gke.conf sets vm.swappiness = 60 (the value now), applied at boot by systemd-sysctl" {
		t.Errorf("with systemd, suspects are %q", got)
	}
}

// checkPrefix checks that got is want followed by process lines, one of them for pid.
func checkPrefix(t *testing.T, got, want []string, pid int) {
	t.Helper()
	if len(got) < len(want) {
		t.Fatalf("suspects:\n%s\nwant first:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for i, w := range want {
		if got[i] != w {
			t.Errorf("suspect %d: %q, want %q", i, got[i], w)
		}
	}
	found := false
	for _, g := range got[len(want):] {
		if !strings.HasPrefix(g, "process ") {
			t.Errorf("unexpected suspect %q", g)
		}
		found = found || strings.HasPrefix(g, "process node-tuner (pid "+strconv.Itoa(pid)+": ")
	}
	if !found {
		t.Errorf("the running node-tuner (pid %d) is not a suspect: %q", pid, got)
	}
}

func waitComm(t *testing.T, pid int, comm string) {
	t.Helper()
	for range 100 {
		b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
		if strings.TrimSpace(string(b)) == comm {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("pid %d never had comm %s", pid, comm)
}
