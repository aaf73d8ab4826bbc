package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodectl/nodectl/agent/cgroup"
	"github.com/nodectl/nodectl/agentd"
	"github.com/nodectl/nodectl/analyzer"
)

// startAgent runs `nodectl agent` on a data directory and a socket of the test's own, with
// short incident windows, and waits until it answers. It is stopped (SIGTERM) at cleanup if the
// test has not stopped it.
func startAgent(t *testing.T, dataDir string, extra ...string) (sock, logPath string, stop func()) {
	t.Helper()
	// Short: a unix socket's path must fit in 108 bytes.
	dir, err := os.MkdirTemp("", "nodectl-agent-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock = filepath.Join(dir, "a.sock")
	logPath = filepath.Join(t.TempDir(), "agent.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"agent", "--data-dir", dataDir, "--socket", sock}, extra...)
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), beMain+"=1")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("agent exited with %v", err)
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("agent did not stop within 30s of SIGTERM")
		}
		log, _ := os.ReadFile(logf.Name())
		t.Logf("agent log:\n%s", log)
	}
	t.Cleanup(stop)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if _, err := nodectl(t, "agent", "status", "--socket", sock); err == nil {
			return sock, logPath, stop
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent did not answer on %s within 30s", sock)
		}
	}
}

// spin starts a shell loop in cg: busy when busy, else a task waking every 10 ms for a little
// work, as a latency-sensitive service does.
func spin(t *testing.T, layout *cgroup.Layout, cg string, busy bool) {
	t.Helper()
	script := `read go; while :; do sleep 0.01; i=0; while [ $i -lt 300 ]; do i=$((i+1)); done; done`
	if busy {
		script = `read go; while :; do :; done`
	}
	cmd := exec.Command("sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	if err := layout.AddProc(cg, cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(stdin)
}

// testCgroups makes cgroups below /nodectl/<name> and removes them at cleanup.
func testCgroups(t *testing.T, layout *cgroup.Layout, name string, leaves map[string]cgroup.Limits) string {
	t.Helper()
	root := fmt.Sprintf("%s/%s-%d", cgroup.Parent, name, os.Getpid())
	for leaf, lim := range leaves {
		if err := layout.Create(root+"/"+leaf, lim); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		// Registered before the processes' cleanups: it runs after they are killed.
		for leaf := range leaves {
			if err := layout.Remove(root + "/" + leaf); err != nil {
				t.Error(err)
			}
		}
		if err := layout.Prune(cgroup.Parent); err != nil {
			t.Error(err)
		}
	})
	return root
}

// A victim with the smallest CPU weight (a BestEffort pod's) next to two CPU hogs, with no
// stress run: the agent opens a run-queue stall incident on the victim, analyzes it, and the
// findings name the hogs, through its API and, once it is stopped, from its data directory.
func TestAgentIncidentNamesTheHogs(t *testing.T) {
	requireRoot(t)
	layout, err := cgroup.Detect("/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	root := testCgroups(t, layout, "test-agent", map[string]cgroup.Limits{
		"victim": {CPURequestMilli: 1}, "hog-0": {}, "hog-1": {},
	})
	victim, hogs := root+"/victim", []string{root + "/hog-0", root + "/hog-1"}
	dataDir := filepath.Join(t.TempDir(), "agent")
	sock, _, stop := startAgent(t, dataDir, "--incident-before", "4s", "--incident-after", "8s", "--incident-baseline", "8s",
		"--trigger-runq-stall", "500ms")
	spin(t, layout, victim, false)
	time.Sleep(10 * time.Second) // the quiet baseline
	for _, h := range hogs {
		spin(t, layout, h, true)
	}

	var in agentd.Incident
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(time.Second) {
		out, err := nodectl(t, "agent", "incidents", "--socket", sock, "-o", "json")
		if err != nil {
			t.Fatal(err)
		}
		var list []agentd.Incident
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(list, func(in agentd.Incident) bool {
			return in.Trigger == agentd.TriggerRunqStall && in.Cgroup == victim && in.State == agentd.StateClosed
		})
		if i >= 0 {
			in = list[i]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no analyzed run-queue stall incident on %s within 90s: %s", victim, out)
		}
	}
	var live analyzer.Report
	if err := json.Unmarshal(in.Report, &live); err != nil {
		t.Fatalf("incident %s: %v (%s)", in.ID, err, in.AnalysisError)
	}
	assertNamesHogs(t, "the agent's analysis", live, victim, hogs)

	stop()
	out, err := nodectl(t, "postmortem", "--data-dir", dataDir, "--incident", in.ID, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var offline analyzer.Report
	if err := json.Unmarshal([]byte(out), &offline); err != nil {
		t.Fatal(err)
	}
	assertNamesHogs(t, "postmortem --data-dir", offline, victim, hogs)
}

// assertNamesHogs wants cpu-contention on the victim with a hog among its culprits and no
// culprit that is not a hog or the node's own work.
func assertNamesHogs(t *testing.T, what string, rep analyzer.Report, victim string, hogs []string) {
	t.Helper()
	i := slices.IndexFunc(rep.Findings, func(f analyzer.Finding) bool {
		return f.ID == analyzer.IDCPUContention && f.Victim == victim
	})
	if i < 0 {
		b, _ := json.MarshalIndent(rep, "", "  ")
		t.Fatalf("%s: no cpu-contention on %s:\n%s", what, victim, b)
	}
	f := rep.Findings[i]
	named := 0
	for _, c := range f.Culprits {
		if slices.Contains(hogs, c) {
			named++
		} else if !strings.HasPrefix(c, "/") || strings.HasPrefix(c, cgroup.Parent+"/") {
			t.Errorf("%s: culprit %q is neither a hog nor the node's own", what, c)
		}
	}
	if named == 0 {
		t.Errorf("%s: culprits %v name no hog of %v: %s", what, f.Culprits, hogs, f.Summary)
	}
	t.Logf("%s: %s", what, f.Summary)
}

// A stress run on a node where the agent runs loads its own tracer beside the agent's (both
// trace, docs/agent.md): it still finds its hogs, and the agent, which saw the same hogs,
// keeps running and answering.
func TestStressRunBesideTheAgent(t *testing.T) {
	requireRoot(t)
	sock, _, stop := startAgent(t, filepath.Join(t.TempDir(), "agent"))
	rep, _ := noisyRun(t, "--hog", "cpu,count=2")
	i, ok := finding(rep, "cpu-contention")
	if !ok {
		t.Fatalf("beside the agent, no cpu-contention finding; got %v", rep.ids())
	}
	for _, hog := range []string{"cpu-hog-0", "cpu-hog-1"} {
		if !slices.Contains(rep.Findings[i].Culprits, hog) {
			t.Errorf("beside the agent, cpu-contention culprits %v do not name %s", rep.Findings[i].Culprits, hog)
		}
	}
	out, err := nodectl(t, "agent", "status", "--socket", sock, "-o", "json")
	if err != nil {
		t.Fatalf("the agent stopped answering during the run: %v", err)
	}
	var st struct {
		Tracer map[string]string `json:"tracer"`
		Store  struct {
			Writable bool `json:"writable"`
		} `json:"store"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatal(err)
	}
	for prog, s := range st.Tracer {
		if s != "attached" {
			t.Errorf("agent's %s: %s after the run", prog, s)
		}
	}
	if !st.Store.Writable {
		t.Errorf("agent's store not writable after the run: %s", out)
	}
	stop()
}
