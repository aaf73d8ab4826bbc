package rundir

// Metric names shared by the tracer, the samplers, the stress workloads and the analyzer.
// Counters ending in _total and histograms are cumulative since the producer started: a window
// is the difference of two snapshots. Seconds and bytes are base units.
const (
	// Run-queue tracer (cgroup in the cpu hierarchy on v1 hosts).
	MetricRunqLatency     = "runq_latency_seconds"            // hist: wakeup/preemption to running
	MetricRunqPreemptions = "runq_preemptions_total"          // labels preemptor: involuntary switches of cgroup by preemptor
	MetricRunqPreemptWait = "runq_preempt_wait_seconds_total" // labels preemptor: time the preempted tasks then waited
	MetricRunqWakeupWaits = "runq_wakeup_waits_total"         // labels preemptor: waits after a wakeup on a busy CPU, by what ran just before the task
	MetricRunqWakeupWait  = "runq_wakeup_wait_seconds_total"  // labels preemptor: time those woken tasks waited

	// fsync tracer (cgroup in the blkio hierarchy on v1 hosts).
	MetricFsyncLatency = "fsync_latency_seconds" // hist, labels syscall (fsync|fdatasync|sync_file_range), device

	// Block tracer (cgroup that issued the I/O, blkio hierarchy on v1 hosts).
	MetricBlkQueue    = "blk_queue_seconds"   // hist, labels device, op: insert to issue
	MetricBlkService  = "blk_service_seconds" // hist, labels device, op: issue to complete
	MetricBlkBytes    = "blk_bytes_total"     // labels device, op
	MetricBlkRequests = "blk_requests_total"  // labels device, op

	// Tracer health.
	MetricBPFDrops = "bpf_drops_total" // labels program, reason

	// cgroup samplers.
	MetricCPUUsage           = "cpu_usage_seconds_total"
	MetricCPUPeriods         = "cpu_periods_total"
	MetricCPUThrottled       = "cpu_throttled_periods_total"
	MetricCPUThrottledTime   = "cpu_throttled_seconds_total"
	MetricMemoryUsage        = "memory_usage_bytes"
	MetricCgroupPressure     = "cgroup_pressure_seconds_total" // labels resource (cpu|memory|io), kind (some|full)
	MetricSystemPressure     = "pressure_seconds_total"        // labels resource, kind; no cgroup
	MetricVmstat             = "vmstat"                        // labels name: a /proc/vmstat counter
	MetricDiskIOs            = "disk_ios_total"                // labels device, op (read|write)
	MetricDiskBytes          = "disk_bytes_total"              // labels device, op
	MetricDiskIOTime         = "disk_io_seconds_total"         // labels device: time the device was busy
	MetricDiskWeightedIOTime = "disk_weighted_io_seconds_total"

	// Victim probe: one value per iteration, recorded by the probe itself.
	MetricProbeCPUWork = "probe_cpu_work_seconds"
	MetricProbeWrite   = "probe_write_seconds"
	MetricProbeFsync   = "probe_fsync_seconds"

	// Heartbeat probe: how late each periodic wake-up came, one value per beat.
	MetricHeartbeatLateness = "heartbeat_lateness_seconds"

	// Churn hog: processes it started in the last second, one value a second.
	MetricChurnStarts = "churn_starts"

	// Wake scenario, once per start of the sandbox. Both gauges.
	MetricWake     = "wake_seconds"      // recorded by the driver: from just before the launch to the sandbox's answer
	MetricWakeBoot = "wake_boot_seconds" // recorded by the sandbox: from its go to its answer

	// Run-queue wait of a cgroup's live tasks from /proc/<pid>/task/*/schedstat (run_delay),
	// read by the driver: the untraced stand-in for the runq tracer's histogram. A counter of
	// the tasks alive when read: it drops when a task exits.
	MetricSchedRunDelay = "sched_run_delay_seconds_total"
)

