package testvm

import (
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// guestTests are what every kernel runs: the tracers (each loads, attaches and attributes to v2
// cgroup ids; the feature probes log their answers), the samplers on v2 files, cgroups and swap
// areas, the agent's pipeline, and end-to-end runs of the CLI: a traced noisy run with process
// workloads, the agent's incidents and post-mortems, a memory neighbour and swap.
var guestTests = []GuestTest{
	{Pkg: "./record/trace/internal/features", Timeout: 2 * time.Minute},
	{Pkg: "./record/trace/internal/loader", Timeout: 5 * time.Minute},
	{Pkg: "./record/trace/tracefs", Timeout: 2 * time.Minute},
	// TestReadPartSpreadsPairs, skipped here once it failed one boot in five ("a busy loop's
	// histogram missing from a ReadPart"), runs again since it allows two switches in a row
	// that the kernel's sched_switch did not report (c60cf4b, for the same failure on the
	// host): 6 boots of 6 passed it, in both the 2-CPU and the 96-possible-CPU guest.
	{Pkg: "./record/trace/runq", Timeout: 10 * time.Minute},
	{Pkg: "./record/trace/fsync", Timeout: 5 * time.Minute},
	{Pkg: "./record/trace/blkio", Timeout: 5 * time.Minute},
	{Pkg: "./record/trace/reclaim", Timeout: 5 * time.Minute},
	{Pkg: "./record/trace/cgnames", Timeout: 2 * time.Minute},
	{Pkg: "./record/trace", Timeout: 10 * time.Minute},
	{Pkg: "./host/cgroup", Timeout: 5 * time.Minute},
	{Pkg: "./host/daemons", Timeout: 2 * time.Minute},
	{Pkg: "./record/sample", Timeout: 10 * time.Minute},
	{Pkg: "./host/swapfile", Timeout: 5 * time.Minute},
	{Pkg: "./stress/launch", Timeout: 10 * time.Minute},
	{Pkg: "./record/session", Timeout: 5 * time.Minute},
	{Pkg: "./agent", Timeout: 10 * time.Minute},
	{
		Pkg: "./cli/nodectl",
		Run: "^(TestNoisyCPUHogsCauseCPUContention|TestNeighbourFillingTheNodeMakesTheVictimReclaim|" +
			"TestAgentIncidentNamesTheHogs|TestAgentOOMKillIncident)$",
		// The reports' rendering needs Chromium, which the guest has not: it runs on the host.
		Skip:    "^(TestNoisyCPUHogsCauseCPUContention|TestAgentIncidentNamesTheHogs)$/^(report|html)$",
		Timeout: 20 * time.Minute,
	},
}

// The machine every kernel boots on: 2 vCPUs as this host has, memory for the tests' hogs.
var machine = Machine{CPUs: 2, MemoryMiB: 3072}

// Then each kernel boots wide, with 96 possible CPUs (2 online; the largest c4 node's vCPUs),
// for the tests whose counts must not grow with the CPUs: the run-queue tracer's bytes read an
// interval, compared with the first boot's (readCost).
var (
	wide      = Machine{CPUs: 2, MaxCPUs: 96, MemoryMiB: 3072}
	wideTests = []GuestTest{{Pkg: "./record/trace/runq", Run: "^TestReadCostFollowsChanges$", Timeout: 5 * time.Minute}}
)

func TestKernels(t *testing.T) {
	if os.Getenv("NODECTL_TEST_VM") != "1" {
		t.Skip("boots kernels under QEMU: run by make test-vm (as root)")
	}
	dirs := strings.Fields(os.Getenv("NODECTL_VM_KERNELS"))
	if len(dirs) == 0 {
		t.Fatal(ErrNoKernel)
	}
	var kernels []Kernel
	for _, d := range dirs {
		k, err := OpenKernel(d)
		if err != nil {
			t.Fatal(err)
		}
		kernels = append(kernels, k)
	}
	busybox := "/bin/busybox"
	if err := requireStatic(busybox); err != nil {
		t.Fatalf("%v: the guest needs Debian's busybox-static (make deps-vm installs it)", err)
	}
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 80*time.Minute)
	defer cancel()

	tests := guestTests
	if only := os.Getenv("NODECTL_VM_ONLY"); only != "" {
		re, err := regexp.Compile(only)
		if err != nil {
			t.Fatalf("NODECTL_VM_ONLY: %v", err)
		}
		tests = slices.DeleteFunc(slices.Clone(tests), func(g GuestTest) bool { return !re.MatchString(g.Name()) })
	}
	work := t.TempDir()
	root := filepath.Join(work, "root")
	start := time.Now()
	// The container runtimes, for stress/launch's runc and gVisor containers on v2 (make deps
	// installs Debian's).
	var tools []string
	for _, rt := range []string{"runc", "runsc"} {
		p, err := exec.LookPath(rt)
		if err != nil {
			t.Fatalf("%s: the guest's container tests need it (make deps installs it)", err)
		}
		tools = append(tools, p)
	}
	if err := Build(ctx, repo, root, tests, busybox, tools, testWriter{t}); err != nil {
		t.Fatal(err)
	}
	t.Logf("built %d test binaries and the guest's tree in %v", len(tests), time.Since(start).Round(time.Second))

	for _, k := range kernels {
		t.Run(k.Release, func(t *testing.T) {
			narrow := bootKernel(ctx, t, k, machine, tests, root, work)
			if !slices.ContainsFunc(tests, func(g GuestTest) bool { return g.Pkg == wideTests[0].Pkg }) {
				return
			}
			t.Run("wide", func(t *testing.T) {
				compareReadCost(t, narrow, bootKernel(ctx, t, k, wide, wideTests, root, work))
			})
		})
	}
}

