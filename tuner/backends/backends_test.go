package backends_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/nodectl/nodectl/host"

	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/tuner"
	"github.com/nodectl/nodectl/tuner/backends"
	"github.com/nodectl/nodectl/tuner/profile"
)

var gcKeys = []string{"net.ipv4.neigh.default.gc_thresh1", "net.ipv4.neigh.default.gc_thresh2", "net.ipv4.neigh.default.gc_thresh3"}

func sysctlFile(k string) string { return "/proc/sys/" + strings.ReplaceAll(k, ".", "/") }

// fixture is a node with something for every backend to change: real sysctls, a scratch root
// on a real disk (drop-ins, the journal's storage, a swap file), and real cpuset cgroups with a
// "daemon" in the root cpuset and a "pod" in a workload cgroup.
type fixture struct {
	host    host.FS
	profile *profile.Profile
	layout  *cgroup.Layout
	base    string // the test's cgroup below the nodectl parent
	procs   []*exec.Cmd
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the tuner's backends change the node: run as root (sudo make test)")
	}
	layout, err := cgroup.Detect("/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := layout.Mounts["cpuset"]; !ok && layout.V1 {
		t.Skip("no v1 cpuset hierarchy")
	}
	f := &fixture{layout: layout, base: fmt.Sprintf("/nodectl/tune-test-%d", os.Getpid())}

	orig := map[string]string{}
	want := map[string]string{}
	for i, k := range gcKeys {
		b, err := os.ReadFile(sysctlFile(k))
		if err != nil {
			t.Fatal(err)
		}
		orig[k] = strings.TrimSpace(string(b))
		n, _ := strconv.Atoi(orig[k])
		want[k] = strconv.Itoa(n + 5 + i)
	}
	t.Cleanup(func() {
		for k, v := range orig {
			_ = os.WriteFile(sysctlFile(k), []byte(v), 0o644)
		}
	})

	// Swap needs a real disk filesystem, so the scratch root is on /var/tmp, not tmpfs.
	root, err := os.MkdirTemp("/var/tmp", "nodectl-tune-test-")
	if err != nil {
		t.Fatal(err)
	}
	f.host = host.FS{Root: root, Procfs: "/proc", Sysfs: "/sys", Cgroupfs: "/sys/fs/cgroup"}
	t.Cleanup(func() {
		// Undo whatever a failed test left: mounts and swap below the root, then the tree.
		_ = exec.Command("swapoff", filepath.Join(root, "var/lib/nodectl/swapfile")).Run()
		_ = exec.Command("umount", "-R", filepath.Join(root, "var/log/journal")).Run()
		os.RemoveAll(root)
	})

	f.start(t, f.copyOf(t, "sleep", "nodectl-tdaemon"), "")
	pods, sys := f.base+"/pods", f.base+"/system"
	for _, cg := range []string{pods, pods + "/pod-a", sys} {
		if err := layout.Create(cg, cgroup.Limits{}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, c := range f.procs {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
		_ = layout.Remove(f.base)
		_ = layout.Prune("/nodectl") // the shared parent, when this test was its last user
	})
	f.start(t, "sleep", pods+"/pod-a")

	f.profile = &profile.Profile{
		Name:   "all-backends",
		Source: "test",
		Sysctl: want,
		Swap:   &profile.Swap{File: "/var/lib/nodectl/swapfile", Size: 32 << 20, Priority: 7, Enabled: true},
		Journald: &profile.Journald{
			DropIn:   "/etc/systemd/journald.conf.d/90-nodectl.conf",
			Settings: []profile.Entry{{Key: "SystemMaxUse", Value: "500M"}, {Key: "RateLimitBurst", Value: "1000"}},
			Storage:  "/var/lib/containerd/systemd-journal",
		},
		ReservedCPUs: &profile.ReservedCPUs{
			CPUs:            "0",
			KubeletDropIn:   "/etc/kubernetes/kubelet.conf.d/90-nodectl.conf",
			SystemCgroups:   []string{sys},
			WorkloadCgroups: []string{pods},
			Daemons:         []string{"nodectl-tdaemon"},
		},
	}
	return f
}

// copyOf copies a tool under another name, so its comm is unique to this test.
func (f *fixture) copyOf(t *testing.T, tool, name string) string {
	t.Helper()
	src, err := exec.LookPath(tool)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return dst
}

