package cgroup

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"testing"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"
)

// nsChildEnv makes the test binary the child of TestProcPathFromAPrivateNamespace: "PID DAEMON
// AGENT", a process outside the child's namespace, its cgroup and the child's as the host names
// them.
const nsChildEnv = "NODECTL_CGROUPNS_CHILD"

// In a container of its own cgroup namespace (the runtimes' default on cgroup v2) the agent
// reads the cgroups of the host's processes relative to its namespace's root
// ("0::/../../system/daemon"), its own as "/": Layout.ProcPath names both as the host does. The
// child is this test binary, moved to its cgroup before it makes its namespace there.
func TestProcPathFromAPrivateNamespace(t *testing.T) {
	if spec := os.Getenv(nsChildEnv); spec != "" {
		inPrivateNamespace(t, spec)
		return
	}
	l, parent := testLayout(t)
	agent, daemon := parent+"/pod/agent", parent+"/system/daemon"
	for _, p := range []string{agent, daemon} {
		if err := l.Create(p, Limits{}); err != nil {
			t.Fatal(err)
		}
	}
	sleep := start(t, "sleep", "60")
	if err := l.AddProc(daemon, sleep.Process.Pid); err != nil {
		t.Fatal(err)
	}
	child := exec.Command(os.Args[0], "-test.run=^TestProcPathFromAPrivateNamespace$", "-test.v")
	child.Env = append(os.Environ(), fmt.Sprintf("%s=%d %s %s", nsChildEnv, sleep.Process.Pid, daemon, agent))
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	child.Stdout, child.Stderr = &out, &out
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	moved := l.AddProc(agent, child.Process.Pid)
	stdin.Close() // the child's go: it is in agent now
	err = child.Wait()
	t.Logf("child:\n%s", out.String())
	if moved != nil {
		t.Fatal(moved)
	}
	if err != nil {
		t.Fatalf("the child in its own namespace: %v", err)
	}
}

func inPrivateNamespace(t *testing.T, spec string) {
	var pid int
	var daemon, agent string
	if _, err := fmt.Sscanf(spec, "%d %s %s", &pid, &daemon, &agent); err != nil {
		t.Fatalf("%s=%q: %v", nsChildEnv, spec, err)
	}
	if _, err := io.Copy(io.Discard, os.Stdin); err != nil {
		t.Fatal(err)
	}
	// A namespace is a thread's: unshared on this one, read from this one.
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		t.Fatalf("unshare(CLONE_NEWCGROUP): %v", err)
	}
	l, err := Detect("/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	p, err := procfs.NewProc(pid)
	if err != nil {
		t.Fatal(err)
	}
	self, err := procfs.Self()
	if err != nil {
		t.Fatal(err)
	}
	rel, err := ProcPath(p, CPU, l.V1)
	if err != nil {
		t.Fatal(err)
	}
	if !outside(rel) {
		t.Fatalf("pid %d reads %s from a namespace rooted at %s: want a path above the root", pid, rel, agent)
	}
	for _, c := range []struct {
		p    procfs.Proc
		want string
	}{{p, daemon}, {self, agent}} {
		read, _ := ProcPath(c.p, CPU, l.V1)
		got, err := l.ProcPath(c.p, CPU)
		t.Logf("pid %d: %s read, %s resolved (%v)", c.p.PID, read, got, err)
		if err != nil || got != c.want {
			t.Errorf("pid %d: ProcPath = %q, %v; want %s", c.p.PID, got, err, c.want)
		}
	}
}