// compareReadCost holds the run-queue tracer's bytes read an interval, summed in the kernel,
// on the wide machine to 2x the first boot's (issue 33), and logs the whole reads' growth; and
// holds the kernel's per-CPU memory a tracer takes on the wide machine to percpuBudgetKB.
func compareReadCost(t *testing.T, narrow, wide map[string]*Result) {
	name := wideTests[0].Name()
	if narrow[name] == nil || wide[name] == nil {
		t.Fatalf("%s did not run on both machines", name)
	}
	costs := [2]map[string]int{}
	for i, r := range []*Result{narrow[name], wide[name]} {
		lines := r.Lines("runq read cost:")
		if len(lines) == 0 {
			t.Fatalf("%s logged no read cost (skipped?)", name)
		}
		costs[i] = map[string]int{}
		for _, f := range strings.Fields(lines[len(lines)-1]) {
			if k, v, ok := strings.Cut(f, "="); ok {
				if n, err := strconv.Atoi(v); err == nil {
					costs[i][k] = n
				}
			}
		}
	}
	n, w := costs[0], costs[1]
	t.Logf("run-queue read an interval, %d vs %d possible CPUs: summed %d vs %d bytes (x%.2f), whole %d vs %d bytes (x%.1f); the kernel's per-CPU memory of a tracer at %d cgroups %d vs %d KB",
		n["cpus"], w["cpus"], n["summed_bytes"], w["summed_bytes"], float64(w["summed_bytes"])/float64(n["summed_bytes"]),
		n["whole_bytes"], w["whole_bytes"], float64(w["whole_bytes"])/float64(n["whole_bytes"]),
		n["cgroups"], n["percpu_kb_per_tracer"], w["percpu_kb_per_tracer"])
	if w["cpus"] < 4*n["cpus"] {
		t.Errorf("the wide machine has %d possible CPUs, the first %d", w["cpus"], n["cpus"])
	}
	if w["summed_bytes"] > 2*n["summed_bytes"] {
		t.Errorf("summed reads copy %d bytes an interval on %d CPUs, more than 2x the %d on %d", w["summed_bytes"], w["cpus"], n["summed_bytes"], n["cpus"])
	}
	if w["percpu_kb_per_tracer"] > percpuBudgetKB {
		t.Errorf("a run-queue tracer takes %d KB of the kernel's per-CPU memory on %d possible CPUs, more than %d KB", w["percpu_kb_per_tracer"], w["cpus"], percpuBudgetKB)
	}
}