// Label keys and special label values.
const (
	LabelPreemptor = "preemptor"
	LabelSyscall   = "syscall"
	LabelDevice    = "device" // MAJ:MIN of the whole disk
	LabelOp        = "op"
	LabelProgram   = "program"
	LabelReason    = "reason"
	LabelResource  = "resource"
	LabelKind      = "kind"
	LabelName      = "name"
	LabelPath      = "path" // a file as the kernel prints it (a swap area)

	// CgroupIdle is the preemptor recorded when a CPU went idle while the task stayed
	// runnable: nobody preempted it (typically its cgroup was throttled).
	CgroupIdle = "<idle>"
	// CgroupThrottled is the preemptor recorded when the task's cgroup, or an ancestor, ran
	// out of CPU quota: its own limit, not a neighbour, stopped it.
	CgroupThrottled = "<throttled>"
	// CgroupKernel is the preemptor recorded for a kernel thread (kworker, ksoftirqd, jbd2,
	// kswapd, ...): system work, not a neighbour, whichever cgroup the thread sits in.
	CgroupKernel = "<kernel>"
)

// fsync storm (`stress fsync-storm`, issue 4). The writers record their times once per storm;
// the driver records the node's dirty and writeback memory every stormDirtyInterval during a
// storm, as bytes (/proc/vmstat counts pages). All gauges.
const (
	MetricStormDurable = "fsync_storm_durable_seconds" // by a writer: its first write to its fsync's return
	MetricStormWrite   = "fsync_storm_write_seconds"   // by a writer: the writes (page cache copy, dirty throttling)
	MetricStormFsync   = "fsync_storm_fsync_seconds"   // by a writer: the fsync

	MetricDirty              = "node_dirty_bytes"                      // vmstat nr_dirty
	MetricWriteback          = "node_writeback_bytes"                  // vmstat nr_writeback
	MetricDirtyThreshold     = "node_dirty_threshold_bytes"            // vmstat nr_dirty_threshold: writers are stopped above it
	MetricDirtyBackThreshold = "node_dirty_background_threshold_bytes" // vmstat nr_dirty_background_threshold: the flusher starts above it
)

// Density scenario (`nodectl stress density`): sandbox stand-ins and the driver's view of the
// emulated node. Gauges unless named _total.
const (
	// Recorded by each sandbox: from its go to its heap and binary in memory (its ready
	// heartbeat); how late each tick of its event loop woke; how long each activity burst took.
	MetricSandboxReady        = "sandbox_ready_seconds"
	MetricSandboxTickLateness = "sandbox_tick_lateness_seconds"
	MetricSandboxActivity     = "sandbox_activity_seconds"
	// Recorded by the driver: from just before a sandbox's launch to its ready line's arrival.
	MetricSandboxReadiness = "sandbox_readiness_seconds"
	// Recorded by the driver, no cgroup: sandboxes launched so far, at each launch.
	MetricDensitySandboxes = "density_sandboxes"
	// The run cgroup's memory (the emulated node), labels name: usage, limit, anon, file,
	// inactive_file, swap, working_set (usage less inactive file, as the kubelet counts it).
	MetricDensityMemory = "density_memory_bytes"
	// OOM kills in the run cgroup or below (v1 memory.oom_control oom_kill, v2 memory.events).
	MetricDensityOOMKills = "density_oom_kills_total"
	// The run's swap file, no cgroup, labels name: size, used (from /proc/swaps).
	MetricDensitySwap = "density_swap_bytes"
)

