package daemons

import (
	"cmp"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/internal/badvalue"
)

// The PID namespaces of the fake procfs: the host's (its PID 1's) and a nested node's.
const (
	hostNS   = "pid:[4026531836]"
	nestedNS = "pid:[4026532999]"
)

// proc is one process of a fake procfs: its comm, executable and argv[0] (the executable when
// ""), PID namespace (the host's when ""), start time in ticks since boot, and cgroup paths in
// a hybrid layout (the cpu hierarchy's, the unified one's).
type proc struct {
	comm, exe, argv0, ns string
	start                uint64
	cpu, unified         string
}

// fakeProcfs writes procs, and an uptime of 1000s, below a new directory.
func fakeProcfs(t *testing.T, procs map[int]proc) string {
	t.Helper()
	root := t.TempDir()
	for pid, p := range procs {
		dir := filepath.Join(root, strconv.Itoa(pid))
		if err := os.MkdirAll(filepath.Join(dir, "ns"), 0o755); err != nil {
			t.Fatal(err)
		}
		cg := strings.Join([]string{
			"9:name=systemd:" + p.unified,
			"4:memory:/elsewhere",
			"2:cpu,cpuacct:" + p.cpu,
			"0::" + p.unified,
		}, "\n") + "\n"
		// pid (comm) state ppid, 17 fields, the start time, 22 fields.
		stat := fmt.Sprintf("%d (%s) S 1 %s%d %s\n", pid, p.comm, strings.Repeat("0 ", 17), p.start, strings.TrimSpace(strings.Repeat("0 ", 22)))
		for file, body := range map[string]string{"comm": p.comm + "\n", "cgroup": cg, "cmdline": cmp.Or(p.argv0, p.exe) + "\x00--flag\x00", "stat": stat} {
			if err := os.WriteFile(filepath.Join(dir, file), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		for link, to := range map[string]string{"exe": p.exe, "ns/pid": cmp.Or(p.ns, hostNS)} {
			if err := os.Symlink(to, filepath.Join(dir, link)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Not a process: skipped.
	if err := os.WriteFile(filepath.Join(root, "uptime"), []byte("1000.00 1900.00\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

// node is a host with a nested node (a kind node's kubelet and journald in a PID namespace of
// their own) and programs whose comm passes for a daemon's.
var node = map[int]proc{
	1:    {comm: "systemd", exe: "/usr/lib/systemd/systemd", cpu: "/", unified: "/init.scope"},
	310:  {comm: "systemd-journal", exe: "/usr/lib/systemd/systemd-journald", start: 300, cpu: "/system.slice/systemd-journald.service", unified: "/system.slice/systemd-journald.service"},
	320:  {comm: "systemd-journal", exe: "/usr/lib/systemd/systemd-journal-upload", cpu: "/system.slice/systemd-journal-upload.service", unified: "/system.slice/systemd-journal-upload.service"},
	700:  {comm: "containerd", exe: "/usr/bin/containerd", cpu: "/system.slice/containerd.service", unified: "/system.slice/containerd.service"},
	701:  {comm: "containerd", exe: "/usr/bin/containerd (deleted)", cpu: "/system.slice/containerd.service", unified: "/system.slice/containerd.service"},
	702:  {comm: "containerd-shim", exe: "/usr/bin/containerd-shim-runc-v2", cpu: "/system.slice/containerd.service", unified: "/system.slice/containerd.service"},
	800:  {comm: "tuned", exe: "/usr/bin/python3.12", argv0: "/usr/bin/python3", cpu: "/system.slice/tuned.service", unified: "/system.slice/tuned.service"},
	900:  {comm: "kubelet", exe: "/usr/bin/kubelet-v1.34", argv0: "/usr/bin/kubelet", start: 50000, cpu: "/system.slice/kubelet.service", unified: "/system.slice/kubelet.service"},
	950:  {comm: "containerd", exe: "/usr/bin/containerd", cpu: "/nodectl/t/containerd", unified: "/nodectl/t/containerd"},
	1200: {comm: "crio", exe: "/usr/bin/crio", cpu: "/", unified: "/"},
	1300: {comm: "dockerd", exe: "/usr/bin/dockerd", cpu: "/system.slice/docker.service", unified: "/system.slice/docker.service"},
	2000: {comm: "kubelet", exe: "/usr/bin/kubelet", ns: nestedNS, cpu: "/kubepods/kind/system.slice/kubelet.service", unified: "/kubepods/kind/system.slice/kubelet.service"},
	2010: {comm: "systemd-journal", exe: "/lib/systemd/systemd-journald", ns: nestedNS, cpu: "/kubepods/kind/system.slice/systemd-journald.service", unified: "/kubepods/kind"},
}

// pids are the pids of procs, each followed by the name it was found by.
func pids(procs []Proc) []string {
	var out []string
	for _, p := range procs {
		out = append(out, fmt.Sprintf("%d %s", p.PID, p.Name))
	}
	return out
}

func TestProcs(t *testing.T) {
	procfs := fakeProcfs(t, node)
	tests := map[string]struct {
		names []string
		want  []string
	}{
		// comm systemd-journal is both's: the executable tells them apart.
		"journald_not_journal_upload":   {[]string{"systemd-journald"}, []string{"310 systemd-journald"}},
		"journal_upload_not_journald":   {[]string{"systemd-journal-upload"}, []string{"320 systemd-journal-upload"}},
		"both_sharing_a_comm":           {[]string{"systemd-journal-upload", "systemd-journald"}, []string{"310 systemd-journald", "320 systemd-journal-upload"}},
		"exe_replaced_since_it_started": {[]string{"containerd"}, []string{"700 containerd", "701 containerd", "950 containerd"}},
		// /usr/bin/kubelet -> kubelet-v1.34: the executable is not called kubelet, argv[0] is;
		// the nested node's kubelet, in another PID namespace, is not the host's.
		"argv0_and_not_a_nested_node": {[]string{"kubelet"}, []string{"900 kubelet"}},
		// containerd-shim-runc-v2's comm is containerd-shim, its name is not.
		"comm_alone_is_not_enough": {[]string{"containerd-shim"}, nil},
		"full_name_past_the_comm":  {[]string{"containerd-shim-runc-v2"}, []string{"702 containerd-shim-runc-v2"}},
		// A daemon run by an interpreter has the interpreter's executable and argv[0].
		"interpreted":  {[]string{"tuned"}, nil},
		"listed_twice": {[]string{"crio", "crio"}, []string{"1200 crio"}},
		"none":         {nil, nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := Procs(procfs, tc.names...)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(pids(got), tc.want) {
				t.Errorf("found %v, want %v", pids(got), tc.want)
			}
		})
	}
}

// A start time is the procfs's boot time (now less its uptime) plus the process's ticks.
func TestProcsStartTime(t *testing.T) {
	procfs := fakeProcfs(t, node)
	before := time.Now()
	got, err := Procs(procfs, "kubelet")
	after := time.Now()
	if err != nil || len(got) != 1 {
		t.Fatalf("Procs = %v, %v; want the host's kubelet", pids(got), err)
	}
	// Booted 1000s ago, started 500s (50000 ticks) after.
	if s := got[0].Started; s.Before(before.Add(-500*time.Second)) || s.After(after.Add(-500*time.Second)) {
		t.Errorf("started %v, want 500s before %v", s, before)
	}
}

// Where the namespaces cannot be read (not root), no process is left out for its namespace.
func TestProcsWithoutNamespaces(t *testing.T) {
	procfs := fakeProcfs(t, node)
	if err := os.Remove(filepath.Join(procfs, "1", "ns", "pid")); err != nil {
		t.Fatal(err)
	}
	got, err := Procs(procfs, "kubelet")
	if want := []string{"900 kubelet", "2000 kubelet"}; err != nil || !reflect.DeepEqual(pids(got), want) {
		t.Errorf("Procs = %v, %v; want %v", pids(got), err, want)
	}
}

func TestFind(t *testing.T) {
	procfs := fakeProcfs(t, node)
	tests := map[string]struct {
		v1     bool
		names  []string
		want   []Daemon
		inRoot []string
	}{
		"default_list_on_v1": {
			v1: true, names: Default,
			want: []Daemon{
				{Name: "kubelet", Cgroup: "/system.slice/kubelet.service", PIDs: []int{900}},
				// Two processes in one cgroup are one daemon; the shim (another program) is not it.
				{Name: "containerd", Cgroup: "/system.slice/containerd.service", PIDs: []int{700, 701}},
				{Name: "containerd-1", Cgroup: "/nodectl/t/containerd", PIDs: []int{950}},
				// Its comm is systemd-journal, which journal-upload's is too.
				{Name: "systemd-journald", Cgroup: "/system.slice/systemd-journald.service", PIDs: []int{310}},
			},
			inRoot: []string{"crio"},
		},
		"v2_uses_the_unified_path": {
			names: []string{"systemd"},
			want:  []Daemon{{Name: "systemd", Cgroup: "/init.scope", PIDs: []int{1}}},
		},
		"v1_uses_the_cpu_path": {
			v1: true, names: []string{"systemd"}, inRoot: []string{"systemd"},
		},
		"daemons_sharing_a_cgroup_are_one": {
			v1: true, names: []string{"containerd", "containerd-shim-runc-v2"},
			want: []Daemon{
				{Name: "containerd+containerd-shim-runc-v2", Cgroup: "/system.slice/containerd.service", PIDs: []int{700, 701, 702}},
				{Name: "containerd", Cgroup: "/nodectl/t/containerd", PIDs: []int{950}},
			},
		},
		"none": {v1: true, names: nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, inRoot, err := Find(procfs, &cgroup.Layout{V1: tc.v1}, tc.names)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("found\n %+v\nwant\n %+v", got, tc.want)
			}
			if !reflect.DeepEqual(inRoot, tc.inRoot) {
				t.Errorf("in the root cgroup: %v, want %v", inRoot, tc.inRoot)
			}
		})
	}
}

func TestFindSkipsAProcessThatExited(t *testing.T) {
	procfs := fakeProcfs(t, map[int]proc{42: {comm: "kubelet", exe: "/usr/bin/kubelet", cpu: "/k", unified: "/k"}})
	// Its directory is still listed but its files are gone, as when it exits mid-scan.
	if err := os.Remove(filepath.Join(procfs, "42", "cgroup")); err != nil {
		t.Fatal(err)
	}
	got, _, err := Find(procfs, &cgroup.Layout{V1: true}, []string{"kubelet"})
	if err != nil || len(got) != 0 {
		t.Errorf("Find = %v, %v; want nothing and no error", got, err)
	}
}

// start runs a copy of sleep called name (its executable's name and comm) and returns it.
func start(t *testing.T, name string) *exec.Cmd {
	t.Helper()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep to copy")
	}
	b, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	// argv[0] stays "sleep": a busybox copied under another name would not know itself as sleep.
	cmd := &exec.Cmd{Path: bin, Args: []string{"sleep", "30"}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

// On this host's /proc: a daemon is found by its program's full name, not by another program
// sharing its first 15 bytes, once it runs under that name (exec is not instant). Its start
// time lies between the times taken just before and just after starting it.
func TestProcsOnThisHost(t *testing.T) {
	const name = "nodectl-test-daemond" // comm: nodectl-test-da
	before := time.Now()
	d := start(t, name)
	after := time.Now()
	start(t, "nodectl-test-daemon-upload") // the same comm
	var ps []Proc
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var err error
		if ps, err = Procs("/proc", name); err != nil {
			t.Fatal(err)
		}
		if len(ps) == 1 && ps[0].PID == d.Process.Pid || time.Now().After(deadline) {
			break
		}
	}
	if len(ps) != 1 || ps[0].PID != d.Process.Pid {
		t.Fatalf("Procs(%s) = %v, want pid %d alone", name, pids(ps), d.Process.Pid)
	}
	// Start times have a resolution of 10ms (the tick); a busy machine may delay a read a bit.
	const slack = 100 * time.Millisecond
	if got := ps[0].Started; got.Before(before.Add(-slack)) || got.After(after.Add(slack)) {
		t.Errorf("started %v, want between %v and %v", got, before, after)
	}
	if ps, err := Procs("/proc", "nodectl-test-absent"); err != nil || len(ps) != 0 {
		t.Errorf("Procs of a name nothing runs as: %v, %v", pids(ps), err)
	}
}

func TestPending(t *testing.T) {
	change := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	before, after := Proc{Started: change.Add(-time.Second)}, Proc{Started: change.Add(time.Second)}
	for name, tc := range map[string]struct {
		procs []Proc
		want  bool
	}{
		"none_runs":      {nil, true},
		"older":          {[]Proc{before}, true},
		"started_at_it":  {[]Proc{{Started: change}}, true},
		"newer":          {[]Proc{after}, false},
		"one_newer_of_2": {[]Proc{before, after}, false},
	} {
		if got := Pending(tc.procs, change); got != tc.want {
			t.Errorf("%s: Pending = %v, want %v", name, got, tc.want)
		}
	}
}

func TestParse(t *testing.T) {
	for in, want := range map[string][]string{
		"":                      nil,
		"none":                  nil,
		" kubelet , containerd": {"kubelet", "containerd"},
		"kubelet,containerd,crio,systemd-journald": Default,
	} {
		got, err := Parse(in)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("Parse(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for in, msg := range map[string]string{
		"kubelet,,crio":    "an empty name",
		"/usr/bin/kubelet": "not a program name",
		"kubelet,kubelet":  "listed twice",
	} {
		if _, err := Parse(in); err == nil || !strings.Contains(err.Error(), msg) || !badvalue.Is(err, FieldDaemons) {
			t.Errorf("Parse(%q) error %v, want one naming the daemons setting and saying %q", in, err, msg)
		}
	}
}
