package exporter

import (
	"math"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/nodectl/nodectl/host/kubeid"
	"github.com/nodectl/nodectl/record/collect"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

const (
	uid    = "0a1b2c3d-4e5f-6789-abcd-ef0123456789"
	usid   = "0a1b2c3d_4e5f_6789_abcd_ef0123456789"
	cid    = "3f2a9c0d1e4b5a6978877665544332211ffeeddccbbaa99887766554433221100"
	disk   = "8:0"
	disk2  = "8:16"
	mapRun = "runq_latency"
)

var (
	cgPod       = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + usid + ".slice/cri-containerd-" + cid + ".scope"
	idPod       = "kubepods/burstable/pod" + uid + "/" + cid[:12]
	cgKubelet   = "/system.slice/kubelet.service"
	cgNeighbour = "/kubepods/besteffort/pod99999999-0000-0000-0000-000000000000/abcdefabcdef0123"
	t0          = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
)

// rec is a sample as the tracer and the samplers make them; labels are key, value pairs.
func rec(metric, cgroup string, v float64, labels ...string) rundir.Record {
	return rundir.Record{Type: rundir.TypeSample, Time: t0, Metric: metric, Cgroup: cgroup, Value: &v, Labels: pairs(labels)}
}

func histRec(metric, cgroup string, h hist.Log2, labels ...string) rundir.Record {
	return rundir.Record{Type: rundir.TypeSample, Time: t0, Metric: metric, Cgroup: cgroup, Hist: &h, Labels: pairs(labels)}
}

func pairs(kv []string) map[string]string {
	if len(kv) == 0 {
		return nil
	}
	m := map[string]string{}
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// log2 is base's counts n times over, with a sum in each bucket's middle: a histogram that
// grows with n as the kernel's does.
func log2(n uint64, base []uint64) hist.Log2 {
	h := hist.Log2{Buckets: make([]uint64, len(base))}
	for k, c := range base {
		h.Buckets[k] = c * n
		h.Count += c * n
		mid := uint64(1)<<k + uint64(1)<<k/2
		h.SumNs += c * n * mid
	}
	return h
}

// Log2 inputs spread from the first bucket to past the last bound (2^32 ns).
var (
	baseRunq  = []uint64{1, 0, 2, 3, 0, 0, 0, 0, 0, 0, 4, 5, 6, 7, 8, 9, 10, 0, 3, 2, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 2, 0, 1}
	baseFsync = []uint64{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 4, 8, 4, 2, 1, 1}
	baseBlk   = []uint64{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 5, 9, 5, 3, 1}
)

// node is a node as the session sees it at tick n: the tracer's full snapshot, which the
// session passes through collect.Changes, its events, and the samplers' readings.
type node struct{ changes collect.Changes }

func (nd *node) batch(n int) []rundir.Record {
	f := float64(n)
	u := uint64(n)
	tracer := []rundir.Record{
		histRec(rundir.MetricRunqLatency, cgPod, log2(u, baseRunq)),
		histRec(rundir.MetricRunqLatency, cgKubelet, log2(1, baseRunq)), // unchanged after tick 1
		rec(rundir.MetricRunqPreemptWait, cgPod, 1.5*f, rundir.LabelPreemptor, cgKubelet),
		rec(rundir.MetricRunqPreemptWait, cgPod, 2.25, rundir.LabelPreemptor, cgNeighbour),
		rec(rundir.MetricRunqPreemptWait, cgPod, 0.75, rundir.LabelPreemptor, "<unknown:99>"),
		rec(rundir.MetricRunqPreemptWait, cgPod, 0.5*f, rundir.LabelPreemptor, cgPod),
		rec(rundir.MetricRunqPreemptWait, cgPod, 0.25, rundir.LabelPreemptor, rundir.CgroupKernel),
		rec(rundir.MetricRunqPreemptWait, cgPod, 0.125*f, rundir.LabelPreemptor, rundir.CgroupIdle),
		rec(rundir.MetricRunqPreemptWait, cgPod, f, rundir.LabelPreemptor, rundir.CgroupThrottled),
		rec(rundir.MetricRunqPreemptions, cgPod, 10*f, rundir.LabelPreemptor, cgKubelet),
		rec(rundir.MetricRunqWakeupWait, cgPod, 0.5*f, rundir.LabelPreemptor, cgKubelet),
		rec(rundir.MetricRunqPreemptWait, cgKubelet, 0.5*f, rundir.LabelPreemptor, cgPod),
		histRec(rundir.MetricFsyncLatency, cgPod, log2(u, baseFsync), rundir.LabelSyscall, rundir.SyscallFsync, rundir.LabelDevice, disk),
		histRec(rundir.MetricFsyncLatency, cgPod, log2(1, baseFsync), rundir.LabelSyscall, rundir.SyscallFsync, rundir.LabelDevice, disk2),
		histRec(rundir.MetricFsyncLatency, cgPod, log2(u, baseFsync), rundir.LabelSyscall, rundir.SyscallFdatasync),
		histRec(rundir.MetricBlkQueue, cgPod, log2(u, baseBlk), rundir.LabelDevice, disk, rundir.LabelOp, rundir.OpWrite),
		histRec(rundir.MetricBlkService, cgPod, log2(u, baseBlk), rundir.LabelDevice, disk, rundir.LabelOp, rundir.OpWrite),
		rec(rundir.MetricBlkBytes, cgPod, 4096*f, rundir.LabelDevice, disk, rundir.LabelOp, rundir.OpWrite),
		histRec(rundir.MetricReclaimStall, cgPod, log2(u, baseBlk), rundir.LabelKind, rundir.ReclaimDirect),
		rec(rundir.MetricReclaimPages, cgPod, 32*f, rundir.LabelKind, rundir.ReclaimDirect),
		histRec(rundir.MetricCompactionStall, cgPod, log2(u, baseBlk)),
		rec(rundir.MetricOOMKills, cgPod, f),
		rec(rundir.MetricKswapdWakeups, "", 3*f),
		rec(rundir.MetricBPFDrops, "", f, rundir.LabelProgram, rundir.ProgramRunq, rundir.LabelReason, "map_full"),
	}
	out := nd.changes.Filter(tracer)
	out = append(out, rundir.Record{Type: rundir.TypeEvent, Time: t0, Name: rundir.EventOOMKill, Cgroup: cgPod,
		Labels: map[string]string{rundir.LabelOOMPID: strconv.Itoa(1000 + n), rundir.LabelOOMComm: "stress"}})
	psi := func(metric, cg string, v float64) []rundir.Record {
		var rs []rundir.Record
		for _, res := range []string{rundir.ResourceCPU, rundir.ResourceMemory, rundir.ResourceIO} {
			for i, kind := range []string{rundir.PressureSome, rundir.PressureFull} {
				rs = append(rs, rec(metric, cg, v/float64(i+1), rundir.LabelResource, res, rundir.LabelKind, kind))
			}
		}
		return rs
	}
	out = append(out,
		rec(rundir.MetricCPUUsage, cgPod, 10*f),
		rec(rundir.MetricCPUPeriods, cgPod, 100*f),
		rec(rundir.MetricCPUThrottled, cgPod, 7*f),
		rec(rundir.MetricCPUThrottledTime, cgPod, 0.5*f),
		rec(rundir.MetricMemoryUsage, cgPod, 1e6*f),
		rec(rundir.MetricMemorySwap, cgPod, 8192*f),
		rec(rundir.MetricMemorySwapPages, cgPod, 3*f, rundir.LabelOp, rundir.SwapIn),
		rec(rundir.MetricMemorySwapPages, cgPod, 5*f, rundir.LabelOp, rundir.SwapOut),
		rec(rundir.MetricMemoryMajorFaults, cgPod, 11*f),
		rec(rundir.MetricMemoryRefaults, cgPod, 13*f, rundir.LabelKind, rundir.RefaultAnon),
		rec(rundir.MetricMemoryRefaults, cgPod, 17*f, rundir.LabelKind, rundir.RefaultFile),
		rec(rundir.MetricMemoryLimitEvents, cgPod, 19*f, rundir.LabelKind, rundir.LimitMax),
		rec(rundir.MetricMemoryLimitEvents, cgPod, 23*f, rundir.LabelKind, rundir.LimitHigh),
		rec(rundir.MetricMemoryOOMKills, cgPod, f),
		rec(rundir.MetricCPUUsage, cgKubelet, 2*f),
		rec(rundir.MetricMemoryUsage, cgKubelet, 5e5),
		rec(rundir.MetricMeminfo, "", 8e9, rundir.LabelName, "MemTotal"),
		rec(rundir.MetricMeminfo, "", 4e9-f, rundir.LabelName, "MemAvailable"),
		rec(rundir.MetricDiskIOs, "", 100*f, rundir.LabelDevice, disk, rundir.LabelOp, rundir.OpRead),
		rec(rundir.MetricDiskBytes, "", 4096*f, rundir.LabelDevice, disk, rundir.LabelOp, rundir.OpRead),
		rec(rundir.MetricDiskIOTime, "", 0.5*f, rundir.LabelDevice, disk),
		rec(rundir.MetricDiskWeightedIOTime, "", 1.5*f, rundir.LabelDevice, disk),
	)
	out = append(out, psi(rundir.MetricCgroupPressure, cgPod, 0.5*f)...)
	out = append(out, psi(rundir.MetricSystemPressure, "", 2*f)...)
	for name, v := range map[string]float64{
		"pswpin": 3, "pswpout": 5, "workingset_refault_anon": 7, "workingset_refault_file": 11,
		"allocstall_normal": 13, "allocstall_movable": 17, "pgsteal_direct": 19, "pgsteal_kswapd": 23,
		"pgmajfault": 29, "oom_kill": 31, "pgscan_kswapd": 37, "compact_stall": 41,
	} {
		out = append(out, rec(rundir.MetricVmstat, "", v*f, rundir.LabelName, name))
	}
	return out
}

// scrape gathers the exporter's metrics as name{label="value",...} (labels sorted) to values,
// histograms as their _bucket (with le), _sum and _count lines; it checks what every scrape
// must hold.
func scrape(t *testing.T, e *Exporter) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(e)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	checkFamilies(t, mfs)
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			var kv []string
			for _, l := range m.Label {
				kv = append(kv, l.GetName(), l.GetValue())
			}
			switch mf.GetType() {
			case dto.MetricType_HISTOGRAM:
				h := m.Histogram
				for _, b := range h.Bucket {
					out[key(mf.GetName()+"_bucket", append(slices.Clone(kv), "le", fmtFloat(b.GetUpperBound()))...)] = float64(b.GetCumulativeCount())
				}
				out[key(mf.GetName()+"_sum", kv...)] = h.GetSampleSum()
				out[key(mf.GetName()+"_count", kv...)] = float64(h.GetSampleCount())
			case dto.MetricType_COUNTER:
				out[key(mf.GetName(), kv...)] = m.Counter.GetValue()
			default:
				out[key(mf.GetName(), kv...)] = m.Gauge.GetValue()
			}
		}
	}
	return out
}

func fmtFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

func key(name string, kv ...string) string {
	var ls []string
	for i := 0; i < len(kv); i += 2 {
		ls = append(ls, kv[i]+"="+strconv.Quote(kv[i+1]))
	}
	sort.Strings(ls)
	return name + "{" + strings.Join(ls, ",") + "}"
}

// checkFamilies checks the naming and the bounds of every family: the prefix, base units,
// counters' _total, at most 12 buckets with +Inf, bounded label values.
func checkFamilies(t *testing.T, mfs []*dto.MetricFamily) {
	t.Helper()
	preemptors := []string{PreemptorNeighbour, PreemptorOwn, PreemptorKernel, PreemptorIdle, PreemptorThrottled}
	kinds := []string{kubeid.KindSystem, kubeid.KindPod, kubeid.KindContainer, kubeid.KindNodectl, kubeid.KindOther}
	for _, mf := range mfs {
		name := mf.GetName()
		if !strings.HasPrefix(name, "nodectl_") {
			t.Errorf("%s: not nodectl_", name)
		}
		for _, unit := range []string{"millisecond", "microsecond", "nanosecond", "pages", "kilobytes", "usec", "_ns"} {
			if strings.Contains(name, unit) {
				t.Errorf("%s: not in base units", name)
			}
		}
		switch mf.GetType() {
		case dto.MetricType_COUNTER:
			if !strings.HasSuffix(name, "_total") {
				t.Errorf("counter %s does not end in _total", name)
			}
		case dto.MetricType_HISTOGRAM:
			if !strings.HasSuffix(name, "_seconds") {
				t.Errorf("histogram %s is not in _seconds", name)
			}
		default:
			if strings.HasSuffix(name, "_total") {
				t.Errorf("gauge %s ends in _total", name)
			}
		}
		for _, m := range mf.Metric {
			if h := m.Histogram; h != nil && len(h.Bucket)+1 > 12 { // +Inf is implied
				t.Errorf("%s: %d buckets and +Inf, want at most 12", name, len(h.Bucket))
			}
			for _, l := range m.Label {
				v := l.GetValue()
				switch l.GetName() {
				case LabelKind:
					if !slices.Contains(kinds, v) {
						t.Errorf("%s: kind %q", name, v)
					}
				case rundir.LabelPreemptor:
					if !slices.Contains(preemptors, v) {
						t.Errorf("%s: preemptor %q is not a class", name, v)
					}
				case LabelWorkload:
					if v != "/" && strings.HasPrefix(v, "/") || strings.ContainsAny(v, "<>") {
						t.Errorf("%s: workload %q is a raw cgroup path", name, v)
					}
				}
			}
		}
	}
}

