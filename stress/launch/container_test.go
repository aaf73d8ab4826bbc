package launch

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/stress/workload"
)

// Each runtime runs the test binary as a workload in its cgroup: the workload's output and its
// input pass through the runtime, its host processes are in the cgroup with their roles, its CPU
// quota is the one nodectl set, and stopping and closing leave no container, process, cgroup,
// mount or state behind.
func TestContainerRuntimes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates cgroups and containers")
	}
	for _, rt := range []Runtime{RuntimeRunc, RuntimeRunsc} {
		t.Run(string(rt), func(t *testing.T) {
			if _, err := exec.LookPath(string(rt)); err != nil {
				t.Fatalf("%s is not installed; .ci/run installs it", rt)
			}
			testRuntime(t, rt)
		})
	}
}

func testRuntime(t *testing.T, rt Runtime) {
	layout, err := cgroup.Detect("/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	parent := "/nodectl/test-launch-" + hex.EncodeToString(b)
	cg := parent + "/w"
	t.Cleanup(func() {
		if err := layout.Remove(parent); err != nil {
			t.Error(err)
		}
		_ = layout.Prune("/nodectl")
	})
	lim := cgroup.Limits{CPUMilli: 500}
	if err := layout.Create(cg, lim); err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	mount := filepath.Join(t.TempDir(), "data")
	l, err := New(Config{Runtime: rt, Exe: os.Args[0], Cgroups: layout, StateDir: filepath.Join(state, "rt")})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = l.Close()
		}
	})
	if rt == RuntimeRunsc && !strings.Contains(l.Describe(), "platform ") {
		t.Errorf("Describe() = %q, want the gVisor platform named", l.Describe())
	}

	t.Setenv(childEnv, "1")
	t.Setenv(childEchoEnv, "1")
	t.Setenv(childMountEnv, mount)
	got := make(chan workload.Measurement, 4)
	p, err := l.Start(Spec{Name: "w", Cgroup: cg, Limits: lim, Args: nil, Mounts: []string{mount},
		Stdin: strings.NewReader("hello\n"), Log: os.Stderr}, func(_ string, m workload.Measurement) { got <- m })
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"started": false, "echo": false}
	deadline := time.After(60 * time.Second)
	for slices.Contains(mapsValues(want), false) {
		select {
		case m := <-got:
			want[m.Metric] = true
			if m.Metric == "echo" && m.Value != float64(len("hello")) {
				t.Errorf("the workload read %v bytes of its input, want %d", m.Value, len("hello"))
			}
		case <-p.Done():
			t.Fatalf("the workload exited early: %v", p.Err())
		case <-deadline:
			t.Fatalf("measurements never arrived through %s: %v", rt, want)
		}
	}
	// The workload wrote a file in the mounted directory, visible on the host.
	if _, err := os.Stat(filepath.Join(mount, "written")); err != nil {
		t.Errorf("the file the workload wrote in its mount is not on the host: %v", err)
	}

	procs, err := l.HostProcesses(cg)
	if err != nil {
		t.Fatal(err)
	}
	roles := map[string]int{}
	for _, hp := range procs {
		roles[hp.Role]++
	}
	t.Logf("%s host processes: %+v", rt, procs)
	switch rt {
	case RuntimeRunsc:
		// The whole sandbox is in the workload's cgroup: the Sentry, the gofer and the stubs.
		if roles[RoleSandbox] != 1 || roles[RoleGofer] != 1 || roles[RoleStub] == 0 {
			t.Errorf("runsc roles in the cgroup = %v, want one sandbox, one gofer and stubs", roles)
		}
	case RuntimeRunc:
		if roles[RoleProcess] == 0 {
			t.Errorf("runc container has no process in its cgroup: %v", procs)
		}
	}
	if layout.V1 {
		q, err := os.ReadFile(filepath.Join(layout.Root, "cpu", cg, "cpu.cfs_quota_us"))
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(string(q)) != "50000" {
			t.Errorf("cpu.cfs_quota_us = %s after %s joined the cgroup, want 50000", q, rt)
		}
	}

	p.Stop(10 * time.Second)
	if err := p.Err(); err != nil {
		t.Errorf("the container stopped by SIGTERM exited with %v", err)
	}
	if pids, _ := layout.Procs(cg); len(pids) != 0 {
		t.Errorf("processes left in the cgroup after Stop: %v", pids)
	}
	root := RuntimeRoot(filepath.Join(state, "rt"), rt)
	if out, _ := exec.Command(string(rt), "--root", root, "list", "-q").Output(); strings.TrimSpace(string(out)) != "" {
		t.Errorf("%s still lists containers after Stop: %s", rt, out)
	}
	if err := l.Close(); err != nil {
		t.Error(err)
	}
	closed = true
	if _, err := os.Stat(filepath.Join(state, "rt")); !os.IsNotExist(err) {
		t.Errorf("runtime state left after Close: %v", err)
	}
	if n := mountsUnder(t, state); n != 0 {
		t.Errorf("%d mounts left under %s", n, state)
	}
}

// A container launcher refuses a dynamically linked nodectl, naming the way out.
func TestContainerNeedsStaticBinary(t *testing.T) {
	// A dynamic binary to stand for a cgo-built nodectl: Debian's sh or runc (a busybox machine's
	// sh, as make test-vm's guest has, is static).
	dynamic := ""
	for _, name := range []string{"sh", "runc"} {
		if p, err := exec.LookPath(name); err == nil && checkStatic(p) != nil {
			dynamic = p
			break
		}
	}
	if dynamic == "" {
		t.Skip("no dynamically linked sh or runc here to stand for a dynamic binary")
	}
	if err := checkStatic(dynamic); err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Errorf("checkStatic(%s) = %v, want a refusal naming CGO_ENABLED=0", dynamic, err)
	}
	if err := checkStatic(os.Args[0]); err != nil {
		t.Errorf("the test binary must be static for the container tests (make test sets CGO_ENABLED=0): %v", err)
	}
}

func TestParseRuntime(t *testing.T) {
	if _, err := ParseRuntime("docker"); err == nil || !strings.Contains(err.Error(), "process, runc, runsc") {
		t.Errorf("ParseRuntime(docker) = %v, want the allowed runtimes named", err)
	}
	if r, err := ParseRuntime("runsc"); err != nil || r != RuntimeRunsc {
		t.Errorf("ParseRuntime(runsc) = %v, %v", r, err)
	}
}

func mountsUnder(t *testing.T, dir string) int {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 4 && strings.HasPrefix(fields[4], dir) {
			n++
		}
	}
	return n
}

func mapsValues(m map[string]bool) []bool {
	var v []bool
	for _, b := range m {
		v = append(v, b)
	}
	return v
}