// start runs exe 600 in cgroup cg (none: where the test runs).
func (f *fixture) start(t *testing.T, exe, cg string) *exec.Cmd {
	t.Helper()
	c := exec.Command(exe, "600")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	f.procs = append(f.procs, c)
	if cg != "" {
		if err := f.layout.AddProc(cg, c.Process.Pid); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// snapshot is everything the tuner may touch on this node, as text.
func (f *fixture) snapshot(t *testing.T) map[string]string {
	t.Helper()
	s := map[string]string{}
	for _, k := range gcKeys {
		b, _ := os.ReadFile(sysctlFile(k))
		s["sysctl "+k] = string(b)
	}
	_ = filepath.WalkDir(f.host.Root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		fi, _ := d.Info()
		v := fi.Mode().String()
		if d.Type().IsRegular() {
			b, _ := os.ReadFile(p)
			sum := sha256.Sum256(b)
			v += " " + hex.EncodeToString(sum[:8])
		}
		s["file "+p] = v
		return nil
	})
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mi), "\n") {
		if strings.Contains(line, f.host.Root) {
			s["mount "+line] = "mounted"
		}
	}
	sw, _ := os.ReadFile("/proc/swaps")
	s["swaps"] = string(sw)
	cpuset := f.layout.Mounts["cpuset"]
	for _, top := range []string{f.base, "/nodectl/system"} {
		_ = filepath.WalkDir(filepath.Join(cpuset, top), func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				b, _ := os.ReadFile(filepath.Join(p, "cpuset.cpus"))
				s["cpuset "+p] = string(b)
			}
			return nil
		})
	}
	for _, c := range f.procs {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cpuset", c.Process.Pid))
		st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", c.Process.Pid))
		for _, line := range strings.Split(string(st), "\n") {
			if strings.HasPrefix(line, "Cpus_allowed_list") {
				s[fmt.Sprintf("proc %d", c.Process.Pid)] = string(b) + " " + line
			}
		}
	}
	return s
}

func (f *fixture) engine(state string) *tuner.Engine {
	return &tuner.Engine{Profile: f.profile.Name, Settings: backends.Settings(f.host, f.profile), State: state,
		Decode: backends.Decoder(f.host)}
}

func diff(a, b map[string]string) []string {
	var out []string
	for k, v := range a {
		if b[k] != v {
			out = append(out, fmt.Sprintf("%s: %q -> %q", k, v, b[k]))
		}
	}
	for k, v := range b {
		if _, ok := a[k]; !ok {
			out = append(out, fmt.Sprintf("%s: new %q", k, v))
		}
	}
	sort.Strings(out)
	return out
}

// A failure at each step of each backend's setting leaves the node exactly as it was before
// apply and no state file behind.
func TestFailureAtEveryStepLeavesTheNodeAsItWas(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	state := filepath.Join(t.TempDir(), "state.json")
	settings := f.engine(state).Settings
	backendsSeen := map[string]bool{}
	for _, s := range settings {
		backendsSeen[s.Backend()] = true
	}
	for _, b := range []string{"sysctl", "swap", "journald", "journal-storage", "kubelet", "cpuset"} {
		if !backendsSeen[b] {
			t.Fatalf("the fixture's profile has no %s setting", b)
		}
	}
	before := f.snapshot(t)
	type fault struct {
		step tuner.Step
		id   string
	}
	faults := []fault{{tuner.StepRecord, ""}}
	for _, s := range settings {
		for _, step := range []tuner.Step{tuner.StepRead, tuner.StepApply, tuner.StepVerify} {
			faults = append(faults, fault{step, s.ID()})
		}
	}
	for _, fl := range faults {
		t.Run(fmt.Sprintf("%s/%s", fl.step, fl.id), func(t *testing.T) {
			e := f.engine(state)
			e.Fault = func(step tuner.Step, id string) error {
				if step == fl.step && id == fl.id {
					return errors.New("injected failure")
				}
				return nil
			}
			_, err := e.Apply(ctx)
			if err == nil {
				t.Fatal("apply succeeded despite the failure")
			}
			t.Log(err)
			if d := diff(before, f.snapshot(t)); len(d) > 0 {
				t.Fatalf("the node changed:\n%s", strings.Join(d, "\n"))
			}
			if _, err := os.Stat(state); !errors.Is(err, os.ErrNotExist) {
				t.Fatal("a failed apply left a state file")
			}
		})
	}

	// And the whole profile applies, holds, and rolls back to exactly the node before; a
	// restore that fails stays in the state file until a second rollback.
	e := f.engine(state)
	res, err := e.Apply(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Changed) != len(settings) {
		t.Errorf("changed %v, want all %d settings", res.Changed, len(settings))
	}
	items, err := e.Current(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range items {
		if it.Change {
			t.Errorf("%s does not hold after apply: %q, want %q", it.ID, it.Current, it.Desired)
		}
	}
	e.Fault = func(step tuner.Step, id string) error {
		if step == tuner.StepRestore && strings.HasPrefix(id, "swap:") {
			return errors.New("injected failure")
		}
		return nil
	}
	if _, err := e.Rollback(ctx); err == nil {
		t.Fatal("rollback succeeded despite the failure")
	}
	st, err := tuner.LoadState(state)
	if err != nil || st == nil || len(st.Settings) != 1 || st.Settings[0].Backend != "swap" {
		t.Fatalf("state after a failed restore: %+v, %v", st, err)
	}
	e.Fault = nil
	if _, err := e.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if d := diff(before, f.snapshot(t)); len(d) > 0 {
		t.Fatalf("rollback did not restore the node:\n%s", strings.Join(d, "\n"))
	}
	if !reflect.DeepEqual(before, f.snapshot(t)) {
		t.Fatal("snapshots differ")
	}
}