// cumulative is the count of h's values at or below le seconds, from the log2 buckets
// themselves: bucket k's values are below 2^(k+1) ns.
func cumulative(h hist.Log2, le float64) float64 {
	var n uint64
	for k, c := range h.Buckets {
		if math.Ldexp(1, k+1)/1e9 <= le {
			n += c
		}
	}
	return float64(n)
}

// wantHist checks a histogram series against the log2 histograms it adds up, exactly.
func wantHist(t *testing.T, got map[string]float64, name string, kv []string, hs ...hist.Log2) {
	t.Helper()
	var sum hist.Log2
	for _, h := range hs {
		sum = sum.Add(h)
	}
	buckets := 0
	for _, le := range bucketBounds {
		k := key(name+"_bucket", append(slices.Clone(kv), "le", fmtFloat(le))...)
		buckets++
		if got[k] != cumulative(sum, le) {
			t.Errorf("%s = %v, want %v", k, got[k], cumulative(sum, le))
		}
	}
	if k := key(name+"_count", kv...); got[k] != float64(sum.Count) {
		t.Errorf("%s = %v, want %v", k, got[k], sum.Count)
	}
	if k := key(name+"_sum", kv...); got[k] != float64(sum.SumNs)/1e9 {
		t.Errorf("%s = %v, want %v", k, got[k], float64(sum.SumNs)/1e9)
	}
	if buckets+1 > 12 {
		t.Errorf("%s: %d buckets and +Inf", name, buckets)
	}
}

