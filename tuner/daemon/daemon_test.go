package daemon

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// start runs a copy of sleep called name and returns it once it runs under that name.
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
	cmd := exec.Command(bin, "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

// find waits until Find returns pids' processes (and no other) or 5s pass.
func find(t *testing.T, name string, pid int) []Proc {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ps, err := Find("/proc", name)
		if err != nil {
			t.Fatal(err)
		}
		if len(ps) == 1 && ps[0].PID == pid || time.Now().After(deadline) {
			return ps
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A daemon is found by its name cut to 15 bytes and its program's full name: a program
// whose name shares the first 15 bytes is not it. Its start time lies between the times taken
// just before and just after starting it.
func TestFind(t *testing.T) {
	const name = "nodectl-test-daemond" // comm: nodectl-test-da
	before := time.Now()
	d := start(t, name)
	after := time.Now()
	start(t, "nodectl-test-daemon-upload") // the same comm
	ps := find(t, name, d.Process.Pid)
	if len(ps) != 1 || ps[0].PID != d.Process.Pid {
		t.Fatalf("Find(%s) = %v, want pid %d alone", name, ps, d.Process.Pid)
	}
	// Start times have a resolution of 10ms (the tick); a busy machine may delay a read a bit.
	// /proc/stat's boot time, whole seconds, could be a second off.
	const slack = 100 * time.Millisecond
	if got := ps[0].Started; got.Before(before.Add(-slack)) || got.After(after.Add(slack)) {
		t.Errorf("started %v, want between %v and %v", got, before, after)
	}
	if ps, err := Find("/proc", "nodectl-test-absent"); err != nil || len(ps) != 0 {
		t.Errorf("Find of a name nothing runs as: %v, %v", ps, err)
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
