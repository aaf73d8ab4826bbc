package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodectl/nodectl/host"

	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/rundir"
	wl "github.com/nodectl/nodectl/stress/workload"
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
	allowed := func() string { return allowedCPUs(daemon.Process.Pid) }
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
	var before, after *rundir.Run
	for _, r := range []struct {
		run **rundir.Run
		dir string
	}{{&before, "before"}, {&after, "after"}} {
		if *r.run, err = rundir.Open(filepath.Join(runs, r.dir)); err != nil {
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

	lateness := func(run *rundir.Run) (mean, p99, worst float64, n int) {
		t.Helper()
		s, ok := run.Phase(rundir.PhaseStress)
		if !ok {
			t.Fatal("run has no stress phase")
		}
		vs := run.Series(rundir.MetricHeartbeatLateness).Cgroup(workloadCgroup(run, "heartbeat")).Values(s)
		if len(vs) == 0 {
			t.Fatal("no heartbeat lateness in the stress phase")
		}
		var sum float64
		for _, v := range vs {
			sum += v
		}
		return sum / float64(len(vs)), quantile(vs, 0.99), slices.Max(vs), len(vs)
	}
	meanBefore, p99Before, maxBefore, nBefore := lateness(before)
	meanAfter, p99After, maxAfter, nAfter := lateness(after)
	t.Logf("heartbeat lateness in the stress phase: without the partition mean %.5fs p99 %.4fs max %.4fs (%d samples); with CPU 0 reserved mean %.5fs p99 %.4fs max %.4fs (%d samples); mean x%.1f, p99 x%.1f, max x%.1f lower",
		meanBefore, p99Before, maxBefore, nBefore, meanAfter, p99After, maxAfter, nAfter, meanBefore/meanAfter, p99Before/p99After, maxBefore/maxAfter)
	// The mean holds every late beat; the p99 of 80 beats is the latest one, which anything
	// else on CPU 0 decides (CI once: a 15.6 ms beat with the partition, p99 only x1.5 lower).
	// Here, three runs: mean x5.0-7.7 lower, p99 x28-37 (and x2.6-7.9 in three earlier).
	if meanBefore < 2*meanAfter {
		t.Errorf("reserving CPU 0 lowered the heartbeat's mean lateness only from %.5fs to %.5fs, want at least 2x", meanBefore, meanAfter)
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

// beats collects a heartbeat workload's lateness measurements as it prints them.
type beats struct {
	mu   sync.Mutex
	at   []time.Time
	late []float64
}

func (b *beats) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		var m wl.Measurement
		if json.Unmarshal(sc.Bytes(), &m) != nil || m.Metric != rundir.MetricHeartbeatLateness {
			continue
		}
		b.mu.Lock()
		b.at, b.late = append(b.at, m.T), append(b.late, m.Value)
		b.mu.Unlock()
	}
}

// phase is the lateness of the beats from from on, collected for at least d and, on a machine
// slow enough that a starved daemon beats rarely, until there are n of them (at most 60 s).
func (b *beats) phase(from time.Time, d time.Duration, n int) []float64 {
	time.Sleep(time.Until(from.Add(d)))
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if got := b.between(from, time.Now()); len(got) >= n || time.Now().After(deadline) {
			return got
		}
	}
}

// between is the lateness of the beats in [from, to).
func (b *beats) between(from, to time.Time) []float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []float64
	for i, t := range b.at {
		if !t.Before(from) && t.Before(to) {
			out = append(out, b.late[i])
		}
	}
	return out
}

