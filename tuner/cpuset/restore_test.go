package cpuset

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodectl/nodectl/host"

	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/tuner"
)

// engineOn is an engine holding s alone, with a state file of its own and rollback decoding
// through decode.
func engineOn(t *testing.T, s tuner.Setting, decode func(json.RawMessage) (tuner.Setting, error)) *tuner.Engine {
	return &tuner.Engine{Profile: "test", Settings: []tuner.Setting{s}, State: filepath.Join(t.TempDir(), "state.json"),
		Decode: func(_ string, spec json.RawMessage) (tuner.Setting, error) { return decode(spec) }}
}

func (n *v1Node) engine(t *testing.T, s tuner.Setting) *tuner.Engine {
	h := host.FS{Root: t.TempDir(), Procfs: "/proc", Sysfs: "/sys", Cgroupfs: "/sys/fs/cgroup"}
	return engineOn(t, s, func(spec json.RawMessage) (tuner.Setting, error) { return Decode(h, spec) })
}

// recordedData is the partition's data in the engine's state file.
func recordedData(t *testing.T, e *tuner.Engine) (tuner.Value, data) {
	t.Helper()
	st, err := tuner.LoadState(e.State)
	if err != nil || st == nil || len(st.Settings) != 1 {
		t.Fatalf("state %s: %v %v", e.State, st, err)
	}
	d, err := recorded(st.Settings[0].Previous)
	if err != nil {
		t.Fatal(err)
	}
	return st.Settings[0].Previous, d
}

func cpusetOf(t *testing.T, pid int) string {
	t.Helper()
	return file(t, filepath.Join("/proc", strconv.Itoa(pid), "cpuset"))
}

// assertCgroupsAsBefore checks the cgroups newV1Node made have every CPU again and nodectl's
// system cgroup and the state file are gone.
func (n *v1Node) assertCgroupsAsBefore(t *testing.T, e *tuner.Engine) {
	t.Helper()
	for _, cg := range []string{n.base + "/sys", n.base + "/sys/svc", n.base + "/pods", n.base + "/pods/pod"} {
		if got := n.cpus(t, cg); got != n.online {
			t.Errorf("%s has CPUs %s, want %s", cg, got, n.online)
		}
	}
	if dirExists(filepath.Join(n.mount, SystemCgroup)) {
		t.Errorf("%s is left", SystemCgroup)
	}
	if _, err := os.Stat(e.State); err == nil {
		t.Errorf("rollback left the state file")
	}
}

// On a live node the partition's text changes on its own: the daemon restarts (another pid of
// the same name, outside the reserved CPUs) and a pod appears below the workload cgroup.
// Rollback through the engine still succeeds, since it checks what was recorded, not the text.
func TestPartitionRollbackAfterDaemonAndPodChurn(t *testing.T) {
	ctx := context.Background()
	n := newV1Node(t)
	s := n.partition(t)
	e := n.engine(t, s)
	if _, err := e.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	n.daemon.Process.Kill()
	n.daemon.Wait()
	restarted := startNamed(t, n.comm)
	layout, err := cgroup.Detect("/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	if err := layout.Create(n.base+"/pods/new", cgroup.Limits{}); err != nil {
		t.Fatal(err)
	}
	prev, _ := recordedData(t, e)
	now := read(t, s)
	t.Logf("recorded %q; before rollback reads %q", prev.Text, now.Text)
	if want := n.comm + "[" + strconv.Itoa(restarted.Process.Pid) + "] outside"; !strings.Contains(now.Text, want) {
		t.Fatalf("after the daemon restarted reads %q, want it to say %q", now.Text, want)
	}
	if _, err := e.Rollback(ctx); err != nil {
		t.Fatalf("rollback after churn: %v", err)
	}
	n.assertCgroupsAsBefore(t, e)
	if got := cpusetOf(t, restarted.Process.Pid); got != n.daemonCpuset {
		t.Errorf("the restarted daemon is in cpuset %s, want %s, where it started", got, n.daemonCpuset)
	}
	if got := n.cpus(t, n.base+"/pods/new"); got != "1" {
		t.Errorf("the pod that appeared has CPUs %s, want 1, which it got from its parent", got)
	}
}

// startForker runs a shell under the name comm that, on a line on its stdin, forks a sleep:
// a daemon forking a child (containerd its shims) after the partition moved it.
func startForker(t *testing.T, comm string) (*exec.Cmd, io.WriteCloser) {
	t.Helper()
	b, err := os.ReadFile("/bin/sh")
	if err != nil {
		t.Skip("no /bin/sh for the forking daemon")
	}
	exe := filepath.Join(t.TempDir(), comm)
	if err := os.WriteFile(exe, b, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-c", "read x; sleep 120 & wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() })
	return cmd, in
}

