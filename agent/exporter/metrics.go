package exporter

import (
	"math"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

// The labels every per-cgroup series carries: the cgroup's identity and its kind (kubeid.Classify).
const (
	LabelWorkload = "workload"
	LabelKind     = "kind" //rundir:other: the workload's kind, not a record's kind label
)

// Labels that rename a record's kind label, which the workload's kind label takes.
const (
	labelStall   = "stall"   // PSI: some|full
	labelReclaim = "reclaim" //rundir:other: direct|memcg, not the program
	labelLRU     = "lru"     // refaults: anon|file
	labelLimit   = "limit"   //rundir:other: max|high|swap
)

// Preemptor classes: the preemptor label of the run-queue waits. A preemptor cgroup is
// collapsed into one of them, so the label stays bounded whatever runs on the node.
const (
	PreemptorNeighbour = "neighbour" // another workload
	PreemptorOwn       = "own"       // the workload itself (its other tasks)
	PreemptorKernel    = "kernel"    // a kernel thread
	PreemptorIdle      = "idle"      // nobody: the CPU went idle with the task runnable
	PreemptorThrottled = "throttled" // the workload's, or an ancestor's, CPU quota ran out
)

// bucketBounds are the histograms' upper bounds in seconds: powers of 4 from 2^12 ns
// (4.096 µs) to 2^32 ns (4.29 s), 11 bounds and +Inf, 12 buckets. Each is a power of two
// nanoseconds, so every log2 bucket falls whole into one of them and the counts stay exact.
var bucketBounds = func() []float64 {
	b := make([]float64, 11)
	for j := range b {
		b[j] = math.Ldexp(1, 12+2*j) / 1e9
	}
	return b
}()

// nBuckets counts +Inf.
const nBuckets = 12

// mergedBucket maps a log2 bucket k, [2^k, 2^(k+1)) ns, to the first bound at or above
// 2^(k+1); past the last bound, to +Inf (nBuckets-1).
var mergedBucket = func() (m [hist.Slots]uint8) {
	for k := range m {
		j := max(0, (k+1-12+1)/2)
		m[k] = uint8(min(j, nBuckets-1))
	}
	return m
}()

// valueType is how a series adds up its sources.
type valueType uint8

const (
	counter   valueType = iota // each source's increases, resets included, add up
	gauge                      // the sum of each source's latest value
	histogram                  // each source's new events, into bucketBounds
)

// spec is one exported metric and how records feed it.
type spec struct {
	desc    *prometheus.Desc
	typ     valueType
	scale   float64   // the record's value in the exported unit
	node    bool      // no workload labels: the node's
	src     [2]string // the record's label keys that tell one cgroup's sources apart
	labels  int       // how many of the src values are exported (in order), after workload and kind
	seconds bool      // a counter of seconds, which ranks its workload for the series budget
	// preemptor: src[0] is the preemptor cgroup, exported as its class.
	preemptor bool
}

// descs and names are every metric the exporter makes, and metricLabels each one's label names, for
// Describe and the tests of the docs and of the Grafana dashboards.
var (
	descs        []*prometheus.Desc
	names        []string
	metricLabels = map[string][]string{}
)

func newDesc(name, help string, ls ...string) *prometheus.Desc {
	d := prometheus.NewDesc(name, help, ls, nil)
	descs, names = append(descs, d), append(names, name)
	metricLabels[name] = ls
	return d
}

func newSpec(name, help string, typ valueType, labels ...string) *spec {
	return &spec{desc: newDesc(name, help, append([]string{LabelWorkload, LabelKind}, labels...)...),
		typ: typ, scale: 1, labels: len(labels), seconds: typ == counter && seconds(name)}
}

func newNodeSpec(name, help string, typ valueType, labels ...string) *spec {
	return &spec{desc: newDesc(name, help, labels...), typ: typ, scale: 1, node: true, labels: len(labels)}
}

// keyed says which record labels tell sources apart; the first `labels` of them are exported.
func (s *spec) keyed(keys ...string) *spec {
	copy(s.src[:], keys)
	return s
}

func (s *spec) scaled(f float64) *spec {
	s.scale = f
	return s
}

// pageBytes converts the kernel's page counts: the records come from this node.
var pageBytes = float64(os.Getpagesize())

// Per-cgroup metrics, by the record metric that feeds them.
var specs = map[string]*spec{
	rundir.MetricRunqLatency: newSpec("nodectl_runq_latency_seconds",
		"Run-queue latency of the workload's tasks: wakeup or preemption to running.", histogram),
	rundir.MetricRunqPreemptWait: newSpec("nodectl_runq_preempt_wait_seconds_total",
		"Time the workload's tasks waited to run again after being preempted, by preemptor class.", counter, rundir.LabelPreemptor).
		keyed(rundir.LabelPreemptor).preempted(),
	rundir.MetricRunqWakeupWait: newSpec("nodectl_runq_wakeup_wait_seconds_total",
		"Time the workload's tasks waited to run after a wakeup on a busy CPU, by the class of what ran before them.", counter, rundir.LabelPreemptor).
		keyed(rundir.LabelPreemptor).preempted(),
	rundir.MetricCPUUsage: newSpec("nodectl_cpu_usage_seconds_total",
		"CPU time the workload used.", counter),
	rundir.MetricCPUPeriods: newSpec("nodectl_cpu_periods_total",
		"CFS enforcement periods that elapsed while the workload had runnable tasks.", counter),
	rundir.MetricCPUThrottled: newSpec("nodectl_cpu_throttled_periods_total",
		"Periods in which the workload ran out of CPU quota.", counter),
	rundir.MetricCPUThrottledTime: newSpec("nodectl_cpu_throttled_seconds_total",
		"Time the workload's tasks were throttled by its CPU quota.", counter),
	rundir.MetricFsyncLatency: newSpec("nodectl_fsync_latency_seconds",
		"Latency of the workload's fsync, fdatasync and sync_file_range calls, all devices.", histogram, rundir.LabelSyscall).
		keyed(rundir.LabelSyscall, rundir.LabelDevice),
	rundir.MetricBlkQueue: newSpec("nodectl_blk_queue_seconds",
		"Time the workload's block requests waited in the queue: insert to issue.", histogram, rundir.LabelDevice, rundir.LabelOp).
		keyed(rundir.LabelDevice, rundir.LabelOp),
	rundir.MetricBlkService: newSpec("nodectl_blk_service_seconds",
		"Time the device took to serve the workload's block requests: issue to completion.", histogram, rundir.LabelDevice, rundir.LabelOp).
		keyed(rundir.LabelDevice, rundir.LabelOp),
	rundir.MetricReclaimStall: newSpec("nodectl_reclaim_stall_seconds",
		"Time the workload's tasks stalled in one memory reclaim: direct (the node short of memory) or memcg (a cgroup limit).", histogram, labelReclaim).
		keyed(rundir.LabelKind),
	rundir.MetricCompactionStall: newSpec("nodectl_compaction_stall_seconds",
		"Time the workload's tasks stalled in one direct memory compaction.", histogram),
	rundir.MetricOOMKills: newSpec("nodectl_oom_kills_total",
		"Processes of the workload's own cgroup the OOM killer killed (traced).", counter),
	rundir.MetricMemoryOOMKills: newSpec("nodectl_memory_oom_kills_total",
		"OOM kills the memory controller counts for the workload's cgroup (memory.events: its descendants too on cgroup v2).", counter),
	rundir.MetricCgroupPressure: newSpec("nodectl_cgroup_pressure_seconds_total",
		"Time some, or all (full), of the workload's non-idle tasks stalled on a resource (cgroup PSI).", counter, rundir.LabelResource, labelStall).
		keyed(rundir.LabelResource, rundir.LabelKind),
	rundir.MetricMemoryUsage: newSpec("nodectl_memory_usage_bytes",
		"Memory charged to the workload's cgroup.", gauge),
	rundir.MetricMemorySwap: newSpec("nodectl_memory_swap_bytes",
		"Swap charged to the workload's cgroup.", gauge),
	rundir.MetricMemorySwapPages: newSpec("nodectl_memory_swap_io_bytes_total",
		"Memory of the workload swapped in and out (memory.stat pswpin and pswpout, kernel 6.12+).", counter, rundir.LabelOp).
		keyed(rundir.LabelOp).scaled(pageBytes),
	rundir.MetricMemoryMajorFaults: newSpec("nodectl_memory_major_faults_total",
		"Page faults of the workload that had to read from disk or swap.", counter),
	rundir.MetricMemoryRefaults: newSpec("nodectl_memory_refaults_total",
		"Evicted pages of the workload faulted back in, by LRU (anon|file).", counter, labelLRU).
		keyed(rundir.LabelKind),
	rundir.MetricMemoryLimitEvents: newSpec("nodectl_memory_limit_events_total",
		"Times the workload's memory usage hit its limit (max), went over its high boundary (high), or was refused swap at its swap limit (swap).", counter, labelLimit).
		keyed(rundir.LabelKind),
}

// preemptorMetrics are the record metrics of the specs with a preemptor.
var preemptorMetrics = func() (ms []string) {
	for m, s := range specs {
		if s.preemptor {
			ms = append(ms, m)
		}
	}
	return ms
}()

// preempted marks a run-queue wait: its preemptor label is a class.
func (s *spec) preempted() *spec {
	s.preemptor = true
	return s
}

// Node metrics.
var (
	nodePressure = newNodeSpec("nodectl_node_pressure_seconds_total",
		"Time some, or all (full), of the node's non-idle tasks stalled on a resource (/proc/pressure).", counter, rundir.LabelResource, labelStall).
		keyed(rundir.LabelResource, rundir.LabelKind)
	nodeSwapIO = newNodeSpec("nodectl_node_swap_io_bytes_total",
		"Memory the node swapped in and out (vmstat pswpin, pswpout).", counter, rundir.LabelOp).scaled(pageBytes)
	nodeRefaults = newNodeSpec("nodectl_node_refaults_total",
		"Evicted pages faulted back in on the node, by LRU (vmstat workingset_refault_anon, _file).", counter, labelLRU)
	nodeDirectReclaims = newNodeSpec("nodectl_node_direct_reclaims_total",
		"Allocations that entered direct reclaim on the node (vmstat allocstall_*).", counter)
	nodeReclaimed = newNodeSpec("nodectl_node_reclaimed_bytes_total",
		"Memory the node reclaimed, by reclaimer (vmstat pgsteal_kswapd, pgsteal_direct).", counter, labelReclaimer).scaled(pageBytes)
	nodeMajorFaults = newNodeSpec("nodectl_node_major_faults_total",
		"Page faults on the node that had to read from disk or swap (vmstat pgmajfault).", counter)
	nodeOOMKills = newNodeSpec("nodectl_node_oom_kills_total",
		"Processes the OOM killer killed on the node (vmstat oom_kill).", counter)
	nodeMemory = newNodeSpec("nodectl_node_memory_bytes",
		"The node's memory and swap, from /proc/meminfo (MemTotal, MemAvailable, SwapTotal, SwapFree).", gauge, labelField).
		keyed(rundir.LabelName)
)

const (
	labelReclaimer = "reclaimer"
	labelField     = "field"
	reclaimKswapd  = "kswapd"
)

// nodeSpecs are the node metrics fed by a record metric of their own.
var nodeSpecs = map[string]*spec{
	rundir.MetricSystemPressure: nodePressure,
	rundir.MetricMeminfo:        nodeMemory,
	rundir.MetricDiskIOs: newNodeSpec("nodectl_node_disk_ios_total",
		"Reads and writes the node's disks completed (diskstats).", counter, rundir.LabelDevice, rundir.LabelOp).
		keyed(rundir.LabelDevice, rundir.LabelOp),
	rundir.MetricDiskBytes: newNodeSpec("nodectl_node_disk_bytes_total",
		"Bytes the node's disks read and wrote (diskstats).", counter, rundir.LabelDevice, rundir.LabelOp).
		keyed(rundir.LabelDevice, rundir.LabelOp),
	rundir.MetricDiskIOTime: newNodeSpec("nodectl_node_disk_io_seconds_total",
		"Time the node's disks were busy (diskstats).", counter, rundir.LabelDevice).
		keyed(rundir.LabelDevice),
	rundir.MetricDiskWeightedIOTime: newNodeSpec("nodectl_node_disk_weighted_io_seconds_total",
		"Time the node's disks' requests spent queued and in service, summed over requests (diskstats).", counter, rundir.LabelDevice).
		keyed(rundir.LabelDevice),
}

// vmstatRoute is where a /proc/vmstat counter goes; several may add up into one series.
type vmstatRoute struct {
	spec  *spec
	label string
}

var vmstatRoutes = map[string]vmstatRoute{
	"pswpin":                  {nodeSwapIO, rundir.SwapIn},
	"pswpout":                 {nodeSwapIO, rundir.SwapOut},
	"workingset_refault_anon": {nodeRefaults, rundir.RefaultAnon},
	"workingset_refault_file": {nodeRefaults, rundir.RefaultFile},
	"pgsteal_kswapd":          {nodeReclaimed, reclaimKswapd},
	"pgsteal_direct":          {nodeReclaimed, rundir.ReclaimDirect},
	"pgmajfault":              {nodeMajorFaults, ""},
	"oom_kill":                {nodeOOMKills, ""}, //rundir:other: the vmstat counter
}

// allocstallPrefix starts the per-zone direct reclaim counters, summed into one.
const allocstallPrefix = "allocstall_"

// sourceKey tells apart the series one cgroup (or the node) feeds into the exporter: the
// record's metric and the values of its spec's src labels.
type sourceKey struct {
	metric string
	a, b   string
}

// route is where a sample goes: its spec, its source key and its exported label values (a
// preemptor's class is decided later, per source). ok is false for what is not exported.
func route(r *rundir.Record) (s *spec, key sourceKey, out [2]string, ok bool) {
	if r.Metric == rundir.MetricVmstat {
		name := r.Labels[rundir.LabelName]
		v, ok := vmstatRoutes[name]
		if !ok && strings.HasPrefix(name, allocstallPrefix) {
			v, ok = vmstatRoute{spec: nodeDirectReclaims}, true
		}
		return v.spec, sourceKey{metric: r.Metric, a: name}, [2]string{v.label}, ok
	}
	s, ok = specs[r.Metric]
	if !ok {
		if s, ok = nodeSpecs[r.Metric]; !ok {
			return nil, key, out, false
		}
	}
	key = sourceKey{metric: r.Metric}
	if s.src[0] != "" {
		key.a = r.Labels[s.src[0]]
	}
	if s.src[1] != "" {
		key.b = r.Labels[s.src[1]]
	}
	v := [2]string{key.a, key.b}
	copy(out[:s.labels], v[:s.labels])
	return s, key, out, true
}
