package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/rundir"
)

// The test binary doubles as nodectl: with this variable set it runs main(), so the end-to-end
// tests drive the real CLI, and the workloads it launches (os.Executable) are the same code.
const beMain = "NODECTL_E2E_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(beMain) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("end-to-end stress runs need root (cgroups, eBPF); run as root: sudo make test")
	}
}

// nodectl runs the CLI and returns stdout; stderr goes to the test log.
func nodectl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), beMain+"=1")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	t.Logf("nodectl %s\n%s", strings.Join(args, " "), errb.String())
	return out.String(), err
}

type report struct {
	Run      map[string]string `json:"run"`
	Findings []findingJSON     `json:"findings"`
	Notes    []string          `json:"notes"`
}

type findingJSON struct {
	ID       string        `json:"id"`
	Severity string        `json:"severity"`
	Victim   string        `json:"victim"`
	Culprits []string      `json:"culprits"`
	Affects  []string      `json:"affects"`
	Summary  string        `json:"summary"`
	Evidence []evidenceRow `json:"evidence"`
}

func (r report) ids() []string {
	var ids []string
	for _, f := range r.Findings {
		ids = append(ids, f.ID)
	}
	sort.Strings(ids)
	return ids
}

// said is what the report told: its findings' ids and its notes, which say why a rule that
// was expected did not fire (a slower measure no finding explains, too few iterations).
func (r report) said() string { return fmt.Sprintf("findings %v, notes %q", r.ids(), r.Notes) }

// noisyRun runs `stress noisy --trace` with args, then `analyze -o json`, and returns both the
// report and the opened run.
func noisyRun(t *testing.T, args ...string) (report, *rundir.Run) {
	t.Helper()
	return noisyRunPhases(t, noisyPhase(t), args...)
}

// noisyRunPhases is noisyRun with phases of the given length.
func noisyRunPhases(t *testing.T, phase string, args ...string) (report, *rundir.Run) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "run")
	full := append([]string{"stress", "noisy", "--trace", "--baseline", phase, "--duration", phase, "--out", dir}, args...)
	// What earlier tests left dirty would be written back in this run's baseline, by the
	// flusher, and slow the victim's baseline fsyncs there.
	unix.Sync()
	if _, err := nodectl(t, full...); err != nil {
		t.Fatalf("stress noisy: %v", err)
	}
	out, err := nodectl(t, "analyze", dir, "-o", "json")
	if err != nil {
		t.Fatalf("analyze: %v", err)
	}
	var rep report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("analyze -o json printed no report: %v\n%s", err, out)
	}
	run, err := rundir.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	assertClean(t, run.Meta.ID)
	return rep, run
}

// noisyPhase is how long each phase of a noisy run lasts: 8s, or NODECTL_TEST_NOISY_PHASE where
// the probe's iteration is slow (make test-vm's emulated CPUs write its 64 MiB in about a second
// alone and in five next to CPU hogs, so 8s of stress held one reading or none).
func noisyPhase(t *testing.T) string {
	t.Helper()
	p := os.Getenv("NODECTL_TEST_NOISY_PHASE")
	if p == "" {
		return "8s"
	}
	if _, err := time.ParseDuration(p); err != nil {
		t.Fatalf("NODECTL_TEST_NOISY_PHASE: %v", err)
	}
	return p
}

// probeValues are the victim probe's values of metric inside a phase.
func probeValues(t *testing.T, run *rundir.Run, metric, phase string) []float64 {
	t.Helper()
	w, ok := run.Phase(phase)
	if !ok {
		t.Fatalf("run has no %s phase", phase)
	}
	return run.Series(metric).Cgroup(workloadCgroup(run, "victim")).Values(w)
}

// logProbe logs the victim probe's readings in each phase, so that a failed test shows what the
// analyzer saw.
func logProbe(t *testing.T, run *rundir.Run) {
	t.Helper()
	for _, phase := range []string{rundir.PhaseBaseline, rundir.PhaseStress} {
		for _, m := range []string{rundir.MetricProbeCPUWork, rundir.MetricProbeWrite, rundir.MetricProbeFsync} {
			t.Logf("%s %s: %.4f", phase, m, probeValues(t, run, m, phase))
		}
	}
}

