//go:build linux

package sample

import (
	"testing"
	"time"

	"github.com/nodectl/nodectl/rundir"
)

// The parsers of the memory files, on files as 6.18 writes them (v2 cannot be sampled for real
// on the hybrid test machines).
func TestReadMemoryFiles(t *testing.T) {
	const cg = "/a"
	type want struct {
		metric string
		labels []string
		v      float64
	}
	type parser = func([]rundir.Record, time.Time, string, []byte) ([]rundir.Record, error)
	for name, c := range map[string]struct {
		parse parser
		file  string
		want  []want
	}{
		"v1_memory_stat": {readV1MemoryStat, "cache 8192\nswap 4096\npgmajfault 3\nworkingset_refault_anon 1\n" +
			"hierarchical_memory_limit 9223372036854771712\nhierarchical_memsw_limit 9223372036854771712\n" +
			"total_cache 8192\ntotal_workingset_refault_anon 7\ntotal_workingset_refault_file 8\ntotal_swap 65536\ntotal_pgmajfault 9\n",
			[]want{
				{rundir.MetricMemoryRefaults, []string{rundir.LabelKind, "anon"}, 7},
				{rundir.MetricMemoryRefaults, []string{rundir.LabelKind, "file"}, 8},
				{rundir.MetricMemorySwap, nil, 65536},
				{rundir.MetricMemoryMajorFaults, nil, 9},
			}},
		// Without swap accounting v1 has no swap key: no swap series rather than zeros.
		"v1_memory_stat_no_memsw": {readV1MemoryStat, "hierarchical_memory_limit 67108864\ntotal_pgmajfault 9\n",
			[]want{{rundir.MetricMemoryMajorFaults, nil, 9}}},
		// Memory+swap limited to 96 MiB over 64 MiB of memory (here or by an ancestor): 32 MiB
		// of swap, as v2's memory.swap.max would say.
		"v1_memory_stat_swap_limit": {readV1MemoryStat, "hierarchical_memory_limit 67108864\nhierarchical_memsw_limit 100663296\ntotal_swap 4096\n",
			[]want{{rundir.MetricMemorySwap, nil, 4096}, {rundir.MetricMemorySwapLimit, nil, 32 << 20}}},
		"v1_oom_control": {readFlat(v1OOMControl), "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
			[]want{{rundir.MetricMemoryOOMKills, nil, 2}}},
		"v2_memory_stat": {readFlat(v2MemoryStat), "anon 1000\npgmajfault 12\nworkingset_refault_anon 5\nworkingset_refault_file 6\n" +
			"workingset_activate_anon 1\npswpin 30\npswpout 40\npgscan 9\n",
			[]want{
				{rundir.MetricMemoryMajorFaults, nil, 12},
				{rundir.MetricMemoryRefaults, []string{rundir.LabelKind, "anon"}, 5},
				{rundir.MetricMemoryRefaults, []string{rundir.LabelKind, "file"}, 6},
				{rundir.MetricMemorySwapPages, []string{rundir.LabelOp, "in"}, 30},
				{rundir.MetricMemorySwapPages, []string{rundir.LabelOp, "out"}, 40},
			}},
		"v2_memory_events": {readFlat(v2MemoryEvents), "low 0\nhigh 3\nmax 4\noom 1\noom_kill 1\noom_group_kill 0\n",
			[]want{
				{rundir.MetricMemoryLimitEvents, []string{rundir.LabelKind, "high"}, 3},
				{rundir.MetricMemoryLimitEvents, []string{rundir.LabelKind, "max"}, 4},
				{rundir.MetricMemoryOOMKills, nil, 1},
			}},
		"v2_swap_events": {readFlat(v2SwapEvents), "high 0\nmax 7\nfail 9\n",
			[]want{{rundir.MetricMemoryLimitEvents, []string{rundir.LabelKind, "swap"}, 7}}},
		"v2_cpu_stat_no_controller": {readFlat(v2CPUStat), "usage_usec 2500000\nuser_usec 1\nsystem_usec 2\n",
			[]want{{rundir.MetricCPUUsage, nil, 2.5}}},
	} {
		t.Run(name, func(t *testing.T) {
			recs, err := c.parse(nil, time.Now(), cg, []byte(c.file))
			if err != nil {
				t.Fatal(err)
			}
			if len(recs) != len(c.want) {
				t.Fatalf("%d records, want %d: %+v", len(recs), len(c.want), recs)
			}
			for _, w := range c.want {
				if got := value(t, recs, cg, w.metric, w.labels...); got != w.v {
					t.Errorf("%s %v = %v, want %v", w.metric, w.labels, got, w.v)
				}
			}
		})
	}
	if _, err := readFlat(v1OOMControl)(nil, time.Now(), cg, []byte("oom_kill x\n")); err == nil {
		t.Error("a bad value parsed")
	}
}

// The parsers of v2 io.stat and memory.swap.max, on files as 6.1 writes them.
func TestReadIOStatAndSwapLimit(t *testing.T) {
	const cg = "/a"
	recs, err := readIOStat(nil, time.Now(), cg, []byte("254:0 rbytes=4096 wbytes=8388608 rios=1 wios=20 dbytes=0 dios=0\n"+
		"8:16 rbytes=512 wbytes=0 rios=1 wios=0 dbytes=0 dios=0 cost.vrate=100.00\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 12 {
		t.Fatalf("%d records, want 6 for each of 2 disks: %+v", len(recs), recs)
	}
	for _, w := range []struct {
		metric, dev, op string
		v               float64
	}{
		{rundir.MetricCgroupIOBytes, "254:0", rundir.OpWrite, 8 << 20},
		{rundir.MetricCgroupIOBytes, "254:0", rundir.OpRead, 4096},
		{rundir.MetricCgroupIOs, "254:0", rundir.OpWrite, 20},
		{rundir.MetricCgroupIOBytes, "8:16", rundir.OpRead, 512},
		{rundir.MetricCgroupIOs, "8:16", rundir.OpDiscard, 0},
	} {
		if got := value(t, recs, cg, w.metric, rundir.LabelDevice, w.dev, rundir.LabelOp, w.op); got != w.v {
			t.Errorf("%s %s %s = %v, want %v", w.metric, w.dev, w.op, got, w.v)
		}
	}
	if _, err := readIOStat(nil, time.Now(), cg, []byte("rbytes=1\n")); err == nil {
		t.Error("a line without a device parsed")
	}
	limit := readLimit(rundir.MetricMemorySwapLimit)
	if recs, err := limit(nil, time.Now(), cg, []byte("max\n")); err != nil || len(recs) != 0 {
		t.Errorf("memory.swap.max of max: %+v, %v; want no record", recs, err)
	}
	recs, err = limit(nil, time.Now(), cg, []byte("33554432\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := value(t, recs, cg, rundir.MetricMemorySwapLimit); got != 32<<20 {
		t.Errorf("swap limit %v, want %v", got, 32<<20)
	}
}
