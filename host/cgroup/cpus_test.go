//go:build linux

package cgroup

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// A workload placed on CPU 1 runs only there, as a pod does under a kubelet with CPU 0
// reserved for the system.
func TestCreateSetsCPUs(t *testing.T) {
	l, parent := testLayout(t)
	if readTrim(t, "/sys/devices/system/cpu/online") == "0" {
		t.Skip("needs two CPUs")
	}
	path := parent + "/pinned"
	if err := l.Create(path, Limits{CPUs: "1"}); err != nil {
		t.Fatal(err)
	}
	if got := readTrim(t, filepath.Join(l.Dir("cpuset", path), "cpuset.cpus")); got != "1" {
		t.Errorf("cpuset.cpus %q, want 1", got)
	}
	cmd := start(t, "sleep", "30")
	if err := l.AddProc(path, cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	status := readTrim(t, filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid), "status"))
	if !strings.Contains(status, "Cpus_allowed_list:\t1\n") {
		t.Errorf("process is not confined to CPU 1:\n%s", status)
	}
}
