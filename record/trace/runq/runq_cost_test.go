package runq

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/nodectl/nodectl/record/trace/internal/cgtest"
	"github.com/nodectl/nodectl/record/trace/internal/features"
)

// What an interval's read copies from the kernel follows the cgroups and pairs that changed,
// not the CPUs: 1,000 cgroups with an entry each (NODECTL_RUNQ_COST_CGROUPS to change), 10 of
// them waking each interval, read by the kernel's sums and, in the same run, whole. The line
// "runq read cost" is what make test-vm compares between a boot of 2 possible CPUs and one of
// many (testvm: the summed bytes must stay within 2x, where the whole read grows with them).
func TestReadCostFollowsChanges(t *testing.T) {
	sum, all, cpus, n, percpu := readCost(t)
	t.Logf("runq read cost: cpus=%d cgroups=%d active=%d summed_bytes=%d summed_calls=%d whole_bytes=%d whole_calls=%d percpu_kb_per_tracer=%d",
		cpus, n, costActive, sum.Bytes, sum.Calls, all.Bytes, all.Calls, percpu)
	if sum.Bytes*10 > all.Bytes {
		t.Errorf("summed reads copied %d bytes an interval, more than a tenth of the whole reads' %d", sum.Bytes, all.Bytes)
	}
}

// BenchmarkRunqRead is TestReadCostFollowsChanges for make bench: bytes and syscalls an
// interval, summed and whole, and their ratio; it fails where the sums copy more than a tenth.
func BenchmarkRunqRead(b *testing.B) {
	for range b.N {
		sum, all, _, _, _ := readCost(b)
		b.ReportMetric(float64(sum.Bytes), "summed-B/interval")
		b.ReportMetric(float64(all.Bytes), "whole-B/interval")
		b.ReportMetric(float64(sum.Calls), "summed-calls/interval")
		b.ReportMetric(float64(all.Bytes)/float64(max(sum.Bytes, 1)), "whole/summed")
		if sum.Bytes*10 > all.Bytes {
			b.Errorf("summed reads copied %d bytes an interval, more than a tenth of the whole reads' %d", sum.Bytes, all.Bytes)
		}
	}
}

// costActive cgroups of readCost's wake each interval.
const costActive = 10

