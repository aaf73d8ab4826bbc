package cpuset

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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

	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/tuner"
	"github.com/nodectl/nodectl/tuner/internal/tunertest"
)

var read = tunertest.Read

func file(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// status is a line of /proc/<pid>/status, e.g. Cpus_allowed_list.
func status(t *testing.T, pid int, key string) string {
	t.Helper()
	for _, l := range strings.Split(file(t, filepath.Join("/proc", strconv.Itoa(pid), "status")), "\n") {
		if v, ok := strings.CutPrefix(l, key+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no %s in the status of pid %d", key, pid)
	return ""
}

// startNamed runs a sleep under the name comm, so the partition can pick it out as a daemon.
func startNamed(t *testing.T, comm string) *exec.Cmd {
	t.Helper()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep binary")
	}
	b, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(t.TempDir(), comm)
	if err := os.WriteFile(exe, b, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "120")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

// v1Node is a node on the machine's v1 cpuset hierarchy: a system cgroup <base>/sys with a
// child, a workload cgroup <base>/pods with a child running a process, and a daemon in the
// root cpuset; all removed when the test ends.
type v1Node struct {
	mount, base, comm, online string
	daemon, pod               *exec.Cmd
	daemonCpuset              string
}

func newV1Node(t *testing.T) *v1Node {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the cpuset partition test needs root (cgroups)")
	}
	layout, err := cgroup.Detect("/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	mount, ok := layout.Mounts["cpuset"]
	if !ok {
		t.Skip("no v1 cpuset hierarchy here; the v2 path is tested on a plain-file tree")
	}
	online := file(t, "/sys/devices/system/cpu/online")
	if online != "0-1" {
		t.Skipf("the test expects 2 CPUs (0-1), the machine has %s", online)
	}
	systemExisted, parentExisted := dirExists(filepath.Join(mount, SystemCgroup)), dirExists(filepath.Join(mount, cgroup.Parent))
	if systemExisted {
		t.Skipf("%s exists: a partition is applied on this machine", SystemCgroup)
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	id := "cpuset-test-" + hex.EncodeToString(b)
	base := cgroup.Parent + "/" + id
	t.Cleanup(func() {
		if !dirExists(filepath.Join(mount, SystemCgroup)) {
			return
		}
		// A failed restore leaves nodectl's system cgroup: empty it into the root and remove it.
		hy := cgroup.Hierarchy{Root: mount, Controller: cgroup.CPUSet}
		pids, _ := hy.Procs(SystemCgroup)
		for _, pid := range pids {
			_ = hy.AddProc("/", pid)
		}
		_ = hy.Remove(SystemCgroup)
	})
	t.Cleanup(func() {
		if err := layout.Remove(base); err != nil {
			t.Error(err)
		}
		if !parentExisted {
			_ = layout.Prune(cgroup.Parent)
		}
	})
	for _, cg := range []string{base + "/sys/svc", base + "/pods/pod"} {
		if err := layout.Create(cg, cgroup.Limits{}); err != nil {
			t.Fatal(err)
		}
	}
	pod := startNamed(t, "nct-pod-"+hex.EncodeToString(b))
	if err := layout.AddProc(base+"/pods/pod", pod.Process.Pid); err != nil {
		t.Fatal(err)
	}
	comm := "nct-d-" + hex.EncodeToString(b)
	daemon := startNamed(t, comm)
	return &v1Node{mount: mount, base: base, comm: comm, daemon: daemon, pod: pod, online: online,
		daemonCpuset: file(t, filepath.Join("/proc", strconv.Itoa(daemon.Process.Pid), "cpuset"))}

}

func (n *v1Node) cpus(t *testing.T, cg string) string {
	return file(t, filepath.Join(n.mount, cg, "cpuset.cpus"))
}

func (n *v1Node) partition(t *testing.T) tuner.Setting {
	h := host.FS{Root: t.TempDir(), Procfs: "/proc", Sysfs: "/sys", Cgroupfs: "/sys/fs/cgroup"}
	return NewPartition(h, Partition{Reserved: "0", SystemCgroups: []string{n.base + "/sys"},
		WorkloadCgroups: []string{n.base + "/pods"}, Daemons: []string{n.comm}})
}

// assertAsBefore checks that the node is as newV1Node made it.
func (n *v1Node) assertAsBefore(t *testing.T) {
	t.Helper()
	for _, cg := range []string{n.base + "/sys", n.base + "/sys/svc", n.base + "/pods", n.base + "/pods/pod"} {
		if got := n.cpus(t, cg); got != n.online {
			t.Errorf("%s has CPUs %s, want %s", cg, got, n.online)
		}
	}
	if got := file(t, filepath.Join("/proc", strconv.Itoa(n.daemon.Process.Pid), "cpuset")); got != n.daemonCpuset {
		t.Errorf("the daemon is in cpuset %s, want %s", got, n.daemonCpuset)
	}
	if got := status(t, n.daemon.Process.Pid, "Cpus_allowed_list"); got != n.online {
		t.Errorf("the daemon runs on CPUs %s, want %s", got, n.online)
	}
	if dirExists(filepath.Join(n.mount, SystemCgroup)) {
		t.Errorf("%s is left", SystemCgroup)
	}
}

// On the machine's v1 cpuset hierarchy: a system cgroup, a workload cgroup with a child and a
// process, and a daemon in the root cpuset; apply reserves CPU 0 for the system, restore puts
// every cgroup's CPUs and the daemon back.
func TestPartitionV1(t *testing.T) {
	ctx := context.Background()
	n := newV1Node(t)
	base, comm, daemon, mount := n.base, n.comm, n.daemon, n.mount
	cpus := func(cg string) string { return n.cpus(t, cg) }
	s := n.partition(t)
	if s.ID() != "cpuset:partition" || s.Backend() != "cpuset" || s.Desired() != "system 0, workloads 1" {
		t.Fatalf("id %s backend %s desired %q", s.ID(), s.Backend(), s.Desired())
	}
	prev := read(t, s)
	t.Logf("before: %q", prev.Text)
	for _, want := range []string{
		"system 0-1 (" + strings.TrimPrefix(base, "/") + "/sys and 1 below)",
		"workloads 0-1 (" + strings.TrimPrefix(base, "/") + "/pods and 1 below)",
		comm + "[" + strconv.Itoa(daemon.Process.Pid) + "] outside",
	} {
		if !strings.Contains(prev.Text, want) {
			t.Errorf("before apply reads %q, want it to say %q", prev.Text, want)
		}
	}

	if err := s.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	if v := read(t, s); v.Text != s.Desired() {
		t.Errorf("after apply reads %q, want %q", v.Text, s.Desired())
	}
	if got := status(t, daemon.Process.Pid, "Cpus_allowed_list"); got != "0" {
		t.Errorf("daemon runs on CPUs %s, want 0", got)
	}
	if got := file(t, filepath.Join("/proc", strconv.Itoa(daemon.Process.Pid), "cpuset")); got != SystemCgroup {
		t.Errorf("daemon is in cpuset %s, want %s", got, SystemCgroup)
	}
	for cg, want := range map[string]string{base + "/sys": "0", base + "/sys/svc": "0", base + "/pods": "1", base + "/pods/pod": "1", SystemCgroup: "0"} {
		if got := cpus(cg); got != want {
			t.Errorf("%s has CPUs %s, want %s", cg, got, want)
		}
	}
	if got := status(t, n.pod.Process.Pid, "Cpus_allowed_list"); got != "1" {
		t.Errorf("the pod's process runs on CPUs %s, want 1", got)
	}
	if err := s.Apply(ctx); err != nil {
		t.Fatalf("applying twice: %v", err)
	}
	if v := read(t, s); v.Text != s.Desired() {
		t.Errorf("after applying twice reads %q", v.Text)
	}

	// Someone widens the system cgroup: verify sees it.
	if err := os.WriteFile(filepath.Join(mount, base, "sys/cpuset.cpus"), []byte("0-1"), 0o644); err != nil {
		t.Fatal(err)
	}
	drift := read(t, s)
	if want := "system 0-1 (" + strings.TrimPrefix(base, "/") + "/sys)"; drift.Text != want {
		t.Errorf("after a manual change reads %q, want %q", drift.Text, want)
	}

	if err := s.Restore(ctx, prev); err != nil {
		t.Fatal(err)
	}
	if v := read(t, s); v.Present != prev.Present || v.Text != prev.Text {
		t.Errorf("after restore reads %q, want %q", v.Text, prev.Text)
	}
	n.assertAsBefore(t)
}

func dirExists(d string) bool {
	fi, err := os.Stat(d)
	return err == nil && fi.IsDir()
}

// A pid that exited between apply and restore is skipped, and the rest is restored.
func TestPartitionRestoreSkipsAnExitedDaemon(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (cgroups)")
	}
	layout, err := cgroup.Detect("/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	mount, ok := layout.Mounts["cpuset"]
	if !ok || dirExists(filepath.Join(mount, SystemCgroup)) {
		t.Skip("no v1 cpuset hierarchy, or a partition is applied here")
	}
	parentExisted := dirExists(filepath.Join(mount, cgroup.Parent))
	t.Cleanup(func() {
		_ = os.Remove(filepath.Join(mount, SystemCgroup))
		if !parentExisted {
			_ = layout.Prune(cgroup.Parent)
		}
	})
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	comm := "nct-x-" + hex.EncodeToString(b)
	d := startNamed(t, comm)
	h := host.FS{Root: t.TempDir(), Procfs: "/proc", Sysfs: "/sys", Cgroupfs: "/sys/fs/cgroup"}
	s := NewPartition(h, Partition{Reserved: "0", Daemons: []string{comm}})
	prev := read(t, s)
	if err := s.Apply(context.Background()); err != nil {
		t.Fatal(err)
	}
	d.Process.Kill()
	d.Wait()
	time.Sleep(50 * time.Millisecond)
	if err := s.Restore(context.Background(), prev); err != nil {
		t.Fatal(err)
	}
	if dirExists(filepath.Join(mount, SystemCgroup)) {
		t.Errorf("restore left %s", SystemCgroup)
	}
	if v := read(t, s); v.Text != s.Desired() {
		t.Errorf("with the daemon gone reads %q, want %q", v.Text, s.Desired())
	}
}

// fakeV2 is a cgroup v2 tree of plain files, with 4 CPUs: the root hands down cpu only; a
// system slice; kubepods, which hands down cpuset, with a pod on CPUs 1-2 and one inheriting.
func fakeV2(t *testing.T) (host.FS, string) {
	t.Helper()
	dir := t.TempDir()
	root := filepath.Join(dir, "cgroup")
	files := map[string]string{
		"sys/devices/system/cpu/online":              "0-3\n",
		"cgroup/cgroup.controllers":                  "cpuset cpu io memory pids\n",
		"cgroup/cgroup.subtree_control":              "cpu\n",
		"cgroup/cpuset.cpus.effective":               "0-3\n",
		"cgroup/system.slice/cgroup.subtree_control": "\n",
		"cgroup/kubepods/cgroup.subtree_control":     "cpuset\n",
		"cgroup/kubepods/pod-a/cpuset.cpus":          "1-2\n",
		"cgroup/kubepods/pod-b/cpuset.cpus":          "\n",
	}
	for f, c := range files {
		p := filepath.Join(dir, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return host.FS{Root: dir, Procfs: "/proc", Sysfs: filepath.Join(dir, "sys"), Cgroupfs: root}, root
}

// plainV2 detects the v2 tree of plain files at root as the cpuset hierarchy.
func plainV2(root string) func() (cgroup.Hierarchy, error) {
	return func() (cgroup.Hierarchy, error) {
		return cgroup.Hierarchy{Root: root, Controller: cgroup.CPUSet, V2: true}, nil
	}
}

func TestPartitionV2OnAPlainFileTree(t *testing.T) {
	ctx := context.Background()
	h, root := fakeV2(t)
	s := NewPartition(h, Partition{Reserved: "0-1", SystemCgroups: []string{"system.slice"}, WorkloadCgroups: []string{"kubepods"}}).(*partition)
	s.detect = plainV2(root)
	if s.Desired() != "system 0-1, workloads 2-3" {
		t.Fatalf("desired %q", s.Desired())
	}
	prev := read(t, s)
	if want := "system 0-3 (system.slice); workloads 0-3 (kubepods and 2 below)"; prev.Text != want {
		t.Errorf("before apply reads %q, want %q", prev.Text, want)
	}
	if err := s.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	get := func(f string) string { return file(t, filepath.Join(root, f)) }
	for f, want := range map[string]string{
		"cgroup.subtree_control":          "+cpuset",
		"system.slice/cpuset.cpus":        "0-1",
		"kubepods/cpuset.cpus":            "2-3",
		"kubepods/pod-a/cpuset.cpus":      "2",
		"kubepods/pod-b/cpuset.cpus":      "",
		"kubepods/cgroup.subtree_control": "cpuset",
	} {
		if got := get(f); got != want {
			t.Errorf("after apply %s is %q, want %q", f, got, want)
		}
	}
	if v := read(t, s); v.Text != s.Desired() {
		t.Errorf("after apply reads %q, want %q", v.Text, s.Desired())
	}
	if err := s.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Restore(ctx, prev); err != nil {
		t.Fatal(err)
	}
	if v := read(t, s); v.Text != prev.Text {
		t.Errorf("after restore reads %q, want %q", v.Text, prev.Text)
	}
	for f, want := range map[string]string{
		"cgroup.subtree_control":     "-cpuset",
		"system.slice/cpuset.cpus":   "",
		"kubepods/cpuset.cpus":       "",
		"kubepods/pod-a/cpuset.cpus": "1-2",
	} {
		if got := get(f); got != want {
			t.Errorf("after restore %s is %q, want %q", f, got, want)
		}
	}
}

func TestPartitionRefusesBadParameters(t *testing.T) {
	h, root := fakeV2(t)
	tests := map[string]struct {
		p    Partition
		want string
	}{
		"not_a_list":      {Partition{Reserved: "x"}, `reserved CPUs "x": want a CPU list`},
		"empty":           {Partition{Reserved: ""}, `reserved CPUs "": want a CPU list`},
		"beyond_the_node": {Partition{Reserved: "0-7"}, "the node's online CPUs are 0-3"},
		"every_cpu":       {Partition{Reserved: "0-3"}, "leaving none for workloads"},
		"root_cgroup":     {Partition{Reserved: "0", SystemCgroups: []string{"/"}}, "the root cgroup has every CPU"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := NewPartition(h, tc.p).(*partition)
			s.detect = plainV2(root)
			if _, err := s.Read(context.Background()); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("read says %v, want %q", err, tc.want)
			}
			if err := s.Apply(context.Background()); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("apply says %v, want %q", err, tc.want)
			}
		})
	}
}

func TestPartitionDecodeRoundTrip(t *testing.T) {
	h, _ := fakeV2(t)
	p := Partition{Reserved: "0,1", SystemCgroups: []string{"system.slice"}, WorkloadCgroups: []string{"kubepods"}, Daemons: []string{"containerd"}}
	s := NewPartition(h, p)
	raw, err := json.Marshal(s.Spec())
	if err != nil {
		t.Fatal(err)
	}
	d, err := Decode(h, raw)
	if err != nil {
		t.Fatal(err)
	}
	if d.ID() != s.ID() || d.Desired() != s.Desired() || d.Desired() != "system 0-1, workloads 2-3" {
		t.Errorf("decoded %s %q, want %s %q", d.ID(), d.Desired(), s.ID(), s.Desired())
	}
	if _, err := Decode(h, []byte(`{}`)); err == nil {
		t.Error("decoding a spec without reserved CPUs succeeded")
	}
}

func TestLive(t *testing.T) {
	sysfs := filepath.Join(t.TempDir(), "sys")
	if err := os.MkdirAll(filepath.Join(sysfs, "devices/system/cpu"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sysfs, "devices/system/cpu/online"), []byte("0-31\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The desired text is display only: Live goes by the spec and the node's CPUs.
	st := &tuner.State{Settings: []tuner.Record{{ID: "sysctl:vm.swappiness", Desired: "100"},
		{ID: ID, Spec: json.RawMessage(`{"reserved":"1,0"}`), Desired: "whatever it says"}}}
	if _, _, ok, err := Live(st, sysfs); ok || err != nil {
		t.Errorf("an unfinished apply reads as live (%v)", err)
	}
	st.Finished = time.Now()
	if sys, wl, ok, err := Live(st, sysfs); !ok || err != nil || sys != "0-1" || wl != "2-31" {
		t.Errorf("Live = %q %q %v %v", sys, wl, ok, err)
	}
	if _, _, ok, err := Live(nil, sysfs); ok || err != nil {
		t.Error("no state reads as live")
	}
	st.Settings[1].Spec = json.RawMessage(`{"reserved":"32-33"}`)
	if _, _, ok, err := Live(st, sysfs); ok || err == nil || !strings.Contains(err.Error(), "online CPUs are 0-31") {
		t.Errorf("a partition beyond the online CPUs reads as %v, %v", ok, err)
	}
}

// Through the engine: a failure at each step of applying the partition leaves the node as it
// was and no state file; a complete apply rolls back from the state file alone.
func TestPartitionFailuresLeaveTheNodeAsItWas(t *testing.T) {
	ctx := context.Background()
	n := newV1Node(t)
	s := n.partition(t)
	h := host.FS{Root: t.TempDir(), Procfs: "/proc", Sysfs: "/sys", Cgroupfs: "/sys/fs/cgroup"}
	state := filepath.Join(t.TempDir(), "state.json")
	engine := func(fault func(tuner.Step, string) error) *tuner.Engine {
		return &tuner.Engine{Profile: "test", Settings: []tuner.Setting{s}, State: state, Fault: fault,
			Decode: func(_ string, spec json.RawMessage) (tuner.Setting, error) { return Decode(h, spec) }}
	}
	for _, step := range []tuner.Step{tuner.StepRead, tuner.StepRecord, tuner.StepApply, tuner.StepVerify} {
		t.Run(string(step), func(t *testing.T) {
			_, err := engine(func(at tuner.Step, _ string) error {
				if at == step {
					return errors.New("injected")
				}
				return nil
			}).Apply(ctx)
			if err == nil || !strings.Contains(err.Error(), "injected") {
				t.Fatalf("apply with a failure at %s: %v", step, err)
			}
			n.assertAsBefore(t)
			if _, err := os.Stat(state); err == nil {
				t.Errorf("a failed apply left the state file")
			}
		})
	}
	if _, err := engine(nil).Apply(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := tuner.LoadState(state)
	if err != nil {
		t.Fatal(err)
	}
	if sys, wl, ok, err := Live(st, "/sys"); !ok || err != nil || sys != "0" || wl != "1" {
		t.Errorf("the applied state holds partition %q %q %v %v, want 0 1", sys, wl, ok, err)
	}
	if _, err := engine(nil).Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	n.assertAsBefore(t)
}
