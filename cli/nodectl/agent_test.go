package main

import (
	"context"
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

	"github.com/nodectl/nodectl/agent"
	"github.com/nodectl/nodectl/agent/recorded"
	"github.com/nodectl/nodectl/analyzer"
	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/internal/browsertest"
	"github.com/nodectl/nodectl/rundir"
)

// agentProc is a `nodectl agent` the test started.
type agentProc struct {
	sock, log string
	cmd       *exec.Cmd
	done      chan error
	stopped   bool
}

// startAgent runs `nodectl agent` on a data directory and a socket of the test's own and waits
// until it answers. It is stopped (SIGTERM) at cleanup if the test has not stopped it.
func startAgent(t *testing.T, dataDir string, extra ...string) *agentProc {
	t.Helper()
	// Short: a unix socket's path must fit in 108 bytes.
	dir, err := os.MkdirTemp("", "nodectl-agent-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return startAgentAt(t, filepath.Join(dir, "a.sock"), dataDir, extra...)
}

// startAgentAt is startAgent with the socket's path given.
func startAgentAt(t *testing.T, sock, dataDir string, extra ...string) *agentProc {
	t.Helper()
	a := &agentProc{sock: sock, log: filepath.Join(t.TempDir(), "agent.log"), done: make(chan error, 1)}
	logf, err := os.Create(a.log)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	args := append([]string{"agent", "--data-dir", dataDir, "--socket", a.sock}, extra...)
	a.cmd = exec.Command(os.Args[0], args...)
	a.cmd.Env = append(os.Environ(), beMain+"=1")
	a.cmd.Stdout, a.cmd.Stderr = logf, logf
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { a.done <- a.cmd.Wait() }()
	t.Cleanup(func() { a.stop(t) })
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if _, err := nodectl(t, "agent", "status", "--socket", a.sock); err == nil {
			return a
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(a.log)
			t.Fatalf("the agent did not answer on %s within 30s:\n%s", a.sock, log)
		}
	}
}

// stop ends the agent as its service manager would (SIGTERM) and wants a clean exit.
func (a *agentProc) stop(t *testing.T) {
	t.Helper()
	if a.stopped {
		return
	}
	a.stopped = true
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-a.done:
		if err != nil {
			t.Errorf("agent exited with %v", err)
		}
	case <-time.After(30 * time.Second):
		_ = a.cmd.Process.Kill()
		t.Errorf("agent did not stop within 30s of SIGTERM")
	}
	log, _ := os.ReadFile(a.log)
	t.Logf("agent log:\n%s", log)
}