// readCost makes the cgroups, reads them both ways and returns what an interval's read copied
// summed and whole, the possible CPUs, the cgroups, and the kernel's per-CPU memory (KB) a
// tracer took at load, where the maps are allocated: half the growth over loading both (other
// allocations move it too, and a machine that freed some may lend it again: about 0 then).
func readCost(t testing.TB) (sum, all Cost, cpus, n, percpu int) {
	if err := features.HaveSlotHelpers(); err != nil {
		t.Skipf("the kernel cannot sum the maps: %v", err)
	}
	n = 1000
	if s := os.Getenv("NODECTL_RUNQ_COST_CGROUPS"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 20 {
			t.Fatalf("NODECTL_RUNQ_COST_CGROUPS=%q: want a number of cgroups, at least 20", s)
		}
	}
	const active, intervals = costActive, 5
	cfg := Config{ChangedOnly: true, MaxCgroups: uint32(2 * n), MaxPairs: uint32(8 * n)}
	before := percpuKB(t)
	summed := newTracer(t, cfg)
	cfg.noSums = true
	whole := newTracer(t, cfg)
	percpu = (percpuKB(t) - before) / 2

	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("c%04d", i)
	}
	groups := cgtest.Make(t, "cpu", names...)
	// A shell that answers each line with one: moved into a cgroup and poked, it wakes there.
	sh := exec.Command("sh", "-c", `while read x; do echo "$x"; done`)
	in, err := sh.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outPipe, err := sh.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(); _ = sh.Wait() })
	out := bufio.NewScanner(outPipe)
	// asleep waits until the shell is blocked in a system call (its read: busybox's waits in
	// poll), off the CPU and off the run queue: /proc/PID/syscall names the call then, and
	// says "running" before. Its state reads S earlier, before schedule(): a poke then finds it
	// still queued and no wait is recorded. And a shell preempted after it answered records a
	// wait when it runs again, maybe between the two tracers' reads.
	syscall := fmt.Sprintf("/proc/%d/syscall", sh.Process.Pid)
	asleep := func() {
		for start := time.Now(); ; {
			b, err := os.ReadFile(syscall)
			if err != nil {
				t.Fatal(err)
			}
			if f := strings.Fields(string(b)); len(f) > 0 && f[0] != "running" && f[0] != "-1" {
				return
			}
			if time.Since(start) > time.Minute {
				t.Fatalf("the shell is not asleep in a system call after a minute: %s says %q", syscall, b)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	asleep()
	visit := func(g *cgtest.Group) {
		g.Write(t, "cgroup.procs", strconv.Itoa(sh.Process.Pid))
		if _, err := fmt.Fprintln(in, g.ID); err != nil || !out.Scan() {
			t.Fatalf("poking the shell in %s: %v %v", g.Path, err, out.Err())
		}
		asleep()
	}
	for _, name := range names {
		visit(groups[name])
	}
	// What each tracer has counted of each cgroup, from every read (a summed read hands over
	// only what changed), and the waits each lost: a wakeup whose task storage the kernel
	// refused (now and then on 6.1, counted) records no wait, which the checks allow for.
	counts := [2]map[uint64]uint64{{}, {}}
	var lost [2]uint64
	readBoth := func() (a, b Stats) {
		a, b = read(t, summed), read(t, whole)
		for i, st := range []Stats{a, b} {
			for id, h := range st.Latency {
				counts[i][id] = h.Count
			}
			lost[i] = st.Drops[dropReasons[runqDropReasonDROP_STORAGE_FAIL]]
		}
		return a, b
	}
	// Every cgroup has its entry: the first reads hand over everything, and the next ones
	// settle the marks of the epochs just closed. A cgroup without a wait is woken again, up
	// to twice: on this machine kind the kernel fires no sched_switch at all when some system
	// threads leave a CPU (process_api's tokio workers, DAMON's damon-regions: ftrace's own
	// sched_switch event misses the same switches), so the shell's run after one of them is
	// seen by no tracer. A cgroup the tracers miss three times running is the tracers' fault.
	readBoth()
	missing := func() (ids []string) {
		for _, name := range names {
			if counts[1][groups[name].ID] == 0 {
				ids = append(ids, name)
			}
		}
		return ids
	}
	woken := 0
	for range 2 {
		again := missing()
		if len(again) <= int(lost[1]) {
			break
		}
		for _, name := range again {
			visit(groups[name])
		}
		woken += len(again)
		readBoth()
	}
	if m := missing(); len(m) > int(lost[1]) {
		t.Fatalf("%d of %d cgroups have no wait recorded after they were woken three times (%v), %d waits lost to task storage", len(m), n, m, lost[1])
	}
	if woken > 0 {
		t.Logf("%d cgroups were woken again: no tracer saw their first wait", woken)
	}
	for range 3 {
		readBoth()
	}

	for range intervals {
		for _, name := range names[:active] {
			visit(groups[name])
		}
		a, b := readBoth()
		unseen := 0
		for id := range a.Latency {
			if _, ok := b.Latency[id]; !ok {
				unseen++
			}
		}
		if unseen > int(lost[1]) {
			t.Errorf("%d cgroups summed as changed are not in the whole read, %d waits lost to task storage", unseen, lost[1])
		}
		for _, name := range names[:active] {
			id := groups[name].ID
			x, y := counts[0][id], counts[1][id]
			if max(x, y)-min(x, y) > lost[0]+lost[1] || x == 0 {
				t.Errorf("%s woken: %d waits summed, %d read whole, %d+%d lost to task storage", name, x, y, lost[0], lost[1])
			}
		}
		sum.Bytes += a.Cost.Bytes
		sum.Calls += a.Cost.Calls
		all.Bytes += b.Cost.Bytes
		all.Calls += b.Cost.Calls
	}
	cpus, err = ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	per := func(c Cost) Cost { return Cost{Bytes: c.Bytes / intervals, Calls: c.Calls / intervals} }
	return per(sum), per(all), cpus, n, percpu
}

// percpuKB is the kernel's per-CPU memory (/proc/meminfo Percpu), where per-CPU maps' values
// are allocated.
func percpuKB(t testing.TB) int {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "Percpu:" {
			n, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatalf("meminfo %q: %v", l, err)
			}
			return n
		}
	}
	t.Fatal("no Percpu in /proc/meminfo")
	return 0
}