// logRunqWaits logs the victim's run-queue wait in each phase and whom it waited behind, so
// that a run without cpu-contention shows what the rule saw.
func logRunqWaits(t *testing.T, run *rundir.Run) {
	t.Helper()
	victim := workloadCgroup(run, "victim")
	for _, phase := range []string{rundir.PhaseBaseline, rundir.PhaseStress} {
		w, _ := run.Phase(phase)
		h := run.Series(rundir.MetricRunqLatency).Cgroup(victim).HistDelta(w)
		t.Logf("%s: victim's run-queue wait %.3fs in %d waits", phase, float64(h.SumNs)/1e9, h.Count)
		for _, m := range []string{rundir.MetricRunqPreemptWait, rundir.MetricRunqWakeupWait} {
			for p, ss := range run.Series(m).Cgroup(victim).ByLabel(rundir.LabelPreemptor) {
				t.Logf("%s: %s behind %s: %.3fs", phase, m, p, ss.Delta(w))
			}
		}
	}
}

// workloadCgroup is the cgroup of the run's workload name.
func workloadCgroup(run *rundir.Run, name string) string {
	for _, w := range run.Meta.Workloads {
		if w.Name == name {
			return w.Cgroup
		}
	}
	return ""
}

func quantile(vs []float64, q float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Clone(vs)
	sort.Float64s(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// evidenceRow is one evidence row of a finding in the JSON report.
type evidenceRow = struct {
	Metric    string  `json:"metric"`
	Workload  string  `json:"workload"`
	Culprit   string  `json:"culprit"`
	Phase     string  `json:"phase"`
	Baseline  float64 `json:"baseline"`
	Value     float64 `json:"value"`
	Unit      string  `json:"unit"`
	Histogram *struct {
		Count uint64 `json:"count"`
	} `json:"histogram"`
}

// evidenceOf is the finding's evidence row for metric, charged to workload and no culprit; nil
// when it has none.
func evidenceOf(f findingJSON, metric, workload string) *evidenceRow {
	for i, e := range f.Evidence {
		if e.Metric == metric && e.Workload == workload && e.Culprit == "" {
			return &f.Evidence[i]
		}
	}
	return nil
}

// evidence is the victim's evidence row for metric; the test fails without it.
func evidence(t *testing.T, f findingJSON, metric string) evidenceRow {
	t.Helper()
	e := evidenceOf(f, metric, "victim")
	if e == nil {
		t.Fatalf("%s has no %s evidence for the victim: %+v", f.ID, metric, f.Evidence)
	}
	return *e
}

func finding(rep report, id string) (int, bool) {
	for i, f := range rep.Findings {
		if f.ID == id {
			return i, true
		}
	}
	return -1, false
}

func TestNoisyCPUHogsCauseCPUContention(t *testing.T) {
	requireRoot(t)
	rep, run := noisyRun(t, "--hog", "cpu,count=2")
	base := quantile(probeValues(t, run, rundir.MetricProbeCPUWork, "baseline"), 0.5)
	stress := quantile(probeValues(t, run, rundir.MetricProbeCPUWork, "stress"), 0.5)
	t.Logf("victim cpu work p50: baseline %.3fs stress %.3fs (x%.2f); findings %v", base, stress, stress/base, rep.ids())
	if base == 0 || stress/base < 1.2 {
		t.Errorf("CPU hogs slowed the victim's CPU work only x%.2f; want at least x1.2", stress/base)
	}
	i, ok := finding(rep, "cpu-contention")
	if !ok {
		logProbe(t, run)
		logRunqWaits(t, run)
		t.Fatalf("no cpu-contention finding; %s", rep.said())
	}
	t.Run("fail_on_and_junit", func(t *testing.T) { checkGate(t, run.Dir) })
	f := rep.Findings[i]
	for _, hog := range []string{"cpu-hog-0", "cpu-hog-1"} {
		if !slices.Contains(f.Culprits, hog) {
			t.Errorf("cpu-contention culprits %v do not name %s", f.Culprits, hog)
		}
	}
	if len(f.Evidence) == 0 {
		t.Error("cpu-contention has no evidence")
	}
	t.Run("report", func(t *testing.T) { checkNoisyReport(t, run, []string{"cpu-hog-0", "cpu-hog-1"}) })
}

// checkNoisyReport renders a real noisy run through nodectl report and Chromium and reads the
// victim's charts back: each hog's stacked run-queue wait per phase is the wait the run's
// records charge to that hog's cgroup, and the probe's line holds every probe reading.
func checkNoisyReport(t *testing.T, run *rundir.Run, hogs []string) {
	page := renderReport(t, run.Dir, "report-noisy")
	victim := workloadCgroup(run, "victim")
	waits := append(run.Series(rundir.MetricRunqPreemptWait).Cgroup(victim), run.Series(rundir.MetricRunqWakeupWait).Cgroup(victim)...).ByLabel(rundir.LabelPreemptor)
	for _, phase := range []string{"baseline", "stress"} {
		w, _ := run.Phase(phase)
		for _, hog := range hogs {
			want := waits[workloadCgroup(run, hog)].Delta(w)
			got, ok := page.Bars["culprits-victim/"+phase+"/"+hog]
			if (ok || want > 0) && math.Abs(got-want) > 1e-9*max(1, want) {
				t.Errorf("%s's run-queue wait charged to %s: page %g (drawn %v), run %g", phase, hog, got, ok, want)
			}
		}
	}
	if len(hogs) > 0 && page.Bars["culprits-victim/stress/"+hogs[0]] <= page.Bars["culprits-victim/baseline/"+hogs[0]] {
		t.Errorf("the page does not show %s's run-queue wait rising in the stress phase", hogs[0])
	}
	readings := len(probeValues(t, run, rundir.MetricProbeCPUWork, "baseline")) + len(probeValues(t, run, rundir.MetricProbeCPUWork, "stress"))
	if got := len(strings.Fields(page.Lines["probe-victim/"+rundir.MetricProbeCPUWork])); readings == 0 || got < readings {
		t.Errorf("the probe's cpu-work line has %d points, the run's phases %d readings", got, readings)
	}
}

func TestNoisyDiskHogCausesDiskContention(t *testing.T) {
	requireRoot(t)
	// Twice the usual phases: the probe times one fsync a second, and with 8 a phase the
	// analyzer calls a slower tail only when 6 of the 8 stress fsyncs are slower than every
	// baseline one (docs/findings.md). The hog slows only the fsyncs that meet its own
	// (512 MiB written, then fsynced): on a disk that serves it fast enough, fewer do (a CI run
	// saw p50 x1.20, p95 x6.10 and no finding). With 16 a phase, 7 of 16 are enough.
	phase, err := time.ParseDuration(noisyPhase(t))
	if err != nil {
		t.Fatal(err)
	}
	rep, run := noisyRunPhases(t, (2 * phase).String(), "--hog", "disk")
	// The effect is there when the median or the p95 rose: of 8 iterations the p95 is the
	// slowest, and one slow baseline fsync (a writeback the run did not cause) hides a rise
	// there; the hog's own write-then-fsync cycle can leave the median near the baseline's
	// and slow only the iterations that met its fsync.
	vals := func(phase string) []float64 { return probeValues(t, run, rundir.MetricProbeFsync, phase) }
	p50, p95 := quantile(vals("stress"), 0.5)/quantile(vals("baseline"), 0.5), quantile(vals("stress"), 0.95)/quantile(vals("baseline"), 0.95)
	t.Logf("victim fsync: p50 x%.2f, p95 x%.2f; %s", p50, p95, rep.said())
	if !(max(p50, p95) >= 1.5) {
		t.Errorf("a disk hog raised the victim's fsync p50 only x%.2f and its p95 x%.2f; want either at least x1.5", p50, p95)
	}
	i, ok := finding(rep, "disk-contention")
	if !ok {
		t.Fatalf("no disk-contention finding; %s", rep.said())
	}
	if f := rep.Findings[i]; len(f.Culprits) == 0 || f.Culprits[0] != "disk-hog-0" {
		t.Errorf("disk-contention culprits %v, want disk-hog-0 first", f.Culprits)
	}
}

func TestNoisyThrottledVictimIsThrottlingNotContention(t *testing.T) {
	requireRoot(t)
	rep, _ := noisyRun(t, "--victim-cpu", "100m")
	if _, ok := finding(rep, "cpu-throttling"); !ok {
		t.Errorf("a 100m victim was not reported as cpu-throttling; %s", rep.said())
	}
	if _, ok := finding(rep, "cpu-contention"); ok {
		t.Errorf("a victim alone was reported as cpu-contention; got %v", rep.ids())
	}
}

func TestNoisyQuietRunHasNoContention(t *testing.T) {
	requireRoot(t)
	rep, _ := noisyRun(t)
	for _, id := range []string{"cpu-contention", "disk-contention", "cpu-throttling"} {
		if _, ok := finding(rep, id); ok {
			t.Errorf("quiet run reported %s; findings %v", id, rep.ids())
		}
	}
}

// startNoisy starts a long run in the background and waits until its stress phase runs.
// startNoisy starts a long run with every kind of hog (a memory hog of memory, which must leave
// room for a gVisor Sentry when extra picks runsc) and returns once its stress phase runs.
// startNoisy starts a noisy run with every hog and returns once its stress phase is going: the
// command, the run's id and the run's stderr so far and to come (for a test's failure message).
func startNoisy(t *testing.T, memory string, extra ...string) (*exec.Cmd, string, *bytes.Buffer) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "run")
	args := append([]string{"stress", "noisy", "--trace", "--baseline", "2s", "--duration", "5m",
		"--hog", "cpu", "--hog", "disk", "--hog", "fsync", "--hog", "memory,memory=" + memory, "--out", dir}, extra...)
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), beMain+"=1")
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		// Only this test's run: other runs on the machine are none of its business.
		if run, err := rundir.Open(dir); err == nil {
			_, _ = nodectl(t, "stress", "clean", "--all", run.Meta.ID)
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if run, err := rundir.Open(dir); err == nil {
			for _, r := range run.Records {
				if r.Type == rundir.TypePhase && r.Name == "stress" && r.Event == "start" {
					time.Sleep(2 * time.Second) // let every hog get going
					return cmd, run.Meta.ID, &errb
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("the run never reached its stress phase:\n%s", errb.String())
	return nil, "", nil
}

// A run stopped by Ctrl-C, or by its terminal going away (SIGHUP: an SSH session dropped),
// cleans up and exits 130.
func TestInterruptedRunLeavesNothing(t *testing.T) {
	requireRoot(t)
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGHUP} {
		t.Run(unix.SignalName(sig), func(t *testing.T) {
			mounts := tracefsMounts(t)
			cmd, id, stderr := startNoisy(t, "64Mi")
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			err := cmd.Wait()
			var ee *exec.ExitError
			if err == nil || !errors.As(err, &ee) || ee.ExitCode() != 130 {
				t.Errorf("interrupted run exited with %v, want exit status 130; its stderr:\n%s", err, stderr)
			}
			assertClean(t, id)
			if after := tracefsMounts(t); after != mounts {
				t.Errorf("tracefs mounts: %d before the run, %d after it was interrupted", mounts, after)
			}
		})
	}
}

func TestKilledRunIsCleanedByStressClean(t *testing.T) {
	requireRoot(t)
	// A hog writing below a user's directory: the run's directory there goes too.
	target := t.TempDir()
	testKilledRunIsCleaned(t, "64Mi", "--hog", "fsync,target="+target)
	if left, _ := os.ReadDir(target); len(left) > 0 {
		t.Errorf("stress clean left %s in the hog's target %s", left[0].Name(), target)
	}
}

// A killed run's containers outlive it (only the runtime process dies with nodectl): stress
// clean deletes them through the runtime's state the run kept.
func TestKilledSandboxRunIsCleanedByStressClean(t *testing.T) {
	requireRoot(t)
	testKilledRunIsCleaned(t, "192Mi", "--runtime", "runsc")
	if out, _ := exec.Command("pgrep", "-f", "runsc-sandbox|runsc-gofer").Output(); len(out) > 0 {
		t.Errorf("gVisor processes left: %s", out)
	}
}

func testKilledRunIsCleaned(t *testing.T, memory string, extra ...string) {
	mounts := tracefsMounts(t)
	cmd, id, _ := startNoisy(t, memory, extra...)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	out, err := nodectl(t, "stress", "clean", "-o", "json")
	if err != nil {
		t.Fatalf("stress clean: %v", err)
	}
	if !strings.Contains(out, id) {
		t.Errorf("stress clean did not report removing run %s: %s", id, out)
	}
	assertClean(t, id)
	if after := tracefsMounts(t); after != mounts {
		t.Errorf("tracefs mounts: %d before the run, %d after it was killed and cleaned", mounts, after)
	}
}

// tracefsMounts counts the tracefs mounts the host has: a run mounts one when it needs it and
// must leave the table as it found it.
func tracefsMounts(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), " - tracefs ")
}