// Memory signals of a cgroup, read by the cgroup sampler from the memory controller's files
// (issue 4: swap, faults, refaults, OOM kills, limit hits). On v1 the memory.stat values are
// the hierarchical total_* ones, as v2's are, so a parent includes its children.
const (
	MetricMemorySwap        = "memory_swap_bytes"         // gauge: swap charged (v1 memory.stat total_swap, v2 memory.swap.current)
	MetricMemoryMajorFaults = "memory_major_faults_total" // pgmajfault
	MetricMemoryRefaults    = "memory_refaults_total"     // labels kind (anon|file): workingset_refault_*
	MetricMemorySwapPages   = "memory_swap_pages_total"   // labels op (in|out): v2 memory.stat pswpin/pswpout (kernel 6.12+); v1 has none
	MetricMemoryOOMKills    = "memory_oom_kills_total"    // v1 memory.oom_control oom_kill, v2 memory.events oom_kill
	MetricMemoryLimitEvents = "memory_limit_events_total" // labels kind (max|high): v1 memory.failcnt is max; v2 memory.events max, high
	MetricMemorySwapLimit   = "memory_swap_limit_bytes"   // gauge: v2 memory.swap.max, none while "max" (LimitedSwap gives each Burstable pod its share); v1 memory.stat hierarchical_memsw_limit less hierarchical_memory_limit, none while memsw is unlimited

	// A cgroup's I/O by device from v2 io.stat (v1 blkio keeps other counters), charged as the
	// block layer charges it: to the cgroup that dirtied the pages, writeback included.
	MetricCgroupIOBytes = "cgroup_io_bytes_total" // labels device, op (read|write|discard)
	MetricCgroupIOs     = "cgroup_io_ios_total"   // labels device, op

	// Node memory from /proc/meminfo, by the system sampler.
	MetricMeminfo = "meminfo_bytes" // gauge, labels name (MemTotal, MemAvailable, SwapTotal, SwapFree)
	// The node's swap areas from /proc/swaps, by the system sampler, no cgroup: labels path (as
	// the kernel prints it), device (the whole disk whose requests serve it, "MAJ:MIN"; "" when
	// unknown), name (size|used, as density_swap_bytes).
	MetricSwapArea = "swap_area_bytes"
)

// The agent's memory of whom a cgroup belonged to (rundir.Pod's Record): a constant sample
// per named cgroup, recorded when the agent names it and again before the flight recorder
// would forget an unchanged series, so that a window names the pods of its time, gone or not.
const MetricPodInfo = "pod_info" // gauge 1, labels namespace, pod, container, uid, qos, runtime_class, handler, owner, sandbox, cpu_request, memory_request

// Reclaim tracer (bpf/reclaim.bpf.c, issue 4; cgroup in the memory hierarchy on v1 hosts): the
// stalls of the cgroup's own tasks, whoever's limit or memory shortage caused them.
const (
	MetricReclaimStall    = "reclaim_stall_seconds"    // hist, labels kind (direct|memcg): time in one reclaim
	MetricReclaimPages    = "reclaim_pages_total"      // labels kind: pages those reclaims freed
	MetricCompactionStall = "compaction_stall_seconds" // hist: time in one direct compaction
	MetricKswapdWakeups   = "kswapd_wakeups_total"     // no cgroup: kswapd woke up to reclaim
	MetricKswapdSleeps    = "kswapd_sleeps_total"      // no cgroup: kswapd went back to sleep
	MetricOOMKills        = "oom_kills_total"          // OOM kills of the cgroup's processes

	// ReclaimDirect and ReclaimMemcg are the values of LabelKind on the reclaim metrics.
	ReclaimDirect = "direct"
	ReclaimMemcg  = "memcg"

	// EventOOMKill is the Name of an event record of an OOM kill; its Cgroup is the killed
	// process's, and its labels are the LabelOOM* keys.
	EventOOMKill = "oom_kill"

	LabelOOMPID         = "pid"          // the killed process (thread group id)
	LabelOOMComm        = "comm"         // its command name
	LabelOOMLimitCgroup = "limit_cgroup" // the cgroup whose memory limit was hit; absent when none was found (a global OOM)
	LabelOOMUsage       = "usage_bytes"  // that cgroup's memory usage at the kill
	LabelOOMLimit       = "limit_bytes"  // and its limit
	LabelOOMTriggerPID  = "trigger_pid"  // the process whose allocation ran the OOM killer
	LabelOOMTriggerComm = "trigger_comm"
)
