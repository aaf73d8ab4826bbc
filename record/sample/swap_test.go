//go:build linux

package sample

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nodectl/nodectl/analyzer"
	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/host/swapfile"
	"github.com/nodectl/nodectl/rundir"
)

// touchEnv makes the test binary a memory toucher (see TestMain) of that many bytes.
const touchEnv = "NODECTL_TEST_TOUCH_BYTES"

func TestMain(m *testing.M) {
	if v := os.Getenv(touchEnv); v != "" {
		touch(v)
		return
	}
	os.Exit(m.Run())
}

// touch maps size bytes of anonymous memory once it has read a line (it has been moved to its
// cgroup by then, so every page is charged there) and writes to every page, round after round,
// until killed: a working set it keeps faulting back when its cgroup holds less.
func touch(size string) {
	n, err := strconv.Atoi(size)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		os.Exit(2)
	}
	mem, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	page := os.Getpagesize()
	for round := byte(1); ; round++ {
		for i := 0; i < n; i += page {
			mem[i] = round
		}
	}
}

// touchIn starts a memory toucher of size bytes in path's cgroup, killed when the test ends.
func touchIn(t *testing.T, l *cgroup.Layout, path string, size int) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", touchEnv, size))
	cmd.Stderr = os.Stderr
	gate, err := cmd.StdinPipe()
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
	if err := l.AddProc(path, cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if _, err := gate.Write([]byte("go\n")); err != nil {
		t.Fatalf("releasing the toucher: %v", err)
	}
}

// withSwap enables a swap file of size bytes on a real disk for the test, and checks at the
// end that the node's swap areas are as they were.
func withSwap(t *testing.T, size int64) {
	t.Helper()
	before, err := swapfile.Active("/proc")
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("/var/tmp", "nodectl-swap-")
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last to first: this one after the swap file's removal.
	t.Cleanup(func() {
		os.RemoveAll(dir)
		after, err := swapfile.Active("/proc")
		if err != nil {
			t.Error(err)
		} else if !slices.Equal(before, after) {
			t.Errorf("swap areas %v after the test, %v before", after, before)
		}
	})
	f, err := swapfile.Create(filepath.Join(dir, "swap"), size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Remove(); err != nil {
			t.Error(err)
		}
	})
	if err := f.Enable(-1); err != nil {
		t.Fatal(err)
	}
}