// kill ends the agent with SIGKILL, as an OOM kill or a node's crash would.
func (a *agentProc) kill() {
	if !a.stopped {
		a.stopped = true
		_ = a.cmd.Process.Kill()
		<-a.done
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
		if err := layout.Remove(root); err != nil {
			t.Error(err)
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
	ag := startAgent(t, dataDir, "--incident-before", "4s", "--incident-after", "8s", "--incident-baseline", "8s",
		"--trigger-runq-stall", "250ms") // fires from 268 ms
	sock := ag.sock
	spin(t, layout, victim, false)
	time.Sleep(10 * time.Second) // the quiet baseline
	for _, h := range hogs {
		spin(t, layout, h, true)
	}

	in := waitIncident(t, sock, agent.TriggerRunqStall, victim, 90*time.Second)
	if in.Report == nil {
		t.Fatalf("incident %s has no report (%s)", in.ID, in.AnalysisError)
	}
	assertNamesHogs(t, "the agent's analysis", *in.Report, victim, hogs)

	// The same window asked for by time, through the agent, and exported for offline analysis.
	window := []string{"--from", in.WindowFrom.Format(time.RFC3339Nano), "--to", in.WindowTo.Format(time.RFC3339Nano),
		"--baseline", in.WindowFrom.Sub(in.BaselineFrom).String(), "--cgroup", victim}
	out, err := nodectl(t, append([]string{"analyze", "--socket", sock, "-o", "json"}, window...)...)
	if err != nil {
		t.Fatal(err)
	}
	assertNamesHogs(t, "analyze --from --to", decodeReport(t, out), victim, hogs)
	exported := filepath.Join(t.TempDir(), "export")
	if _, err := nodectl(t, append([]string{"agent", "export", "--socket", sock, "--out", exported}, window...)...); err != nil {
		t.Fatal(err)
	}
	if out, err = nodectl(t, "analyze", exported, "-o", "json"); err != nil {
		t.Fatal(err)
	}
	assertNamesHogs(t, "analyze of an export", decodeReport(t, out), victim, hogs)

	ag.stop(t)
	if out, err = nodectl(t, "postmortem", "--data-dir", dataDir, "--incident", in.ID, "-o", "json"); err != nil {
		t.Fatal(err)
	}
	assertNamesHogs(t, "postmortem --data-dir", decodeReport(t, out), victim, hogs)

	t.Run("html", func(t *testing.T) {
		html := filepath.Join(t.TempDir(), "postmortem.html")
		if _, err := nodectl(t, "postmortem", "--data-dir", dataDir, "--incident", in.ID, "--html", html); err != nil {
			t.Fatal(err)
		}
		page := browsertest.Open(t, html, "report-postmortem")
		for _, p := range page.Problems {
			t.Errorf("chromium: %s", p)
		}
		var hogWait float64
		for key, v := range page.Bars {
			for _, h := range hogs {
				if strings.HasPrefix(key, "culprits-") && strings.HasSuffix(key, "/"+h) {
					hogWait += v
				}
			}
		}
		if hogWait <= 0 {
			t.Errorf("the post-mortem's page charges no run-queue wait to a hog: %v", page.Bars)
		}
	})
}

func decodeReport(t *testing.T, out string) analyzer.Report {
	t.Helper()
	var rep analyzer.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	return rep
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
	ag := startAgent(t, filepath.Join(t.TempDir(), "agent"))
	sock := ag.sock
	rep, _ := noisyRun(t, "--hog", "cpu,count=2")
	i, ok := finding(rep, "cpu-contention")
	if !ok {
		t.Fatalf("beside the agent, no cpu-contention finding; %s", rep.said())
	}
	for _, hog := range []string{"cpu-hog-0", "cpu-hog-1"} {
		if !slices.Contains(rep.Findings[i].Culprits, hog) {
			t.Errorf("beside the agent, cpu-contention culprits %v do not name %s", rep.Findings[i].Culprits, hog)
		}
	}
	checkRecording(t, sock, "after the run")
	ag.stop(t)
}

// storeSpan is the flight recorder's span as `agent status -o json` gives it.
func storeSpan(t *testing.T, sock string) (oldest, newest time.Time, torn int) {
	t.Helper()
	out, err := nodectl(t, "agent", "status", "--socket", sock, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Store struct {
			Oldest, Newest time.Time
			TornBytes      string `json:"tornBytes"`
		} `json:"store"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	fmt.Sscan(st.Store.TornBytes, &torn)
	return st.Store.Oldest, st.Store.Newest, torn
}

// An agent killed with SIGKILL mid-writes and started again on its data directory keeps what
// it had recorded, replaces its stale socket, and records on.
func TestAgentKilledKeepsItsRecord(t *testing.T) {
	requireRoot(t)
	dataDir := filepath.Join(t.TempDir(), "agent")
	first := startAgent(t, dataDir, "--interval", "100ms")
	time.Sleep(3 * time.Second)
	oldest, newest, _ := storeSpan(t, first.sock)
	first.kill()
	if oldest.IsZero() || !newest.After(oldest) {
		t.Fatalf("the agent recorded nothing in 3s: %s to %s", oldest, newest)
	}
	// The same socket path: the killed agent's socket is stale, the new agent must take it.
	second := startAgentAt(t, first.sock, dataDir, "--interval", "100ms")
	time.Sleep(time.Second)
	oldest2, newest2, torn := storeSpan(t, second.sock)
	t.Logf("before the kill %s to %s; after the restart %s to %s, %d torn bytes cut", oldest.Format(time.StampMilli),
		newest.Format(time.StampMilli), oldest2.Format(time.StampMilli), newest2.Format(time.StampMilli), torn)
	if !oldest2.Equal(oldest) {
		t.Errorf("after the restart the record starts at %s, not %s", oldest2, oldest)
	}
	if !newest2.After(newest) {
		t.Errorf("after the restart the record ends at %s, not after the kill's %s", newest2, newest)
	}
	out, err := nodectl(t, "analyze", "--socket", second.sock, "--from", oldest.Add(time.Second).Format(time.RFC3339Nano),
		"--to", newest.Format(time.RFC3339Nano), "--baseline", "1s", "-o", "json")
	if err != nil {
		t.Fatalf("the window before the kill cannot be analyzed: %v", err)
	}
	decodeReport(t, out)
	second.stop(t)
}

// storeState is whether the agent's store takes writes, and how many failed.
func storeState(t *testing.T, sock string) (writable bool, failures int) {
	t.Helper()
	out, err := nodectl(t, "agent", "status", "--socket", sock, "-o", "json")
	if err != nil {
		t.Fatalf("the agent stopped answering: %v", err)
	}
	var st struct {
		Store struct {
			Writable      bool   `json:"writable"`
			WriteFailures string `json:"writeFailures"`
		} `json:"store"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	fmt.Sscan(st.Store.WriteFailures, &failures)
	return st.Store.Writable, failures
}

// On a full disk the agent keeps tracing and answering, says its store is not writable, and
// writes again once there is room.
func TestAgentOnAFullDisk(t *testing.T) {
	requireRoot(t)
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=4m", "nodectl-test", mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", mnt, err, out)
		}
	})
	ag := startAgent(t, filepath.Join(mnt, "agent"), "--interval", "100ms")
	filler := filepath.Join(mnt, "filler")
	// dd stops at ENOSPC: the tmpfs is then full.
	_ = exec.Command("dd", "if=/dev/zero", "of="+filler, "bs=64k").Run()
	var failures int
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		writable, n := storeState(t, ag.sock)
		if !writable && n > 0 {
			failures = n
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("20s on a full disk and the store says writable=%v with %d failures", writable, n)
		}
	}
	// Sampling goes on meanwhile: a watcher gets the samples the store could not keep.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	watch := exec.CommandContext(ctx, os.Args[0], "agent", "watch", "--socket", ag.sock, "--metric", rundir.MetricVmstat)
	watch.Env = append(os.Environ(), beMain+"=1")
	if out, _ := watch.Output(); !strings.Contains(string(out), rundir.MetricVmstat) {
		t.Errorf("on a full disk a watcher got no samples in 2s: %q", out)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if writable, _ := storeState(t, ag.sock); writable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("20s after room was made the store still does not write")
		}
	}
	t.Logf("%d write failures while the disk was full; writing again", failures)
	ag.stop(t)
}

