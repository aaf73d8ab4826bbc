package sample

import (
	"bytes"
	"fmt"
	"strconv"
	"time"

	"github.com/nodectl/nodectl/rundir"
)

// Label sets of the cgroup sampler's records. Each is shared by every record that carries it,
// which saves an allocation per record at a thousand cgroups: never modify one.
var (
	labelsAnon     = map[string]string{rundir.LabelKind: rundir.RefaultAnon}
	labelsFile     = map[string]string{rundir.LabelKind: rundir.RefaultFile}
	labelsMax      = map[string]string{rundir.LabelKind: rundir.LimitMax}
	labelsHigh     = map[string]string{rundir.LabelKind: rundir.LimitHigh}
	labelsSwap     = map[string]string{rundir.LabelKind: rundir.LimitSwap}
	labelsSwapIn   = map[string]string{rundir.LabelOp: rundir.SwapIn}
	labelsSwapOut  = map[string]string{rundir.LabelOp: rundir.SwapOut}
	labelsPressure = map[string]map[string]map[string]string{} // resource -> kind -> labels
)

func init() {
	for _, res := range pressureResources {
		labelsPressure[res] = map[string]map[string]string{}
		for _, kind := range []string{rundir.PressureSome, rundir.PressureFull} {
			labelsPressure[res][kind] = map[string]string{rundir.LabelResource: res, rundir.LabelKind: kind}
		}
	}
}

// statKey maps a key of a flat-keyed cgroup file ("key value" lines) to a metric: value×scale.
type statKey struct {
	key    string
	metric string
	scale  float64
	labels map[string]string
}

// The keys read from each flat-keyed file. Keys a kernel does not have yield no record:
// memory.stat's swap only with swap accounting, pswpin/pswpout from 6.12 on v2, workingset
// refaults split by anon and file from 5.9; cpu.stat's throttling only with a CPU controller.
var (
	v1CPUStat = []statKey{
		{"nr_periods", rundir.MetricCPUPeriods, 1, nil},
		{"nr_throttled", rundir.MetricCPUThrottled, 1, nil},
		{"throttled_time", rundir.MetricCPUThrottledTime, 1e-9, nil},
	}
	v2CPUStat = []statKey{
		{"usage_usec", rundir.MetricCPUUsage, 1e-6, nil},
		{"nr_periods", rundir.MetricCPUPeriods, 1, nil},
		{"nr_throttled", rundir.MetricCPUThrottled, 1, nil},
		{"throttled_usec", rundir.MetricCPUThrottledTime, 1e-6, nil},
	}
	// v1's own keys count the cgroup alone; total_* include its children, as v2's keys do.
	v1MemoryStat = []statKey{
		{"total_swap", rundir.MetricMemorySwap, 1, nil},
		{"total_pgmajfault", rundir.MetricMemoryMajorFaults, 1, nil},
		{"total_workingset_refault_anon", rundir.MetricMemoryRefaults, 1, labelsAnon},
		{"total_workingset_refault_file", rundir.MetricMemoryRefaults, 1, labelsFile},
	}
	v1OOMControl = []statKey{
		{keyOOMKill, rundir.MetricMemoryOOMKills, 1, nil},
	}
	v2MemoryStat = []statKey{
		{"pgmajfault", rundir.MetricMemoryMajorFaults, 1, nil},
		{"workingset_refault_anon", rundir.MetricMemoryRefaults, 1, labelsAnon},
		{"workingset_refault_file", rundir.MetricMemoryRefaults, 1, labelsFile},
		{"pswpin", rundir.MetricMemorySwapPages, 1, labelsSwapIn},
		{"pswpout", rundir.MetricMemorySwapPages, 1, labelsSwapOut},
	}
	v2MemoryEvents = []statKey{
		{"high", rundir.MetricMemoryLimitEvents, 1, labelsHigh}, //rundir:other: the kernel's keys
		{"max", rundir.MetricMemoryLimitEvents, 1, labelsMax},   //rundir:other
		{keyOOMKill, rundir.MetricMemoryOOMKills, 1, nil},
	}
	// v2 memory.swap.events: "max" counts the swap allocations its swap.max refused.
	v2SwapEvents = []statKey{
		{"max", rundir.MetricMemoryLimitEvents, 1, labelsSwap}, //rundir:other: the kernel's key
	}
)