// A memcg limited to half of what its process keeps touching, with swap on and memsw unlimited:
// the sampler sees the cgroup's swap, its major faults rising, its limit hits, and the node's
// pswpout moving.
func TestCgroupSwapThrashing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for swap and cgroups")
	}
	// The processes must be gone before swapoff, which would page their memory back in: the
	// swap file's cleanup is registered first, so it runs after theirs.
	withSwap(t, 512<<20)
	l, parent := testParent(t, "test")
	if l.V1 {
		if _, ok := l.Mounts["memory"]; !ok {
			t.Skip("no memory controller")
		}
	}
	path := parent + "/thrash"
	if err := l.Create(path, cgroup.Limits{MemoryBytes: 64 << 20}); err != nil {
		t.Fatal(err)
	}
	cgs := NewCgroups(l, func() []string { return []string{path} })
	sys := NewSystem("/proc", "/sys", func() []string { return nil })
	sample := func() (cg, node []rundir.Record) {
		t.Helper()
		now := time.Now()
		cg, err := cgs.Sample(now)
		if err != nil {
			t.Fatal(err)
		}
		if node, err = sys.Sample(now); err != nil {
			t.Fatal(err)
		}
		return cg, node
	}
	meta := rundir.NewMeta("swap-test", "test", "/proc", l.V1, 3*time.Second, nil)
	meta.Workloads = []rundir.Workload{{Name: "thrash", Kind: "memory", Cgroup: path, Memory: "64Mi"}}
	cg0, node0 := sample()
	meta.Start = cg0[0].Time // the node's counters count from here, not from boot
	touchIn(t, l, path, 128<<20)
	time.Sleep(3 * time.Second)
	cg1, node1 := sample()
	time.Sleep(3 * time.Second)
	cg2, node2 := sample()

	get := func(recs []rundir.Record, metric string, labels ...string) float64 {
		return value(t, recs, path, metric, labels...)
	}
	pswpout := value(t, node2, "", rundir.MetricVmstat, rundir.LabelName, "pswpout") - value(t, node0, "", rundir.MetricVmstat, rundir.LabelName, "pswpout")
	swap := get(cg2, rundir.MetricMemorySwap)
	maj1 := get(cg1, rundir.MetricMemoryMajorFaults) - get(cg0, rundir.MetricMemoryMajorFaults)
	maj2 := get(cg2, rundir.MetricMemoryMajorFaults) - get(cg1, rundir.MetricMemoryMajorFaults)
	refaults := get(cg2, rundir.MetricMemoryRefaults, rundir.LabelKind, "anon") - get(cg0, rundir.MetricMemoryRefaults, rundir.LabelKind, "anon")
	hits := get(cg2, rundir.MetricMemoryLimitEvents, rundir.LabelKind, "max") - get(cg0, rundir.MetricMemoryLimitEvents, rundir.LabelKind, "max")
	usage := get(cg2, rundir.MetricMemoryUsage)
	t.Logf("swap %.1f MiB, usage %.1f MiB, major faults +%.0f then +%.0f, anon refaults +%.0f, limit hits +%.0f, node pswpout +%.0f pages",
		swap/(1<<20), usage/(1<<20), maj1, maj2, refaults, hits, pswpout)
	if swap <= 0 {
		t.Error("no swap charged to a cgroup at half its working set")
	}
	// At most the limit is in memory, so about half of the 128 MiB is in swap.
	if swap < 32<<20 {
		t.Errorf("swap %.1f MiB, want at least 32 of the 64 MiB that do not fit", swap/(1<<20))
	}
	if maj1 <= 0 || maj2 <= 0 {
		t.Errorf("major faults +%v then +%v: a process touching twice its limit keeps faulting", maj1, maj2)
	}
	if hits <= 0 {
		t.Error("no limit hits recorded")
	}
	if pswpout <= 0 {
		t.Error("the node's pswpout did not move")
	}
	if v := get(cg2, rundir.MetricMemoryOOMKills); v != 0 {
		t.Errorf("%v OOM kills; with swap the cgroup should not need any", v)
	}
	if usage > 64<<20 {
		t.Errorf("usage %.1f MiB over the 64 MiB limit", usage/(1<<20))
	}

	// The analyzer reads the same samples as swap-thrashing of the workload.
	dir := filepath.Join(t.TempDir(), "run")
	w, err := rundir.Create(dir, meta)
	if err != nil {
		t.Fatal(err)
	}
	for _, recs := range [][]rundir.Record{cg0, node0, cg1, node1, cg2, node2} {
		if err := w.Append(recs...); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	run, err := rundir.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := analyzer.Analyze(run)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range rep.Findings {
		if f.ID == analyzer.IDSwapThrashing && f.Victim == "thrash" {
			t.Logf("%s: %s", f.Severity, f.Summary)
			return
		}
	}
	t.Fatalf("no swap-thrashing finding for the workload: %+v", rep.Findings)
}

// The node's memory and swap totals and the vmstat counters that explain reclaim and swap.
func TestSystemMemory(t *testing.T) {
	recs, err := NewSystem("/proc", "/sys", func() []string { return nil }).Sample(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if v := value(t, recs, "", rundir.MetricMeminfo, rundir.LabelName, "MemTotal"); v < 1<<30 {
		t.Errorf("MemTotal %v bytes", v)
	}
	if total, free := value(t, recs, "", rundir.MetricMeminfo, rundir.LabelName, "SwapTotal"),
		value(t, recs, "", rundir.MetricMeminfo, rundir.LabelName, "SwapFree"); free > total {
		t.Errorf("SwapFree %v over SwapTotal %v", free, total)
	}
	value(t, recs, "", rundir.MetricMeminfo, rundir.LabelName, "MemAvailable")
	for _, name := range []string{"pswpin", "pswpout", "pgmajfault", "workingset_refault_anon", "workingset_refault_file",
		"allocstall_normal", "pgscan_direct", "pgscan_kswapd", "pgsteal_direct", "pgsteal_kswapd", "compact_stall"} {
		value(t, recs, "", rundir.MetricVmstat, rundir.LabelName, name)
	}
}
