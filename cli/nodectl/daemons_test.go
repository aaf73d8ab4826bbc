package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/rundir"
)

// startContainerd runs a private containerd (its own root, state and socket; no CRI plugin) in
// cgroup cg, from its first instruction on, and returns its socket. It is killed and its
// directories removed when the test ends.
func startContainerd(t *testing.T, layout *cgroup.Layout, cg string) string {
	t.Helper()
	bin, err := exec.LookPath("containerd")
	if err != nil {
		t.Skip("containerd is not installed (apt-get install containerd; .ci/run installs it)")
	}
	// Short: a unix socket's path must fit in 108 bytes.
	dir, err := os.MkdirTemp("", "nodectl-ctrd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "containerd.sock")
	config := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock)
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	// The shell waits in the cgroup until it is placed, then becomes containerd.
	cmd := exec.Command("sh", "-c", `read go && exec "$0" --config "$1"`, bin, filepath.Join(dir, "config.toml"))
	cmd.Stdout, cmd.Stderr = logf, logf
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
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			return sock
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logf.Name())
			t.Fatalf("containerd did not open %s in 15s:\n%s", sock, log)
		}
	}
}

// cpuLimit is cg's CPU quota as its cgroup file says it.
func cpuLimit(t *testing.T, layout *cgroup.Layout, cg string) string {
	t.Helper()
	file := filepath.Join(layout.Dir(cgroup.Unified, cg), "cpu.max")
	if layout.V1 {
		file = filepath.Join(layout.Dir("cpu", cg), "cpu.cfs_quota_us")
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestNoisyFollowsAContainerd(t *testing.T) {
	requireRoot(t)
	layout, err := cgroup.Detect("/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	parent := fmt.Sprintf("%s/test-daemons-%d", cgroup.Parent, os.Getpid())
	cg := parent + "/containerd"
	// A limit the run must leave as it is: it never creates or limits a daemon's cgroup.
	if err := layout.Create(cg, cgroup.Limits{CPUMilli: 1500}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := layout.Remove(parent); err != nil {
			t.Error(err)
		}
		if err := layout.Prune(cgroup.Parent); err != nil {
			t.Error(err)
		}
	})
	limit := cpuLimit(t, layout, cg)
	sock := startContainerd(t, layout, cg)

	// Requests keep containerd waking up in both phases, as a kubelet's would.
	stop := make(chan struct{})
	poked := make(chan struct{})
	go func() {
		defer close(poked)
		for tick := time.NewTicker(100 * time.Millisecond); ; {
			select {
			case <-stop:
				tick.Stop()
				return
			case <-tick.C:
				if c, err := net.Dial("unix", sock); err == nil {
					c.Close()
				}
			}
		}
	}()
	rep, run := noisyRun(t, "--baseline", "4s", "--duration", "6s", "--hog", "cpu,count=2", "--daemons", "containerd")
	close(stop)
	<-poked

	var daemon rundir.Workload
	for _, w := range run.Meta.Workloads {
		if w.Kind == "daemon" && w.Cgroup == cg {
			daemon = w
		}
	}
	if !strings.HasPrefix(daemon.Name, "containerd") {
		t.Fatalf("meta.json lists no containerd daemon in %s: %+v", cg, run.Meta.Workloads)
	}
	runq := run.Series(rundir.MetricRunqLatency).Cgroup(cg)
	for _, phase := range []string{rundir.PhaseBaseline, rundir.PhaseStress} {
		w, _ := run.Phase(phase)
		h := runq.HistDelta(w)
		t.Logf("%s %s: %d run-queue waits, p99 %.2fms, %.1fms waited per second", daemon.Name, phase,
			h.Count, h.Quantile(0.99)*1e3, float64(h.SumNs)/1e6/w.Seconds())
		if h.Count == 0 {
			t.Errorf("no run-queue waits of %s (%s) recorded in the %s phase", daemon.Name, cg, phase)
		}
	}
	if len(run.Series(rundir.MetricCPUUsage).Cgroup(cg)) == 0 {
		t.Errorf("the cgroup sampler recorded no CPU usage of %s (%s)", daemon.Name, cg)
	}
	// Whether it starved depends on what else the machine runs: said, not asserted.
	for _, f := range rep.Findings {
		if f.ID == "system-daemon-starvation" && f.Victim == daemon.Name {
			t.Logf("system-daemon-starvation of %s, culprits %v: %s", daemon.Name, f.Culprits, f.Summary)
		}
	}

	// The run left the host's daemon alone: still running, in its cgroup, with its limit.
	if err := syscall.Kill(procOf(t, layout, cg), 0); err != nil {
		t.Errorf("containerd is gone after the run: %v", err)
	}
	if after := cpuLimit(t, layout, cg); after != limit {
		t.Errorf("the run changed the daemon cgroup's CPU limit from %q to %q", limit, after)
	}
}

// procOf is the first process in cg's cpu (or unified) hierarchy.
func procOf(t *testing.T, layout *cgroup.Layout, cg string) int {
	t.Helper()
	ctrl := cgroup.Unified
	if layout.V1 {
		ctrl = "cpu"
	}
	b, err := os.ReadFile(filepath.Join(layout.Dir(ctrl, cg), "cgroup.procs"))
	if err != nil {
		t.Fatalf("the daemon's cgroup is gone after the run: %v", err)
	}
	var pid int
	if _, err := fmt.Sscan(string(b), &pid); err != nil {
		t.Fatalf("no process left in the daemon's cgroup %s: %q", cg, b)
	}
	return pid
}