// v1 memory.stat's effective limits: the smallest along the cgroup's path, of memory and of
// memory+swap; a value this large is none.
const (
	keyV1MemoryLimit = "hierarchical_memory_limit"
	keyV1MemswLimit  = "hierarchical_memsw_limit"
	v1Unlimited      = 1 << 62
)

// readV1MemoryStat parses v1 memory.stat: v1MemoryStat's keys, and the swap the cgroup may use
// as v2's memory.swap.max says it, memory+swap less memory, recorded only while memory+swap is
// limited (v2's "max" is no record either). Without swap accounting memory.stat has no memsw.
func readV1MemoryStat(out []rundir.Record, now time.Time, cg string, b []byte) ([]rundir.Record, error) {
	var memory, memsw uint64
	var err error
	for len(b) > 0 {
		var key, val []byte
		var ok bool
		if key, val, b, ok = cutFlat(b); !ok {
			continue
		}
		switch string(key) {
		case keyV1MemoryLimit:
			memory, err = strconv.ParseUint(string(val), 10, 64)
		case keyV1MemswLimit:
			memsw, err = strconv.ParseUint(string(val), 10, 64)
		default:
			for _, k := range v1MemoryStat {
				if string(key) == k.key {
					var v uint64
					if v, err = strconv.ParseUint(string(val), 10, 64); err == nil {
						out = append(out, sample(now, cg, k.metric, float64(v)*k.scale, k.labels))
					}
				}
			}
		}
		if err != nil {
			return out, fmt.Errorf("key %s: %w", key, err)
		}
	}
	if memsw > 0 && memsw < v1Unlimited && memsw >= memory {
		out = append(out, sample(now, cg, rundir.MetricMemorySwapLimit, float64(memsw-memory), nil))
	}
	return out, nil
}

// keyOOMKill counts OOM kills in memory.events (v2), memory.oom_control (v1) and /proc/vmstat.
const keyOOMKill = "oom_kill" //rundir:other: the kernel's key

// cutFlat cuts the first line off b, a flat-keyed kernel file ("key value" lines: cgroup files
// such as memory.stat, memory.events and cpu.stat, and /proc/vmstat): its key and value (ok is
// false for a line without them) and the rest. Callers loop over it rather than an iterator,
// whose closures cost the sampler seven allocations a file.
func cutFlat(b []byte) (key, val, rest []byte, ok bool) {
	line, rest, _ := bytes.Cut(b, []byte{'\n'})
	key, val, ok = bytes.Cut(line, []byte{' '})
	return key, val, rest, ok
}

// flatUint is key's value in a flat-keyed file; ok is false when the file has no such key.
func flatUint(b []byte, key string) (v uint64, ok bool, err error) {
	for len(b) > 0 {
		var k, val []byte
		k, val, b, ok = cutFlat(b)
		if ok && string(k) == key {
			v, err = strconv.ParseUint(string(val), 10, 64)
			if err != nil {
				return 0, false, fmt.Errorf("key %s: %w", key, err)
			}
			return v, true, nil
		}
	}
	return 0, false, nil
}

// readFlat returns a parser of a flat-keyed file that appends a record per key of keys found.
func readFlat(keys []statKey) func([]rundir.Record, time.Time, string, []byte) ([]rundir.Record, error) {
	return func(out []rundir.Record, now time.Time, cg string, b []byte) ([]rundir.Record, error) {
		for len(b) > 0 {
			var key, val []byte
			var ok bool
			if key, val, b, ok = cutFlat(b); !ok {
				continue
			}
			for _, k := range keys {
				if string(key) != k.key {
					continue
				}
				v, err := strconv.ParseUint(string(val), 10, 64)
				if err != nil {
					return out, fmt.Errorf("key %s: %w", k.key, err)
				}
				out = append(out, sample(now, cg, k.metric, float64(v)*k.scale, k.labels))
			}
		}
		return out, nil
	}
}

