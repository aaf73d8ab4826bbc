package daemons

import (
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// proc is one process of a fake procfs: its comm and its cgroup paths in a hybrid layout (the
// cpu hierarchy's, the unified one's).
type proc struct {
	comm, cpu, unified string
}

func fakeProcfs(t *testing.T, procs map[int]proc) string {
	t.Helper()
	root := t.TempDir()
	for pid, p := range procs {
		dir := filepath.Join(root, strconv.Itoa(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		cg := strings.Join([]string{
			"9:name=systemd:" + p.unified,
			"4:memory:/elsewhere",
			"2:cpu,cpuacct:" + p.cpu,
			"0::" + p.unified,
		}, "\n") + "\n"
		for file, body := range map[string]string{"comm": p.comm + "\n", "cgroup": cg} {
			if err := os.WriteFile(filepath.Join(dir, file), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Not a process: skipped.
	if err := os.WriteFile(filepath.Join(root, "uptime"), []byte("1 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

func TestFind(t *testing.T) {
	procfs := fakeProcfs(t, map[int]proc{
		1:    {"systemd", "/", "/init.scope"},
		310:  {"systemd-journal", "/system.slice/systemd-journald.service", "/system.slice/systemd-journald.service"},
		700:  {"containerd", "/system.slice/containerd.service", "/system.slice/containerd.service"},
		701:  {"containerd", "/system.slice/containerd.service", "/system.slice/containerd.service"},
		702:  {"containerd-shim", "/system.slice/containerd.service", "/system.slice/containerd.service"},
		900:  {"kubelet", "/system.slice/kubelet.service", "/system.slice/kubelet.service"},
		950:  {"containerd", "/nodectl/t/containerd", "/nodectl/t/containerd"},
		1200: {"crio", "/", "/"},
		1300: {"dockerd", "/system.slice/docker.service", "/system.slice/docker.service"},
	})
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
				// Two processes in one cgroup are one daemon; the shim (another comm) is not it.
				{Name: "containerd", Cgroup: "/system.slice/containerd.service", PIDs: []int{700, 701}},
				{Name: "containerd-1", Cgroup: "/nodectl/t/containerd", PIDs: []int{950}},
				// Found by its comm, truncated to 15 characters by the kernel.
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
			v1: true, names: []string{"containerd", "containerd-shim"},
			want: []Daemon{
				{Name: "containerd+containerd-shim", Cgroup: "/system.slice/containerd.service", PIDs: []int{700, 701, 702}},
				{Name: "containerd", Cgroup: "/nodectl/t/containerd", PIDs: []int{950}},
			},
		},
		"none": {v1: true, names: nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, inRoot, err := Find(procfs, tc.v1, tc.names)
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
	procfs := fakeProcfs(t, map[int]proc{42: {"kubelet", "/k", "/k"}})
	// Its directory is still listed but its files are gone, as when it exits mid-scan.
	if err := os.Remove(filepath.Join(procfs, "42", "cgroup")); err != nil {
		t.Fatal(err)
	}
	got, _, err := Find(procfs, true, []string{"kubelet"})
	if err != nil || len(got) != 0 {
		t.Errorf("Find = %v, %v; want nothing and no error", got, err)
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
		"/usr/bin/kubelet": "not a command name",
		"kubelet,kubelet":  "listed twice",
	} {
		if _, err := Parse(in); err == nil || !strings.Contains(err.Error(), msg) || !strings.Contains(err.Error(), "--daemons") {
			t.Errorf("Parse(%q) error %v, want one naming --daemons and saying %q", in, err, msg)
		}
	}
}