func wantValues(t *testing.T, got map[string]float64, want map[string]float64) {
	t.Helper()
	for k, v := range want {
		if g, ok := got[k]; !ok {
			t.Errorf("%s missing", k)
		} else if g != v {
			t.Errorf("%s = %v, want %v", k, g, v)
		}
	}
}

func TestScrapeAfterSessionBatches(t *testing.T) {
	e := New(Config{})
	var nd node
	e.Observe(nd.batch(1))
	e.Observe(nd.batch(2)) // the tracer's unchanged series are not in it
	got := scrape(t, e)

	pod := []string{LabelWorkload, idPod, LabelKind, kubeid.KindContainer}
	kubelet := []string{LabelWorkload, "kubelet.service", LabelKind, kubeid.KindSystem}
	with := func(base []string, kv ...string) []string { return append(slices.Clone(base), kv...) }
	wantHist(t, got, "nodectl_runq_latency_seconds", pod, log2(2, baseRunq))
	wantHist(t, got, "nodectl_runq_latency_seconds", kubelet, log2(1, baseRunq))
	// fsync's devices add up; fdatasync is its own.
	wantHist(t, got, "nodectl_fsync_latency_seconds", with(pod, rundir.LabelSyscall, rundir.SyscallFsync), log2(2, baseFsync), log2(1, baseFsync))
	wantHist(t, got, "nodectl_fsync_latency_seconds", with(pod, rundir.LabelSyscall, rundir.SyscallFdatasync), log2(2, baseFsync))
	wantHist(t, got, "nodectl_blk_queue_seconds", with(pod, rundir.LabelDevice, disk, rundir.LabelOp, rundir.OpWrite), log2(2, baseBlk))
	wantHist(t, got, "nodectl_blk_service_seconds", with(pod, rundir.LabelDevice, disk, rundir.LabelOp, rundir.OpWrite), log2(2, baseBlk))
	wantHist(t, got, "nodectl_reclaim_stall_seconds", with(pod, labelReclaim, rundir.ReclaimDirect), log2(2, baseBlk))
	wantHist(t, got, "nodectl_compaction_stall_seconds", pod, log2(2, baseBlk))

	page := float64(os.Getpagesize())
	pre := func(class string) string {
		return key("nodectl_runq_preempt_wait_seconds_total", with(pod, rundir.LabelPreemptor, class)...)
	}
	want := map[string]float64{
		// kubelet's 3, the neighbour's 2.25 (unchanged at tick 2), an unresolved cgroup's 0.75.
		pre(PreemptorNeighbour): 6,
		pre(PreemptorOwn):       1,
		pre(PreemptorKernel):    0.25,
		pre(PreemptorIdle):      0.25,
		pre(PreemptorThrottled): 2,
		key("nodectl_runq_preempt_wait_seconds_total", with(kubelet, rundir.LabelPreemptor, PreemptorNeighbour)...):                              1,
		key("nodectl_runq_wakeup_wait_seconds_total", with(pod, rundir.LabelPreemptor, PreemptorNeighbour)...):                                   1,
		key("nodectl_cpu_usage_seconds_total", pod...):                                                                                           20,
		key("nodectl_cpu_periods_total", pod...):                                                                                                 200,
		key("nodectl_cpu_throttled_periods_total", pod...):                                                                                       14,
		key("nodectl_cpu_throttled_seconds_total", pod...):                                                                                       1,
		key("nodectl_memory_usage_bytes", pod...):                                                                                                2e6,
		key("nodectl_memory_swap_bytes", pod...):                                                                                                 16384,
		key("nodectl_memory_swap_io_bytes_total", with(pod, rundir.LabelOp, rundir.SwapIn)...):                                                   6 * page,
		key("nodectl_memory_swap_io_bytes_total", with(pod, rundir.LabelOp, rundir.SwapOut)...):                                                  10 * page,
		key("nodectl_memory_major_faults_total", pod...):                                                                                         22,
		key("nodectl_memory_refaults_total", with(pod, labelLRU, rundir.RefaultAnon)...):                                                         26,
		key("nodectl_memory_refaults_total", with(pod, labelLRU, rundir.RefaultFile)...):                                                         34,
		key("nodectl_memory_limit_events_total", with(pod, labelLimit, rundir.LimitMax)...):                                                      38,
		key("nodectl_memory_limit_events_total", with(pod, labelLimit, rundir.LimitHigh)...):                                                     46,
		key("nodectl_memory_oom_kills_total", pod...):                                                                                            2,
		key("nodectl_oom_kills_total", pod...):                                                                                                   2,
		key("nodectl_cgroup_pressure_seconds_total", with(pod, rundir.LabelResource, rundir.ResourceMemory, labelStall, rundir.PressureSome)...): 1,
		key("nodectl_cgroup_pressure_seconds_total", with(pod, rundir.LabelResource, rundir.ResourceIO, labelStall, rundir.PressureFull)...):     0.5,
		key("nodectl_cpu_usage_seconds_total", kubelet...):                                                                                       4,
		key("nodectl_memory_usage_bytes", kubelet...):                                                                                            5e5,

		key("nodectl_node_pressure_seconds_total", rundir.LabelResource, rundir.ResourceCPU, labelStall, rundir.PressureSome): 4,
		key("nodectl_node_pressure_seconds_total", rundir.LabelResource, rundir.ResourceCPU, labelStall, rundir.PressureFull): 2,
		key("nodectl_node_swap_io_bytes_total", rundir.LabelOp, rundir.SwapIn):                                                6 * page,
		key("nodectl_node_swap_io_bytes_total", rundir.LabelOp, rundir.SwapOut):                                               10 * page,
		key("nodectl_node_refaults_total", labelLRU, rundir.RefaultAnon):                                                      14,
		key("nodectl_node_refaults_total", labelLRU, rundir.RefaultFile):                                                      22,
		key("nodectl_node_direct_reclaims_total"):                                                                             60, // both zones
		key("nodectl_node_reclaimed_bytes_total", labelReclaimer, rundir.ReclaimDirect):                                       38 * page,
		key("nodectl_node_reclaimed_bytes_total", labelReclaimer, reclaimKswapd):                                              46 * page,
		key("nodectl_node_major_faults_total"):                                                                                58,
		key("nodectl_node_oom_kills_total"):                                                                                   62,
		key("nodectl_node_disk_ios_total", rundir.LabelDevice, disk, rundir.LabelOp, rundir.OpRead):                           200,
		key("nodectl_node_disk_bytes_total", rundir.LabelDevice, disk, rundir.LabelOp, rundir.OpRead):                         8192,
		key("nodectl_node_disk_io_seconds_total", rundir.LabelDevice, disk):                                                   1,
		key("nodectl_node_disk_weighted_io_seconds_total", rundir.LabelDevice, disk):                                          3,
		key("nodectl_node_memory_bytes", labelField, "MemTotal"):                                                              8e9,
		key("nodectl_node_memory_bytes", labelField, "MemAvailable"):                                                          4e9 - 2,
		key("nodectl_exporter_cgroups", labelState, stateTracked):                                                             2,
		key("nodectl_exporter_cgroups", labelState, stateOverflow):                                                            0,
	}
	wantValues(t, got, want)

	// What the exporter does not export stays out: the tracer's preemption counts, block bytes,
	// reclaim pages, kswapd, drops, unselected vmstat counters, the OOM kill events.
	var names []string
	for k := range got {
		names = append(names, k[:strings.IndexByte(k, '{')])
	}
	for _, absent := range []string{"nodectl_runq_preemptions_total", "nodectl_blk_bytes_total", "nodectl_reclaim_pages_total",
		"nodectl_kswapd_wakeups_total", "nodectl_bpf_drops_total", "nodectl_node_vmstat"} {
		if slices.Contains(names, absent) {
			t.Errorf("%s exported", absent)
		}
	}
	// The series metric counts every line of the scrape: each histogram has a +Inf bucket
	// besides its finite ones (counted once per _count line).
	lines := len(got)
	for _, n := range names {
		if strings.HasSuffix(n, "_count") {
			lines++
		}
	}
	if s := got[key("nodectl_exporter_series")]; s != float64(lines) {
		t.Errorf("nodectl_exporter_series = %v, want %d", s, lines)
	}
}