// percpuBudgetKB is the most per-CPU memory a run-queue tracer may take on the wide machine:
// a 16th of the agent's memory limit (deploy/, 128 Mi), which the kernel charges it with. The
// per-CPU maps it had before took 52 MB there at the test's sizes, 170 MB at the agent's.
const percpuBudgetKB = 8 << 10

// bootKernel boots k on m to run tests and returns their results by name.
func bootKernel(ctx context.Context, t *testing.T, k Kernel, m Machine, tests []GuestTest, root, work string) map[string]*Result {
	if err := SetTests(root, tests); err != nil {
		t.Fatal(err)
	}
	if err := AddKernel(root, k); err != nil {
		t.Fatal(err)
	}
	initramfs := filepath.Join(work, k.Release+".cpio")
	if err := Initramfs(ctx, k, filepath.Join(root, "bin", "busybox"), filepath.Join(work, k.Release), initramfs); err != nil {
		t.Fatal(err)
	}
	disk := filepath.Join(work, k.Release+".img")
	if err := Disk(ctx, root, disk, 3<<30); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(disk)

	logPath := filepath.Join(artifacts(t), fmt.Sprintf("vm-%s-%dcpus.log", k.Release, max(m.CPUs, m.MaxCPUs)))
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	start := time.Now()
	boot, err := Run(ctx, k, m, initramfs, disk, logFile, func(s string) {
		t.Logf("%s (%v)", s, time.Since(start).Round(time.Second))
	})
	t.Logf("kernel %s: %v from boot to power-off; console in %s", k.Release, time.Since(start).Round(time.Second), logPath)
	if err != nil {
		t.Errorf("%v; the console's last lines:\n%s", err, strings.Join(boot.Tail, "\n"))
	}
	if boot == nil {
		return nil
	}
	if !strings.Contains(boot.Header, "cgroup2 1 v1 0 ") {
		t.Errorf("the guest has no cgroup2 at /sys/fs/cgroup: %q", boot.Header)
	}
	ran := map[string]*Result{}
	for _, r := range boot.Results {
		ran[r.Name] = r
	}
	for _, g := range tests {
		t.Run(g.Name(), func(t *testing.T) {
			r := ran[g.Name()]
			switch {
			case r == nil:
				t.Fatal("never ran: the guest ended before it")
			case !r.Ended:
				t.Fatalf("did not end: the guest died in it\n%s", r.Failures())
			case r.Code != 0:
				t.Errorf("exit %d after %d s:\n%s", r.Code, r.Seconds, r.Failures())
			}
			for _, l := range r.Leftover {
				t.Errorf("left behind: %s", l)
			}
			for _, s := range r.Skipped() {
				t.Logf("skipped: %s", s)
			}
		})
	}
	// The feature probes' answers on this kernel (features_test.go asserts them by version).
	if r := ran[GuestTest{Pkg: "./record/trace/internal/features"}.Name()]; r != nil {
		probes := r.Lines("features_test.go:")
		if len(probes) == 0 {
			t.Error("the feature probes logged no answer")
		}
		t.Logf("feature probes on %s:\n  %s", k.Release, strings.Join(probes, "\n  "))
	}
	// Last, so that it is in the tail of a long log: what failed, in a line each.
	var failed []string
	for _, g := range tests {
		if r := ran[g.Name()]; r != nil {
			for _, f := range r.FailedTests() {
				failed = append(failed, g.Name()+" "+f)
			}
		}
	}
	if len(failed) > 0 {
		t.Logf("failed in the guest:\n  %s", strings.Join(failed, "\n  "))
	}
	return ran
}

// requireStatic fails for a binary that needs a dynamic loader: the guest has no libraries.
func requireStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked", path)
		}
	}
	return nil
}

func artifacts(t *testing.T) string {
	dir := os.Getenv("NODECTL_TEST_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "nodectl-test-artifacts")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