// The partition's own cgroup writes and daemon move, with no stress run placing anything:
// CPU hogs in a pod cgroup starve a heartbeat daemon in a cgroup next to it; the partition,
// applied and rolled back through the engine, gives the pods CPU 1 and moves the daemon to
// /nodectl/system on CPU 0, and the daemon's lateness must drop at least twofold.
func TestPartitionConfinesADaemonNextToHogs(t *testing.T) {
	requireRoot(t)
	layout, err := cgroup.Detect("/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	mount, ok := layout.Mounts["cpuset"]
	if !ok {
		t.Skip("no v1 cpuset hierarchy here")
	}
	if b, _ := os.ReadFile("/sys/devices/system/cpu/online"); strings.TrimSpace(string(b)) != "0-1" {
		t.Skipf("the test expects 2 CPUs (0-1), the machine has %s", b)
	}
	system := filepath.Join(mount, cpuset.SystemCgroup)
	if _, err := os.Stat(system); err == nil {
		t.Skipf("%s exists: a partition is already applied on this machine", cpuset.SystemCgroup)
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	id := "partition-e2e-" + hex.EncodeToString(b)
	base := cgroup.Parent + "/" + id
	pods := base + "/pods"
	_, parentErr := os.Stat(filepath.Join(mount, cgroup.Parent))
	t.Cleanup(func() {
		if err := layout.Remove(base); err != nil {
			t.Error(err)
		}
		if parentErr != nil {
			_ = layout.Prune(cgroup.Parent)
		}
	})
	// The daemon's cgroup (its systemd unit's stand-in) and the pods' are siblings, as
	// system.slice and kubepods are on a node, and the pods get a large cpu.shares, as kubepods
	// has there: the largest, 262144 (256 CPUs' worth) against the daemon's 1024. On a
	// 32-core node kubepods has 32768 against system.slice's 1024, which every daemon shares;
	// on these 2 CPUs a ratio that small lets the scheduler (EEVDF) wake the daemon on time in
	// some runs, and the default 1024 each, or the daemon in the root cgroup next to all of
	// /nodectl, in every run.
	unit := base + "/system.slice"
	if err := layout.Create(unit, cgroup.Limits{}); err != nil {
		t.Fatal(err)
	}
	if err := layout.Create(pods, cgroup.Limits{CPURequestMilli: 256000}); err != nil {
		t.Fatal(err)
	}

	// The daemon: the heartbeat body under a name of its own, in its unit's cgroup.
	comm := "nct-hb-" + hex.EncodeToString(b)
	exe := filepath.Join(t.TempDir(), comm)
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(exe, self, 0o755); err != nil {
		t.Fatal(err)
	}
	hb := exec.Command(exe, "workload", "heartbeat", "--period", "50ms", "--run", id)
	hb.Env = append(os.Environ(), beMain+"=1")
	out, err := hb.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := hb.Start(); err != nil {
		t.Fatal(err)
	}
	var got beats
	done := make(chan struct{})
	go func() { got.read(out); close(done) }()
	t.Cleanup(func() { hb.Process.Signal(syscall.SIGTERM); <-done; hb.Wait() })
	pid := hb.Process.Pid
	if err := layout.AddProc(unit, pid); err != nil {
		t.Fatal(err)
	}
	where := func() string {
		b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cpuset"))
		return strings.TrimSpace(string(b))
	}
	if home := where(); home != unit {
		t.Fatalf("the daemon is in cpuset %s, want %s", home, unit)
	}

	// The daemon starts measuring once its runtime has started. It starts before the hogs: at
	// 1/257 of the CPU next to them, a Go runtime's start took seconds (8 s in one CI run,
	// more than 60 s in another, which failed the test before it measured anything), and the
	// start is not what the test measures.
	for deadline := time.Now().Add(60 * time.Second); len(got.between(time.Time{}, time.Now())) == 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the heartbeat daemon emitted nothing in 60 s")
		}
	}

	// Three busy processes in the pod cgroup: more than the machine's CPUs.
	var hogs []*exec.Cmd
	for range 3 {
		hog := exec.Command(os.Args[0], "workload", "cpu-hog", "--threads", "1", "--run", id)
		hog.Env = append(os.Environ(), beMain+"=1")
		if err := hog.Start(); err != nil {
			t.Fatal(err)
		}
		hogs = append(hogs, hog)
		t.Cleanup(func() { hog.Process.Kill(); hog.Wait() })
		if err := layout.AddProc(pods, hog.Process.Pid); err != nil {
			t.Fatal(err)
		}
	}

	// Each phase skips its first second (the hogs and the move settling), lasts 7 s and, if
	// the daemon beats rarely, until it has 20 beats to take a p99 from.
	const settle, phase, enough = time.Second, 7 * time.Second, 20
	untuned := got.phase(time.Now().Add(settle), phase, enough)

	ctx := context.Background()
	h := host.FS{Root: t.TempDir(), Procfs: "/proc", Sysfs: "/sys", Cgroupfs: "/sys/fs/cgroup"}
	state := filepath.Join(t.TempDir(), "state.json")
	engine := &tuner.Engine{Profile: "e2e-partition", State: state,
		Settings: []tuner.Setting{cpuset.NewPartition(h, cpuset.Partition{Reserved: "0", WorkloadCgroups: []string{pods}, Daemons: []string{comm}})},
		Decode:   func(_ string, spec json.RawMessage) (tuner.Setting, error) { return cpuset.Decode(h, spec) }}
	if _, err := engine.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	rolledBack := false
	t.Cleanup(func() {
		if !rolledBack {
			if _, err := engine.Rollback(ctx); err != nil {
				t.Error(err)
			}
		}
	})
	tuned := got.phase(time.Now().Add(settle), phase, enough)
	during := where()
	podCPUs, _ := os.ReadFile(filepath.Join(mount, pods, "cpuset.cpus"))
	// The kernel holds the processes to the cgroups' CPUs: the hogs off CPU 0, the daemon on it.
	for _, hog := range hogs {
		if got := allowedCPUs(hog.Process.Pid); got != "1" {
			t.Errorf("with the partition hog %d may run on CPUs %s, want 1", hog.Process.Pid, got)
		}
	}
	if got := allowedCPUs(pid); got != "0" {
		t.Errorf("with the partition the daemon may run on CPUs %s, want 0", got)
	}

	_, err = engine.Rollback(ctx)
	rolledBack = true
	if err != nil {
		t.Fatalf("rollback: %v", err)
	}
	if len(untuned) < 10 || len(tuned) < 10 {
		t.Fatalf("too few heartbeats: %d without the partition, %d with it", len(untuned), len(tuned))
	}
	p99Before, maxBefore := quantile(untuned, 0.99), slices.Max(untuned)
	p99After, maxAfter := quantile(tuned, 0.99), slices.Max(tuned)
	t.Logf("daemon heartbeat lateness next to 3 CPU hogs: without the partition p99 %.4fs max %.4fs (%d beats); with CPU 0 reserved p99 %.4fs max %.4fs (%d beats); p99 x%.1f lower, max x%.1f lower",
		p99Before, maxBefore, len(untuned), p99After, maxAfter, len(tuned), p99Before/p99After, maxBefore/maxAfter)
	if p99Before < 2*p99After && maxBefore < 2*maxAfter {
		t.Errorf("the partition lowered the daemon's lateness only from p99 %.4fs max %.4fs to p99 %.4fs max %.4fs, want at least 2x",
			p99Before, maxBefore, p99After, maxAfter)
	}
	if during != cpuset.SystemCgroup || strings.TrimSpace(string(podCPUs)) != "1" {
		t.Errorf("with the partition the daemon was in cpuset %s and the pods on CPUs %s, want %s and 1", during, podCPUs, cpuset.SystemCgroup)
	}
	if now := where(); now != unit {
		t.Errorf("after rollback the daemon is in cpuset %s, want %s", now, unit)
	}
	if b, _ := os.ReadFile(filepath.Join(mount, pods, "cpuset.cpus")); strings.TrimSpace(string(b)) != "0-1" {
		t.Errorf("after rollback the pods have CPUs %s, want 0-1", b)
	}
	for _, f := range []string{system, state, state + ".lock"} {
		if _, err := os.Stat(f); err == nil {
			t.Errorf("rollback left %s", f)
		}
	}
	// Nothing of the test is left either: the daemon stopped, the hogs and their cgroups gone.
	hb.Process.Signal(syscall.SIGTERM)
	<-done
	hb.Wait()
	for _, hog := range hogs {
		hog.Process.Kill()
		hog.Wait()
	}
	if err := layout.Remove(base); err != nil {
		t.Error(err)
	}
	assertClean(t, id)
}

// allowedCPUs is the CPU list process pid may run on.
func allowedCPUs(pid int) string {
	s, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	for _, l := range strings.Split(string(s), "\n") {
		if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
