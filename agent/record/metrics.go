package record

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