// waitIncident polls the agent until it has an analyzed incident of trigger in cgroup.
func waitIncident(t *testing.T, sock, trigger, cg string, within time.Duration) recorded.Incident {
	t.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(time.Second) {
		out, err := nodectl(t, "agent", "incidents", "--socket", sock, "-o", "json")
		if err != nil {
			t.Fatal(err)
		}
		var list []recorded.Incident
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(list, func(in recorded.Incident) bool {
			return in.Trigger == trigger && in.Cgroup == cg && in.State == recorded.StateClosed
		})
		if i >= 0 {
			return list[i]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no analyzed %s incident on %s within %s: %s", trigger, cg, within, out)
		}
	}
}

// outgrow runs shell (a path, or a name on PATH) in cgroup cg, whose memory limit is 32 MiB,
// to build a 64 MiB string, and wants it OOM-killed.
func outgrow(t *testing.T, layout *cgroup.Layout, cg, shell string) {
	t.Helper()
	cmd := exec.Command(shell, "-c", `read go; x=$(head -c 67108864 /dev/zero | tr '\0' x); echo ${#x}`)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// In the cgroup before it allocates: it waits for a line on its standard input.
	if err := layout.AddProc(cg, cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(stdin)
	if err := cmd.Wait(); err == nil {
		t.Fatalf("%s in %s was not OOM-killed", shell, cg)
	}
}

// A process that outgrows its cgroup's memory limit is OOM-killed: the agent opens an oom_kill
// incident on that cgroup and its analysis finds the kill.
func TestAgentOOMKillIncident(t *testing.T) {
	requireRoot(t)
	layout, err := cgroup.Detect("/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	root := testCgroups(t, layout, "test-agent-oom", map[string]cgroup.Limits{"greedy": {MemoryBytes: 32 << 20, NoSwap: true}})
	greedy := root + "/greedy"
	ag := startAgent(t, filepath.Join(t.TempDir(), "agent"), "--incident-before", "2s", "--incident-after", "4s", "--incident-baseline", "4s")
	time.Sleep(5 * time.Second)
	outgrow(t, layout, greedy, "sh")
	in := waitIncident(t, ag.sock, agent.TriggerOOMKill, greedy, 60*time.Second)
	t.Logf("incident %s: %s", in.ID, in.Evidence)
	if in.Report == nil {
		t.Fatalf("incident %s has no report (%s)", in.ID, in.AnalysisError)
	}
	rep := *in.Report
	if !slices.ContainsFunc(rep.Findings, func(f analyzer.Finding) bool { return f.ID == analyzer.IDOOMKill }) {
		b, _ := json.MarshalIndent(rep, "", "  ")
		t.Errorf("the OOM kill incident's analysis has no %s finding:\n%s", analyzer.IDOOMKill, b)
	}
	ag.stop(t)
}

// checkRecording wants the agent on sock answering, every program attached and its store
// writable.
func checkRecording(t *testing.T, sock, when string) {
	t.Helper()
	out, err := nodectl(t, "agent", "status", "--socket", sock, "-o", "json")
	if err != nil {
		t.Fatalf("the agent does not answer %s: %v", when, err)
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
	if len(st.Tracer) == 0 {
		t.Errorf("agent's status names no program %s: %s", when, out)
	}
	for prog, s := range st.Tracer {
		if s != "attached" {
			t.Errorf("agent's %s: %s %s", prog, s, when)
		}
	}
	if !st.Store.Writable {
		t.Errorf("agent's store not writable %s: %s", when, out)
	}
}