// A cgroup whose name is not known yet is deferred, then keyed by its name with all of its
// cumulative counts: the wait loses nothing.
func TestClassifyDefers(t *testing.T) {
	named := false
	e := New(Config{Classify: func(cg string) (string, string, bool) {
		if cg == cgPod && !named {
			return "", "", false
		}
		if cg == cgPod {
			return "shop/web-0/app", kubeid.KindContainer, true
		}
		w, k := kubeid.Classify(cg)
		return w, k, true
	}})
	e.Observe([]rundir.Record{rec(rundir.MetricCPUUsage, cgPod, 2), rec(rundir.MetricCPUUsage, cgKubelet, 1)})
	got := scrape(t, e)
	if _, ok := got[key("nodectl_cpu_usage_seconds_total", "kind", kubeid.KindContainer, "workload", idPod)]; ok {
		t.Error("a deferred cgroup was keyed by its path")
	}
	if got[key("nodectl_cpu_usage_seconds_total", "kind", kubeid.KindSystem, "workload", "kubelet.service")] != 1 {
		t.Error("the other cgroup's record was not kept")
	}
	named = true
	e.Observe([]rundir.Record{rec(rundir.MetricCPUUsage, cgPod, 3)})
	if v := scrape(t, e)[key("nodectl_cpu_usage_seconds_total", "kind", kubeid.KindContainer, "workload", "shop/web-0/app")]; v != 3 {
		t.Errorf("the named cgroup's CPU is %v, want its cumulative 3", v)
	}
}