// readValue returns a parser of a single-value file.
func readValue(metric string, scale float64, labels map[string]string) func([]rundir.Record, time.Time, string, []byte) ([]rundir.Record, error) {
	return func(out []rundir.Record, now time.Time, cg string, b []byte) ([]rundir.Record, error) {
		v, err := strconv.ParseUint(string(bytes.TrimSpace(b)), 10, 64)
		if err != nil {
			return out, err
		}
		return append(out, sample(now, cg, metric, float64(v)*scale, labels)), nil
	}
}

// readLimit returns a parser of a v2 limit file: a number of bytes, or "max" for none, which
// yields no record.
func readLimit(metric string) func([]rundir.Record, time.Time, string, []byte) ([]rundir.Record, error) {
	value := readValue(metric, 1, nil)
	return func(out []rundir.Record, now time.Time, cg string, b []byte) ([]rundir.Record, error) {
		if string(bytes.TrimSpace(b)) == rundir.LimitMax { // the word v2 writes for none, as the label's
			return out, nil
		}
		return value(out, now, cg, b)
	}
}

// ioStatKeys are v2 io.stat's keys: the metric and op of each.
var ioStatKeys = map[string]struct{ metric, op string }{
	"rbytes": {rundir.MetricCgroupIOBytes, rundir.OpRead},
	"wbytes": {rundir.MetricCgroupIOBytes, rundir.OpWrite},
	"dbytes": {rundir.MetricCgroupIOBytes, rundir.OpDiscard},
	"rios":   {rundir.MetricCgroupIOs, rundir.OpRead},
	"wios":   {rundir.MetricCgroupIOs, rundir.OpWrite},
	"dios":   {rundir.MetricCgroupIOs, rundir.OpDiscard},
}

// readIOStat parses v2 io.stat: a line per disk the cgroup did I/O on, "MAJ:MIN key=value ...";
// keys it does not know (the io.cost and latency controllers' own) are left.
func readIOStat(out []rundir.Record, now time.Time, cg string, b []byte) ([]rundir.Record, error) {
	for len(b) > 0 {
		var line []byte
		line, b, _ = bytes.Cut(b, []byte{'\n'})
		fields := bytes.Fields(line)
		if len(fields) == 0 {
			continue
		}
		dev := string(fields[0])
		if !bytes.ContainsRune(fields[0], ':') {
			return out, fmt.Errorf("io.stat line %q: no MAJ:MIN first", line)
		}
		for _, f := range fields[1:] {
			key, val, ok := bytes.Cut(f, []byte{'='})
			k, known := ioStatKeys[string(key)]
			if !ok || !known {
				continue
			}
			v, err := strconv.ParseUint(string(val), 10, 64)
			if err != nil {
				return out, fmt.Errorf("io.stat %s %s: %w", dev, key, err)
			}
			out = append(out, sample(now, cg, k.metric, float64(v), map[string]string{rundir.LabelDevice: dev, rundir.LabelOp: k.op}))
		}
	}
	return out, nil
}

// readPressure returns a parser of resource's PSI file: the total= of each line, in seconds.
func readPressure(res string) func([]rundir.Record, time.Time, string, []byte) ([]rundir.Record, error) {
	return func(out []rundir.Record, now time.Time, cg string, b []byte) ([]rundir.Record, error) {
		for len(b) > 0 {
			var kind, total []byte
			var ok bool
			kind, total, b, ok = cutPressure(b)
			labels := labelsPressure[res][string(kind)]
			if labels == nil || !ok {
				continue
			}
			us, err := strconv.ParseUint(string(total), 10, 64)
			if err != nil {
				return out, fmt.Errorf("%s total: %w", kind, err)
			}
			out = append(out, sample(now, cg, rundir.MetricCgroupPressure, float64(us)/1e6, labels))
		}
		return out, nil
	}
}

// cutPressure cuts the first line off b, a PSI file: its kind (some, full) and total= (µs; ok
// is false for a line without one) and the rest.
func cutPressure(b []byte) (kind, total, rest []byte, ok bool) {
	line, rest, _ := bytes.Cut(b, []byte{'\n'})
	kind, fields, _ := bytes.Cut(line, []byte{' '})
	_, total, ok = bytes.Cut(fields, []byte("total="))
	total, _, _ = bytes.Cut(total, []byte{' '})
	return kind, total, rest, ok
}