// childOf waits for a process named comm whose parent is ppid.
func childOf(t *testing.T, ppid int, comm string) int {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		dirs, _ := filepath.Glob("/proc/[0-9]*")
		for _, d := range dirs {
			st, err := os.ReadFile(filepath.Join(d, "stat"))
			if err != nil {
				continue
			}
			// pid (comm) state ppid ...
			i := strings.LastIndexByte(string(st), ')')
			f := strings.Fields(string(st[i+1:]))
			c, _ := os.ReadFile(filepath.Join(d, "comm"))
			if len(f) > 1 && f[1] == strconv.Itoa(ppid) && strings.TrimSpace(string(c)) == comm {
				pid, _ := strconv.Atoi(filepath.Base(d))
				return pid
			}
		}
	}
	t.Fatalf("no child %s of pid %d", comm, ppid)
	return 0
}

// A daemon that starts after apply is moved by a re-apply, which adds it to the record;
// rollback puts both daemons back where they were, and the child the second forked while
// confined goes where its parent went, not to the root cpuset.
func TestPartitionReapplyRecordsANewDaemon(t *testing.T) {
	ctx := context.Background()
	n := newV1Node(t)
	layout, err := cgroup.Detect("/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	home := n.base + "/home"
	if err := layout.Create(home, cgroup.Limits{}); err != nil {
		t.Fatal(err)
	}
	s := n.partition(t)
	e := n.engine(t, s)
	if _, err := e.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	late, in := startForker(t, n.comm)
	if err := layout.AddProc(home, late.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if v := read(t, s); !strings.Contains(v.Text, fmt.Sprintf("[%d] outside", late.Process.Pid)) {
		t.Fatalf("with a new daemon reads %q", v.Text)
	}
	res, err := e.Apply(ctx)
	if err != nil {
		t.Fatalf("re-apply: %v", err)
	}
	if !slices.Contains(res.Changed, ID) {
		t.Errorf("re-apply changed %v, want %s", res.Changed, ID)
	}
	for _, pid := range []int{n.daemon.Process.Pid, late.Process.Pid} {
		if got := cpusetOf(t, pid); got != SystemCgroup {
			t.Errorf("after re-apply pid %d is in %s, want %s", pid, got, SystemCgroup)
		}
	}
	_, d := recordedData(t, e)
	want := map[int]string{n.daemon.Process.Pid: n.daemonCpuset, late.Process.Pid: home}
	for _, m := range d.Moves {
		if want[m.PID] != m.Cgroup {
			t.Errorf("the record has %s[%d] from %s, want %s", m.Comm, m.PID, m.Cgroup, want[m.PID])
		}
		delete(want, m.PID)
	}
	if len(want) > 0 || d.SystemExisted {
		t.Errorf("the record misses the moves of %v or says %s existed (%v): %+v", want, SystemCgroup, d.SystemExisted, d)
	}

	// The new daemon forks a child while confined.
	if _, err := io.WriteString(in, "go\n"); err != nil {
		t.Fatal(err)
	}
	child := childOf(t, late.Process.Pid, "sleep")
	if got := cpusetOf(t, child); got != SystemCgroup {
		t.Fatalf("the child is in %s, want %s", got, SystemCgroup)
	}

	if _, err := e.Rollback(ctx); err != nil {
		t.Fatalf("rollback: %v", err)
	}
	n.assertAsBefore(t)
	n.assertCgroupsAsBefore(t, e)
	for who, pid := range map[string]int{"the new daemon": late.Process.Pid, "its child": child} {
		if got := cpusetOf(t, pid); got != home {
			t.Errorf("%s is in %s, want %s", who, got, home)
		}
	}
}

// On a v2 tree of plain files, through the engine: a re-apply after drift records the cgroups
// it changes beyond the first apply, keeping the first apply's value of a cgroup both change;
// rollback puts the merged record back although a pod appeared meanwhile; and Restored names
// what is not back.
func TestPartitionV2ReapplyAndRestoreCheck(t *testing.T) {
	ctx := context.Background()
	h, root := fakeV2(t)
	fake := plainV2(root)
	decode := func(spec json.RawMessage) (tuner.Setting, error) {
		s, err := Decode(h, spec)
		if err != nil {
			return nil, err
		}
		s.(*partition).detect = fake
		return s, nil
	}
	s, err := decode(json.RawMessage(`{"reserved":"0-1","system_cgroups":["system.slice"],"workload_cgroups":["kubepods"]}`))
	if err != nil {
		t.Fatal(err)
	}
	e := engineOn(t, s, decode)
	put := func(f, v string) {
		t.Helper()
		p := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	get := func(f string) string { return file(t, filepath.Join(root, f)) }
	if _, err := e.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	// Drift: someone widens system.slice, a pod on every CPU appears.
	put("system.slice/cpuset.cpus", "0-3")
	put("kubepods/pod-c/cpuset.cpus", "0-3")
	if _, err := e.Apply(ctx); err != nil {
		t.Fatalf("re-apply: %v", err)
	}
	if got := get("kubepods/pod-c/cpuset.cpus"); got != "2-3" {
		t.Errorf("re-apply left pod-c on %s, want 2-3", got)
	}
	prev, d := recordedData(t, e)
	from := map[string]string{}
	for _, c := range d.Cgroups {
		from[c.Path] = c.From
	}
	for p, want := range map[string]string{"/system.slice": "", "/kubepods": "", "/kubepods/pod-a": "1-2", "/kubepods/pod-c": "0-3"} {
		if got, ok := from[p]; !ok || got != want {
			t.Errorf("the merged record has %s from %q (%v), want %q", p, got, ok, want)
		}
	}
	// A pod comes, changing the text's count below kubepods.
	put("kubepods/pod-d/cpuset.cpus", "2")
	if _, err := e.Rollback(ctx); err != nil {
		t.Fatalf("rollback: %v", err)
	}
	for f, want := range map[string]string{
		"cgroup.subtree_control":     "-cpuset",
		"system.slice/cpuset.cpus":   "",
		"kubepods/cpuset.cpus":       "",
		"kubepods/pod-a/cpuset.cpus": "1-2",
		"kubepods/pod-b/cpuset.cpus": "",
		"kubepods/pod-c/cpuset.cpus": "0-3",
		"kubepods/pod-d/cpuset.cpus": "2",
	} {
		if got := get(f); got != want {
			t.Errorf("after rollback %s is %q, want %q", f, got, want)
		}
	}

	// What is not back is named.
	rc := s.(tuner.RestoreChecker)
	if ok, why, err := rc.Restored(ctx, prev); !ok || err != nil {
		t.Fatalf("after rollback Restored = %v %q %v", ok, why, err)
	}
	put("system.slice/cpuset.cpus", "0")
	put("cgroup.subtree_control", "+cpuset")
	put("nodectl/system/cpuset.cpus", "0")
	ok, why, err := rc.Restored(ctx, prev)
	if ok || err != nil {
		t.Fatalf("Restored = %v %v with three things not back", ok, err)
	}
	for _, want := range []string{"system.slice has CPUs 0, recorded none", "cgroup.subtree_control still enables cpuset", "cgroup /nodectl/system exists; it did not"} {
		if !strings.Contains(why, want) {
			t.Errorf("Restored says %q, want it to say %q", why, want)
		}
	}
}

// Merge keeps the first record's value of whatever both record, adds what only the second
// does, and keeps restoring parents' cpuset enabling children first.
func TestPartitionMergeKeepsTheFirstRecord(t *testing.T) {
	h, _ := fakeV2(t)
	s := NewPartition(h, Partition{Reserved: "0"}).(*partition)
	val := func(d data) tuner.Value {
		raw, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		return tuner.Value{Present: true, Text: fmt.Sprint(len(raw)), Data: raw}
	}
	first := val(data{
		Cgroups: []change{{Path: "/kubepods", From: "0-3"}},
		Moves:   []move{{PID: 10, Start: 5, Comm: "containerd", Cgroup: "/system.slice/containerd.service"}},
		Enabled: []string{"/kubepods"},
	})
	now := val(data{
		Cgroups: []change{{Path: "/kubepods", From: "1-3"}, {Path: "/kubepods/pod", From: "0-1"}, {Path: SystemCgroup, From: "0-3"}},
		Moves: []move{{PID: 10, Start: 5, Comm: "containerd", Cgroup: "/elsewhere"}, {PID: 10, Start: 9, Comm: "containerd", Cgroup: "/"},
			{PID: 11, Start: 7, Comm: "kubelet", Cgroup: "/system.slice/kubelet.service"}},
		Enabled:       []string{"/", "/kubepods"},
		ParentExisted: true, SystemExisted: true,
	})
	m, err := s.Merge(first, now)
	if err != nil {
		t.Fatal(err)
	}
	if m.Text != first.Text || !m.Present {
		t.Errorf("merged text %q, want the first's %q", m.Text, first.Text)
	}
	got, err := recorded(m)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(got)
	want := `{"cgroups":[{"path":"/kubepods","cpus":"0-3"},{"path":"/kubepods/pod","cpus":"0-1"}],` +
		`"pids":[{"pid":10,"start":5,"comm":"containerd","cgroup":"/system.slice/containerd.service"},{"pid":10,"start":9,"comm":"containerd","cgroup":"/"},{"pid":11,"start":7,"comm":"kubelet","cgroup":"/system.slice/kubelet.service"}],` +
		`"subtree_control":["/","/kubepods"],"nodectl_existed":false,"system_existed":false}`
	if string(raw) != want {
		t.Errorf("merged\n%s\nwant\n%s", raw, want)
	}
}