// assertClean checks that nothing of run id is left: no cgroup in any hierarchy, no process
// whose command line names the run, no scratch or state directory.
func assertClean(t *testing.T, id string) {
	t.Helper()
	// Processes may take a moment to be reaped after SIGKILL.
	deadline := time.Now().Add(5 * time.Second)
	for {
		left := leftovers(id)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("run %s left behind: %v", id, left)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func leftovers(id string) []string {
	var left []string
	run := cgroup.Parent + "/" + id
	mounts, _ := filepath.Glob("/sys/fs/cgroup/*" + run)
	left = append(left, mounts...)
	if m, _ := filepath.Glob("/sys/fs/cgroup" + run); len(m) > 0 {
		left = append(left, m...)
	}
	for _, d := range []string{"/var/tmp/nodectl/" + id, "/run/nodectl/" + id} {
		if _, err := os.Stat(d); err == nil {
			left = append(left, d)
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		cmdline, _ := os.ReadFile(p + "/cmdline")
		cg, _ := os.ReadFile(p + "/cgroup")
		if bytes.Contains(cmdline, []byte(id)) || bytes.Contains(cg, []byte(run)) {
			left = append(left, p+": "+strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
	return left
}

func TestRecordRanksAUserCgroup(t *testing.T) {
	requireRoot(t)
	layout, err := cgroup.Detect("/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	cg := fmt.Sprintf("%s/test-record-%d", cgroup.Parent, os.Getpid())
	if err := layout.Create(cg, cgroup.Limits{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := layout.Remove(cg); err != nil {
			t.Error(err)
		}
		if err := layout.Prune(cgroup.Parent); err != nil {
			t.Error(err)
		}
	})
	dir := filepath.Join(t.TempDir(), "rec")
	// Long enough for the load to finish inside it on a slow disk; the test waits for both.
	rec := exec.Command(os.Args[0], "record", "--duration", "12s", "--out", dir)
	rec.Env = append(os.Environ(), beMain+"=1")
	var recErr bytes.Buffer
	rec.Stderr = &recErr
	if err := rec.Start(); err != nil {
		t.Fatal(err)
	}
	// The user's own load, in its own cgroup: 20 writes of 4 MiB, each fsynced.
	time.Sleep(1500 * time.Millisecond)
	scratch := t.TempDir()
	load := exec.Command("sh", "-c", `read go; for i in $(seq 20); do dd if=/dev/zero of="$1/f" bs=1M count=4 conv=fsync status=none; done`, "sh", scratch)
	stdin, _ := load.StdinPipe()
	if err := load.Start(); err != nil {
		t.Fatal(err)
	}
	if err := layout.AddProc(cg, load.Process.Pid); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(stdin)
	if err := load.Wait(); err != nil {
		t.Fatalf("load: %v", err)
	}
	if err := rec.Wait(); err != nil {
		t.Fatalf("record: %v\n%s", err, recErr.String())
	}
	out, err := nodectl(t, "analyze", dir, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Summary struct {
			Ranking struct {
				Fsync []struct {
					Cgroup string
					Count  uint64
				} `json:"fsync"`
				IOBytes []struct {
					Cgroup string
					Value  float64
				} `json:"io_bytes"`
			} `json:"ranking"`
		} `json:"summary"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	var fsyncs uint64
	for _, r := range rep.Summary.Ranking.Fsync {
		if r.Cgroup == cg {
			fsyncs = r.Count
		}
	}
	if fsyncs < 20 {
		t.Errorf("record ranked %d fsyncs for %s, want at least the load's 20: %+v", fsyncs, cg, rep.Summary.Ranking.Fsync)
	}
	var bytesIO float64
	for _, r := range rep.Summary.Ranking.IOBytes {
		if r.Cgroup == cg {
			bytesIO = r.Value
		}
	}
	if bytesIO < 80<<20 {
		t.Errorf("record charged %s with %.0f bytes of I/O, want at least the load's 80 MiB", cg, bytesIO)
	}
}

// cliError is a command line that must fail with an error saying want.
type cliError struct {
	args []string
	want string
}

// expectCLIErrors runs each command line (after prefix) and checks that it fails, saying what
// it must: the flag, the value and what is allowed.
func expectCLIErrors(t *testing.T, prefix []string, tests map[string]cliError) {
	t.Helper()
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			args := append(slices.Clone(prefix), tc.args...)
			_, stderr, err := nodectlAs(t, os.Args[0], nil, args...)
			if err == nil {
				t.Fatalf("nodectl %v succeeded, want an error", args)
			}
			if !strings.Contains(stderr, tc.want) {
				t.Errorf("stderr %q does not contain %q", stderr, tc.want)
			}
		})
	}
}

func TestCLIErrorsNameTheProblem(t *testing.T) {
	expectCLIErrors(t, nil, map[string]cliError{
		"unknown_hog_kind":   {[]string{"stress", "noisy", "--hog", "gpu"}, `unknown kind "gpu" (allowed: cpu, disk, memory, fsync, churn)`},
		"bad_hog_limit":      {[]string{"stress", "noisy", "--hog", "cpu,cpu=fast"}, `cpu=fast: bad CPU limit "fast"`},
		"bad_victim_cpu":     {[]string{"stress", "noisy", "--victim-cpu", "-1"}, "--victim-cpu"},
		"bad_victim_memory":  {[]string{"stress", "noisy", "--victim-memory", "lots"}, `--victim-memory: bad size "lots"`},
		"bad_node_memory":    {[]string{"stress", "noisy", "--node-memory", "lots"}, `--node-memory: bad size "lots"`},
		"small_node_memory":  {[]string{"stress", "noisy", "--node-memory", "64Mi"}, "--node-memory 64Mi: must be at least 96Mi"},
		"short_baseline":     {[]string{"stress", "noisy", "--baseline", "10ms"}, "--baseline 10ms"},
		"bad_output":         {[]string{"analyze", "x", "-o", "yaml"}, `-o "yaml": allowed values are text and json`},
		"missing_run":        {[]string{"analyze", "/nonexistent/run"}, "/nonexistent/run"},
		"record_without_out": {[]string{"record", "--duration", "2s"}, "--out is required"},
		"clean_bad_id":       {[]string{"stress", "clean", "../etc"}, "is not a run id"},
		"agent_bad_trigger":  {[]string{"agent", "--trigger-memory-psi-full", "2"}, "--trigger-memory-psi-full 2: must be a share in (0, 1]"},
		"agent_bad_window":   {[]string{"agent", "--incident-after", "0s"}, "--incident-after 0s: must be more than 0"},
		"agent_bad_memory":   {[]string{"agent", "--memory-limit", "lots"}, `--memory-limit "lots"`},
		"agent_pprof_public": {[]string{"agent", "--pprof-listen", "0.0.0.0:6060"}, "--pprof-listen 0.0.0.0:6060: must be a loopback address"},
		"postmortem_both":    {[]string{"postmortem", "--at", "now", "--incident", "x"}, "--at and --incident: give one, not both"},
		"analyze_bad_from":   {[]string{"analyze", "--from", "yesterday"}, `--from "yesterday": want an RFC 3339 time`},
		"analyze_run_and_to": {[]string{"analyze", "x", "--from", "10m"}, "give a RUN directory or --from and --to, not both"},
		"export_without_out": {[]string{"agent", "export", "--from", "10m"}, "--out is required"},
		"no_agent":           {[]string{"agent", "status", "--socket", "/nonexistent/a.sock"}, "no agent listening on /nonexistent/a.sock"},
		"not_a_data_dir":     {[]string{"postmortem", "--data-dir", "/"}, "/ is not an agent's data directory"},
		"bad_fail_on":        {[]string{"analyze", "x", "--fail-on", "bad"}, `--fail-on "bad": allowed are info, warning, critical, none`},
		"stress_bad_fail_on": {[]string{"stress", "noisy", "--fail-on", "warn"}, `--fail-on "warn"`},
		"junit_no_dir":       {[]string{"analyze", "x", "--junit", "/nonexistent/dir/j.xml"}, "--junit /nonexistent/dir/j.xml: its directory does not exist"},
		"node_local_only":    {[]string{"--node", "n1", "diff", "a", "b"}, "--node: `nodectl diff` acts on this machine only"},
		"node_no_kubeconfig": {[]string{"--node", "n1", "--kubeconfig", "/nonexistent/kubeconfig", "agent", "status"}, "--kubeconfig"},
		"node_and_socket":    {[]string{"--node", "n1", "agent", "status", "--socket", "/x.sock"}, "--socket and --node: choose one"},
		"node_analyze_run":   {[]string{"--node", "n1", "analyze", "x"}, "--node: RUN is a directory on this machine"},
		"node_density_swap":  {[]string{"--node", "n1", "stress", "density", "--swap", "/var/tmp/s:1Gi"}, "--swap: not with --node"},
		"node_image_no_bin":  {[]string{"--node", "n1", "stress", "density", "--image", "chrome:1"}, `--image-binary "": --image needs the absolute path`},
		"node_bin_no_image":  {[]string{"--node", "n1", "stress", "density", "--image-binary", "/x"}, "--image-binary /x: only with --image"},
		"density_lease_neg":  {[]string{"stress", "density", "--collapse-lease-late", "-1s"}, "--collapse-lease-late must not be negative"},
		"node_storm_target":  {[]string{"--node", "n1", "stress", "fsync-storm", "--target", "/tmp"}, "--target /tmp: not with --node"},
		"node_tune_watch":    {[]string{"--node", "n1", "tune", "watch"}, "--node: `nodectl tune watch` acts on this machine only"},
		"node_tune_host":     {[]string{"--node", "n1", "tune", "status", "--host-root", "/"}, "--host-root: not with --node"},
		"node_tune_profile":  {[]string{"--node", "n1", "tune", "plan", "--profile", "/nonexistent/p.yaml"}, "--profile /nonexistent/p.yaml is neither a built-in"},
		"node_validate_node": {[]string{"--node", "n1", "tune", "validate", "--", "stress", "wake", "--node", "n2"}, "stress flag --node: give it before tune"},
		"node_wake_platform": {[]string{"--node", "n1", "stress", "wake", "--runtime", "runsc", "--runsc-platform", "ptrace"}, "--runsc-platform: not with --node"},
	})
}

// A run refused for a value found bad only once it set up (a hog's target without a disk)
// recorded nothing, and leaves no run directory.
func TestRunRefusedAtSetUpLeavesNoDirectory(t *testing.T) {
	requireRoot(t)
	out := filepath.Join(t.TempDir(), "run")
	cmd := exec.Command(os.Args[0], "stress", "noisy", "--hog", "disk,target=/proc", "--baseline", "1s", "--duration", "1s", "--out", out)
	cmd.Env = append(os.Environ(), beMain+"=1")
	stderr, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(stderr), "target=/proc") {
		t.Errorf("a disk hog on /proc: %v, want it refused naming target=/proc:\n%s", err, stderr)
	}
	if _, serr := os.Stat(out); !errors.Is(serr, fs.ErrNotExist) {
		t.Errorf("the refused run left its directory %s (%v)", out, serr)
	}
}

func TestWithoutRootSaysWhichPrivilegeIsMissing(t *testing.T) {
	requireRoot(t) // to drop to another user
	exe := exeForNobody(t)
	dir := filepath.Dir(exe)
	for _, args := range [][]string{
		{"stress", "noisy", "--trace"},
		{"record", "--duration", "2s", "--out", filepath.Join(dir, "rec")},
		{"stress", "clean"},
		{"agent", "--data-dir", filepath.Join(dir, "agent"), "--socket", filepath.Join(dir, "a.sock")},
	} {
		_, stderr, err := nodectlAs(t, exe, nobody, args...)
		if err == nil {
			t.Fatalf("nodectl %v as nobody succeeded", args)
		}
		if !strings.Contains(stderr, "needs root") || !strings.Contains(stderr, "CAP_") {
			t.Errorf("nodectl %v as nobody: %q does not name the missing privilege", args, stderr)
		}
	}
}

var nobody = &syscall.Credential{Uid: 65534, Gid: 65534}

// exeForNobody copies the test binary where user nobody can run it: neither the build cache's
// directory nor t.TempDir's parent are reachable by that user.
func exeForNobody(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "nodectl-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "nodectl")
	if err := os.WriteFile(exe, self, 0o755); err != nil {
		t.Fatal(err)
	}
	return exe
}

// nodectlAs runs the CLI binary exe, as another user when cred is set, and returns stdout and
// stderr.
func nodectlAs(t *testing.T, exe string, cred *syscall.Credential, args ...string) (string, string, error) {
	t.Helper()
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), beMain+"=1")
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return out.String(), errb.String(), err
}

func TestQuietHeartbeatIsNotStarved(t *testing.T) {
	requireRoot(t)
	rep, _ := noisyRun(t, "--heartbeat=100ms")
	if _, ok := finding(rep, "system-daemon-starvation"); ok {
		t.Errorf("a quiet run reported system-daemon-starvation; findings %v", rep.ids())
	}
}

// Four processes started at a time beside two CPU hogs: the heartbeat's stress p95 lay at
// 12–21 ms against 1 ms alone (3 runs); with one at a time it lay at 3–11 ms, astride the rule's
// 5 ms rise, and the test failed one run in four here and on CI (2026-12-06).
func TestHeartbeatNextToChurnIsStarved(t *testing.T) {
	requireRoot(t)
	rep, run := noisyRun(t, "--heartbeat=100ms", "--hog", "churn,threads=4", "--hog", "cpu,count=2")
	late := run.Series(rundir.MetricHeartbeatLateness).Cgroup(workloadCgroup(run, "heartbeat"))
	b, _ := run.Phase(rundir.PhaseBaseline)
	s, _ := run.Phase(rundir.PhaseStress)
	base, stress := slices.Max(late.Values(b)), slices.Max(late.Values(s))
	t.Logf("heartbeat worst lateness: baseline %.4fs stress %.4fs (x%.1f); p95 %.4fs -> %.4fs; findings %v", base, stress, stress/base,
		quantile(late.Values(b), 0.95), quantile(late.Values(s), 0.95), rep.ids())
	i, ok := finding(rep, "system-daemon-starvation")
	if !ok {
		t.Fatalf("no system-daemon-starvation finding; %s", rep.said())
	}
	if f := rep.Findings[i]; f.Victim != "heartbeat" || !slices.ContainsFunc(f.Culprits, func(c string) bool {
		return strings.HasPrefix(c, "churn-hog-") || strings.HasPrefix(c, "cpu-hog-")
	}) {
		t.Errorf("system-daemon-starvation of %s blames %v, want the churn or CPU hogs", f.Victim, f.Culprits)
	}
}

// interruptAt starts `nodectl args... --out dir`, waits (up to 30 s) until the run records a
// record that at matches, sends SIGINT, and checks that the run exits 130 and leaves nothing.
// what names the awaited moment in the failure message. It returns the run's id.
func interruptAt(t *testing.T, dir, what string, at func(rundir.Record) bool, args ...string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], append(args, "--out", dir)...)
	cmd.Env = append(os.Environ(), beMain+"=1")
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if run, err := rundir.Open(dir); err == nil {
			_, _ = nodectl(t, "stress", "clean", "--all", run.Meta.ID)
		}
	})
	id := ""
	for deadline := time.Now().Add(30 * time.Second); id == "" && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if run, err := rundir.Open(dir); err == nil && slices.ContainsFunc(run.Records, at) {
			id = run.Meta.ID
		}
	}
	if id == "" {
		t.Fatalf("%s never came:\n%s", what, errb.String())
	}
	time.Sleep(time.Second)
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 {
		t.Errorf("interrupted nodectl %s exited with %v, want exit status 130\n%s", strings.Join(args, " "), err, errb.String())
	}
	assertClean(t, id)
	return id
}
