package main

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/nodectl/nodectl/agent/cgroup"
	"github.com/nodectl/nodectl/agent/record"
	"github.com/nodectl/nodectl/tuner"
	"github.com/nodectl/nodectl/tuner/cpuset"
)

// The test of the cpuset partition, through nodectl tune validate: the heartbeat (the
// kubelet's stand-in) starved by CPU churn, then the same run with CPU 0 reserved for the
// system, which the stress run reads from the tune state; the heartbeat's lateness must drop
// at least twofold. The daemon the partition moves is a sleep of ours.
func TestReservedCPUsKeepTheHeartbeatOnTime(t *testing.T) {
	requireRoot(t)
	layout, err := cgroup.Detect("/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	mount, ok := layout.Mounts["cpuset"]
	if !ok {
		t.Skip("no v1 cpuset hierarchy here")
	}
	if b, _ := os.ReadFile("/sys/devices/system/cpu/online"); strings.TrimSpace(string(b)) == "0" {
		t.Skip("a partition needs two CPUs")
	}
	if _, err := os.Stat(filepath.Join(mount, cpuset.SystemCgroup)); err == nil {
		t.Skipf("%s exists: a partition is already applied on this machine", cpuset.SystemCgroup)
	}

	// A daemon for the partition to confine: a sleep under a name of its own.
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	comm := "nct-e2e-" + hex.EncodeToString(b)
	exe := filepath.Join(t.TempDir(), comm)
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep binary for the daemon")
	}
	bin, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(exe, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	daemon := exec.Command(exe, "300")
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { daemon.Process.Kill(); daemon.Wait() })
	allowed := func() string {
		s, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(daemon.Process.Pid), "status"))
		for _, l := range strings.Split(string(s), "\n") {
			if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:"); ok {
				return strings.TrimSpace(v)
			}
		}
		return ""
	}
	daemonCPUs := allowed()
	if daemonCPUs == "0" {
		t.Skip("this test runs on CPU 0 alone: the partition would not move it")
	}

	// tune validate: the stress run untuned, the profile applied, the same run tuned, the
	// profile rolled back, and the diff of the two runs printed.
	root, flags := tuneScratch(t)
	prof := writeProfile(t, root, "name: e2e-reserved-cpus\nreservedSystemCPUs:\n  cpus: \"0\"\n  kubeletDropIn: \"\"\n  daemons: ["+comm+"]\n")
	runs := filepath.Join(t.TempDir(), "validate")
	args := append([]string{"tune", "validate", "--profile", prof, "--out", runs}, flags...)
	args = append(args, "--", "stress", "noisy", "--heartbeat=100ms", "--hog", "churn", "--hog", "cpu,count=2",
		"--daemons", "none", "--baseline", "3s", "--duration", "8s")
	out, err := nodectl(t, args...)
	if err != nil {
		t.Fatalf("tune validate: %v", err)
	}
	if !strings.Contains(out, "heartbeat late max") || !strings.Contains(out, "e2e-reserved-cpus") {
		t.Errorf("tune validate printed no diff of the heartbeat:\n%s", out)
	}
	var before, after *record.Run
	for _, r := range []struct {
		run **record.Run
		dir string
	}{{&before, "before"}, {&after, "after"}} {
		if *r.run, err = record.Open(filepath.Join(runs, r.dir)); err != nil {
			t.Fatal(err)
		}
		assertClean(t, (*r.run).Meta.ID)
	}
	state := filepath.Join(root, tuner.DefaultStateFile)

	// The run placed its workloads by the partition and said so.
	for _, w := range after.Meta.Workloads {
		want := "1"
		if w.Kind == "heartbeat" {
			want = "0"
		}
		if w.CPUs != want {
			t.Errorf("with the partition %s ran on CPUs %q, want %q", w.Name, w.CPUs, want)
		}
	}
	for _, w := range before.Meta.Workloads {
		if w.CPUs != "" {
			t.Errorf("without a partition %s ran on CPUs %q, want none set", w.Name, w.CPUs)
		}
	}

	lateness := func(run *record.Run) (p99, worst float64, n int) {
		t.Helper()
		s, ok := run.Phase(record.PhaseStress)
		if !ok {
			t.Fatal("run has no stress phase")
		}
		vs := run.Series(record.MetricHeartbeatLateness).Cgroup(workloadCgroup(run, "heartbeat")).Values(s)
		if len(vs) == 0 {
			t.Fatal("no heartbeat lateness in the stress phase")
		}
		return quantile(vs, 0.99), slices.Max(vs), len(vs)
	}
	p99Before, maxBefore, nBefore := lateness(before)
	p99After, maxAfter, nAfter := lateness(after)
	t.Logf("heartbeat lateness in the stress phase: without the partition p99 %.4fs max %.4fs (%d samples); with CPU 0 reserved p99 %.4fs max %.4fs (%d samples); p99 x%.1f lower, max x%.1f lower",
		p99Before, maxBefore, nBefore, p99After, maxAfter, nAfter, p99Before/p99After, maxBefore/maxAfter)
	if p99Before < 2*p99After {
		t.Errorf("reserving CPU 0 lowered the heartbeat's p99 lateness only from %.4fs to %.4fs, want at least 2x", p99Before, p99After)
	}

	// The machine is as before: the daemon back, no cgroup or state of the partition.
	if got := allowed(); got != daemonCPUs {
		t.Errorf("after rollback the daemon runs on CPUs %s, want %s", got, daemonCPUs)
	}
	for _, f := range []string{filepath.Join(mount, cpuset.SystemCgroup), state, state + ".lock"} {
		if _, err := os.Stat(f); err == nil {
			t.Errorf("rollback left %s", f)
		}
	}
}

// A state file stress cannot read stops the run before it touches the host, naming the flag.
func TestStressNamesAnUnreadableTuneState(t *testing.T) {
	requireRoot(t)
	bad := filepath.Join(t.TempDir(), "state.json")
	if err := os.WriteFile(bad, []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	expectCLIErrors(t, nil, map[string]cliError{
		"noisy": {[]string{"stress", "noisy", "--baseline", "1s", "--duration", "1s", "--tune-state", bad}, "--tune-state " + bad},
		"wake":  {[]string{"stress", "wake", "--tune-state", bad}, "--tune-state " + bad},
	})
}
