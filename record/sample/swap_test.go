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
	"strings"
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

// withSwap enables a swap file of size bytes on a real disk for the test, returns its path,
// and checks at the end that the node's swap areas are as they were.
func withSwap(t *testing.T, size int64) string {
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
	return f.Path
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
	file := withSwap(t, 512<<20)
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
	// The samples begin once the toucher's first round has filled its limit and pushed the rest
	// to swap, and the next faults it back: from then on each round faults back what the last swapped out, so both halves of
	// the window thrash (a first round slowed past 3 s by a loaded machine left the first half
	// without fault-backs, and the workload without its finding).
	touchIn(t, l, path, 128<<20)
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		cg, _ := sample()
		if value(t, cg, path, rundir.MetricMemorySwap) >= 48<<20 && value(t, cg, path, rundir.MetricMemoryMajorFaults) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the toucher did not push 48 MiB to swap and fault it back within 60 s")
		}
	}
	cg0, node0 := sample()
	meta.Start = cg0[0].Time // the node's counters count from here, not from boot
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
	// The swap file as an area: its size and use, and the disk under /var/tmp serving it.
	var areaUsed float64
	var device string
	for _, r := range node2 {
		if r.Metric == rundir.MetricSwapArea && r.Labels[rundir.LabelPath] == file && r.Labels[rundir.LabelName] == rundir.SwapFileUsed {
			areaUsed, device = *r.Value, r.Labels[rundir.LabelDevice]
		}
	}
	if _, err := os.Stat(filepath.Join("/sys/dev/block", device)); areaUsed <= 0 || device == "" || err != nil {
		t.Errorf("swap area %s: used %.0f bytes on device %q (%v), want its use and a disk", file, areaUsed, device, err)
	}

	// The analyzer reads the same samples as swap-thrashing of the workload.
	rep := analyzeRecords(t, meta, cg0, node0, cg1, node1, cg2, node2)
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

// A container's cgroup laid out as the kubelet lays one out (kubepods/burstable/pod<uid>/<id>
// on v1, its systemd slices and scope on v2) with 32 MiB of memory and 16 MiB of swap, as
// LimitedSwap bounds a container (v2 only; v1 by memory+swap), touching 64 MiB: the sampler
// reads its swap limit; on v2 it also reads the swap its limit refused it, and the analyzer
// names its own swap limit, not the node's swap, as what bounded it. v1 counts no refusal
// (memory.memsw.failcnt stays 0 on 6.18) and the toucher is killed between two samples, its
// swap freed: there the finding needs samples of a slower filler, so the test stops at the
// reading.
func TestContainerBoundedByItsSwapLimit(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for swap and cgroups")
	}
	withSwap(t, 256<<20)
	l, parent := testParent(t, "test")
	if l.V1 {
		if _, ok := l.Mounts["memory"]; !ok {
			t.Skip("no memory controller")
		}
	}
	const uid, id = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", "5d0e89f41fc5737e5edeb1944210a5b94679277e10a674022b5f73069079b2f5"
	levels := []string{"kubepods", "burstable", "pod" + uid, id}
	if !l.V1 {
		levels = []string{"kubepods.slice", "kubepods-burstable.slice", "kubepods-burstable-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice", "cri-containerd-" + id + ".scope"}
	}
	path := parent
	for i, level := range levels {
		path += "/" + level
		lim := cgroup.Limits{}
		if i == len(levels)-1 {
			lim = cgroup.Limits{MemoryBytes: 32 << 20, SwapBytes: 16 << 20}
		}
		if err := l.Create(path, lim); err != nil {
			t.Fatal(err)
		}
	}
	container := path
	if _, err := os.Stat(filepath.Join(l.Dir(cgroup.Memory, container), map[bool]string{true: "memory.memsw.limit_in_bytes", false: "memory.swap.max"}[l.V1])); err != nil {
		t.Skipf("no swap accounting: %v", err)
	}
	cgs := NewCgroups(l, func() []string { return []string{container} })
	sys := NewSystem("/proc", "/sys", func() []string { return nil })
	var recs []rundir.Record
	sample := func() []rundir.Record {
		t.Helper()
		now := time.Now()
		cg, err := cgs.SampleFull(now)
		if err != nil {
			t.Fatal(err)
		}
		node, err := sys.Sample(now)
		if err != nil {
			t.Fatal(err)
		}
		recs = append(append(recs, cg...), node...)
		return cg
	}
	first := sample()
	if v := value(t, first, container, rundir.MetricMemorySwapLimit); v != 16<<20 {
		t.Errorf("swap limit %v bytes, want 16 MiB", v)
	}
	touchIn(t, l, container, 64<<20)
	// It fills its memory, then its swap, and is killed: sampled until the kernel says so.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		last := sample()
		if value(t, last, container, rundir.MetricMemoryOOMKills) > 0 {
			t.Logf("OOM-killed; swap %.1f MiB at the last sample", value(t, last, container, rundir.MetricMemorySwap)/(1<<20))
			if l.V1 {
				return
			}
			if refused := value(t, last, container, rundir.MetricMemoryLimitEvents, rundir.LabelKind, rundir.LimitSwap); refused <= 0 {
				t.Error("no swap refusal counted at the swap limit")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the toucher was not OOM-killed within 20 s")
		}
	}

	meta := rundir.NewMeta("swap-limit-test", "test", "/proc", l.V1, time.Second, nil)
	meta.Start = first[0].Time
	rep := analyzeRecords(t, meta, recs)
	for _, f := range rep.Findings {
		if f.ID == analyzer.IDSwapLimit && f.Victim == container {
			t.Logf("%s: %s", f.Severity, f.Summary)
			if f.Severity != analyzer.SeverityCritical {
				t.Errorf("severity %s for a container OOM-killed at its swap limit", f.Severity)
			}
			return
		}
	}
	t.Fatalf("no swap-limit finding for %s: %+v", container, rep.Findings)
}

// analyzeRecords writes a run of meta holding the records, reads it back and analyzes it.
func analyzeRecords(t *testing.T, meta rundir.Meta, batches ...[]rundir.Record) *analyzer.Report {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "run")
	w, err := rundir.Create(dir, meta)
	if err != nil {
		t.Fatal(err)
	}
	for _, recs := range batches {
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
	return rep
}
