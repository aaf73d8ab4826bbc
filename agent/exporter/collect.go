package exporter

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Self is the agent's own figures, as Config.Self returns them at a scrape.
type Self struct {
	TrackedCgroups  int // cgroups the agent follows
	OverflowCgroups int // cgroups it saw beyond its bound and does not follow
	// BPFMaps is the fill (0..1) of each tracer program's fullest map keyed by cgroup, by
	// program: what the tracer knows of its maps.
	BPFMaps map[string]float64
	Lost    Lost
	// The store: its size, its oldest sample (zero when empty), whether it takes writes, and
	// the writes that failed.
	StoreBytes    int64
	StoreOldest   time.Time
	StoreWritable bool
	WriteFailures uint64
	// Incidents by trigger (a bounded set: the agent's triggers).
	Incidents map[string]Incidents
	// Kubernetes: the pods and containers the agent named (one info series each, bounded by
	// the exporter's MaxSeries), the cgroups of the kubelet's tree or of a container id that
	// nothing named, and the node's Lease as the agent last saw it (nil off Kubernetes).
	Pods        []PodInfo
	UnknownPods int
	Lease       *Lease
}

// PodInfo is one named pod or container, the labels of nodectl_pod_info.
type PodInfo struct {
	Workload, Kind, Namespace, Pod, Container, QoS, RuntimeClass string
	Sandbox                                                      bool
}

// Lease is the node's Lease as the agent last saw it renewed.
type Lease struct {
	Renewals uint64
	LastGap  time.Duration // between the last two renewals seen
	LastSeen time.Time     // zero before the first
}

// Lost counts the events lost since the agent started, by where they were lost.
type Lost struct {
	KernelMapFull uint64 // a BPF map was full
	RingBuffer    uint64 // the kernel's ring buffer was full
	UserQueue     uint64 // the agent's queue to its writer was full
	Store         uint64 // the store refused them
	Watch         uint64 // a watcher's stream fell behind
}

// Incidents of one trigger.
type Incidents struct {
	Total uint64 // opened since the agent started
	Open  int    // open now
}

// Labels and label values of the self metrics.
const (
	labelState    = "state"
	stateTracked  = "tracked"
	stateOverflow = "overflow"
	stateNamed    = "named"
	stateUnknown  = "unknown"
	stateExported = "exported"
	stateRolled   = "rolled"
	labelMap      = "map"
	labelTrigger  = "trigger"

	labelStage         = "stage"
	stageKernelMapFull = "kernel_map_full"
	stageRingBuffer    = "ring_buffer"
	stageUserQueue     = "user_queue"
	stageStore         = "store"
	stageWatch         = "watch"
)

var (
	agentCgroups = newDesc("nodectl_agent_cgroups",
		"Cgroups the agent follows (tracked) and those it saw beyond its bound (overflow).", labelState)
	agentMapFill = newDesc("nodectl_agent_bpf_map_fill_ratio",
		"Fill (entries over capacity) of each tracer program's fullest BPF map keyed by cgroup.", labelMap)
	agentLost = newDesc("nodectl_agent_lost_events_total",
		"Events the agent lost, by stage: kernel_map_full, ring_buffer, user_queue, store, watch.", labelStage)
	agentStoreBytes = newDesc("nodectl_agent_store_bytes",
		"Bytes the agent's store holds on disk.")
	agentStoreAge = newDesc("nodectl_agent_store_oldest_sample_age_seconds",
		"Age of the oldest sample in the agent's store (absent while the store is empty).")
	agentStoreWritable = newDesc("nodectl_agent_store_writable",
		"1 when the agent's store takes writes, 0 when it does not (disk full, read-only).")
	agentWriteFailures = newDesc("nodectl_agent_store_write_failures_total",
		"Writes to the agent's store that failed.")
	agentIncidents = newDesc("nodectl_agent_incidents_total",
		"Incidents the agent opened, by trigger.", labelTrigger)
	agentOpenIncidents = newDesc("nodectl_agent_open_incidents",
		"Incidents open now, by trigger.", labelTrigger)
	agentPodCgroups = newDesc("nodectl_agent_pod_cgroups",
		"Cgroups of pods and containers: named after their pod (named), or in the kubelet's tree or of a container id that the runtime and the API server did not name (unknown).", labelState)
	podInfo = newDesc("nodectl_pod_info",
		"1 for each pod and container the agent names: its workload label value and what it stands for.",
		LabelWorkload, LabelKind, "namespace", "pod", "container", "qos", "runtime_class", "sandbox") //rundir:other: a label
	leaseRenewals = newDesc("nodectl_node_lease_renewals_total",
		"Renewals of this node's Lease in kube-node-lease the agent saw.")
	leaseGap = newDesc("nodectl_node_lease_renewal_gap_seconds",
		"Time between the last two renewals of this node's Lease the agent saw.")
	leaseAge = newDesc("nodectl_node_lease_age_seconds",
		"Time since the agent last saw this node's Lease renewed.")

	exporterCgroups = newDesc("nodectl_exporter_cgroups",
		"Cgroups the exporter holds: with series of their workload's (tracked) or in the _overflow workload's (overflow).", labelState)
	exporterWorkloads = newDesc("nodectl_exporter_workloads",
		"Workloads in this scrape: with series of their own (exported, _overflow included) or whose increases went to _overflow's series within the series budget (rolled).", labelState)
	exporterSeries = newDesc("nodectl_exporter_series",
		"Series in this scrape of the exporter's metrics, each histogram bucket, sum and count one, these included.")
	exporterDuration = newDesc("nodectl_exporter_scrape_duration_seconds",
		"Time the exporter took to produce this scrape's metrics, up to this one.")
)

// Describe sends every metric's description: the set is fixed.
func (e *Exporter) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range descs {
		ch <- d
	}
}

// row is one series copied out of the state for a scrape: its value, and where its labels are
// (a series' and a workload's keys never change, so they are read after the lock is released).
type row struct {
	w     *workload
	s     *series
	value float64 // counters and gauges
	hist  int     // histograms: the index of its copy
}

// snapshot copies, under the lock, the series this scrape exports within the series budget
// (plan), so that building and sending the metrics, and the registry's wait for them, never
// holds up Observe. fixed is the lines of the agent's own series, info the workloads with an
// info series. The overflow's rows merge the overflow workload's series, the rollup's and
// the rolled workloads' gauges.
func (e *Exporter) snapshot(fixed int, info map[workloadKey]bool) (sn scrapeState) {
	e.mu.Lock()
	defer e.mu.Unlock()
	b := e.plan(fixed, info)
	sn.exported = make(map[workloadKey]bool, len(b.exported))
	sn.rolled = b.rolled
	n := len(e.node.w.series)
	for w := range b.exported {
		n += len(w.series)
	}
	sn.rows = make([]row, 0, n+len(e.rolled.series))
	// What a series shows: its counts less what it handed to _overflow while rolled up.
	add := func(w *workload, s *series) {
		v, h := s.exported()
		r := row{w: w, s: s, value: v}
		if s.hist != nil {
			r.hist = len(sn.hists)
			sn.hists = append(sn.hists, h)
		}
		sn.rows = append(sn.rows, r)
	}
	for _, s := range e.node.w.series {
		add(e.node.w, s)
	}
	for w := range b.exported {
		sn.exported[w.key] = true
		if w.key == rolledKey {
			continue
		}
		for _, s := range w.series {
			add(w, s)
		}
	}
	overflow := &workload{series: map[seriesKey]*series{}}
	for _, w := range []*workload{e.workloads[rolledKey], e.rolled} {
		if w == nil {
			continue
		}
		for k, s := range w.series {
			overflow.seriesOf(k).addExported(s)
		}
	}
	for k, v := range b.gauges {
		overflow.seriesOf(k).value += v
	}
	for _, s := range overflow.series {
		add(e.rolled, s)
	}
	if len(overflow.series) > 0 {
		sn.exported[rolledKey] = true
	}
	sn.tracked, sn.overflow = len(e.cgroups)-e.overflow, e.overflow
	return sn
}

// scrapeState is what a scrape copied of the exporter's state.
type scrapeState struct {
	rows              []row
	hists             []histo
	tracked, overflow int                  // cgroups
	exported          map[workloadKey]bool // workloads exported whole (and the overflow)
	rolled            int                  // workloads rolled into _overflow
}

// Collect sends the series the budget keeps (snapshot), then the agent's and the exporter's own.
func (e *Exporter) Collect(ch chan<- prometheus.Metric) {
	start := time.Now()
	series := 0
	// emit sends m, or, when a label value was refused (a cgroup name that is not UTF-8), the
	// error, which the server reports while serving the rest.
	emit := func(d *prometheus.Desc, m prometheus.Metric, err error, lines int) {
		if err != nil {
			m, lines = prometheus.NewInvalidMetric(d, err), 0
		}
		ch <- m
		series += lines
	}
	value := func(d *prometheus.Desc, vt prometheus.ValueType, v float64, labels ...string) {
		m, err := prometheus.NewConstMetric(d, vt, v, labels...)
		emit(d, m, err, 1)
	}
	// The agent's own series are made first, to know the lines they take; sent after the rest.
	var own []func()
	info := map[workloadKey]bool{}
	var pods []PodInfo
	if e.cfg.Self != nil {
		own, pods = e.self(e.cfg.Self(), value)
		for _, p := range pods {
			info[workloadKey{p.Workload, p.Kind}] = true
		}
	}
	// The exporter's own: cgroups and workloads by state, series, duration.
	const exporterLines = 6
	sn := e.snapshot(len(own)+exporterLines, info)
	for _, r := range sn.rows {
		sp := r.s.key.spec
		labels := []string{r.w.key.name, r.w.key.kind, r.s.key.a, r.s.key.b}[:2+sp.labels]
		if sp.node {
			labels = labels[2 : 2+sp.labels]
		}
		switch sp.typ {
		case histogram:
			h := &sn.hists[r.hist]
			m, err := prometheus.NewConstHistogram(sp.desc, h.count, float64(h.sumNs)/1e9, h.cumulative(), labels...)
			emit(sp.desc, m, err, nBuckets+2)
		case counter:
			value(sp.desc, prometheus.CounterValue, r.value, labels...)
		case gauge:
			value(sp.desc, prometheus.GaugeValue, r.value, labels...)
		}
	}
	for _, f := range own {
		f()
	}
	named := 0
	for _, p := range pods {
		if sn.exported[workloadKey{p.Workload, p.Kind}] && named < e.cfg.MaxSeries {
			named++
			value(podInfo, prometheus.GaugeValue, 1, p.Workload, p.Kind, p.Namespace, p.Pod, p.Container, p.QoS, p.RuntimeClass, strconv.FormatBool(p.Sandbox))
		}
	}
	value(exporterCgroups, prometheus.GaugeValue, float64(sn.tracked), stateTracked)
	value(exporterCgroups, prometheus.GaugeValue, float64(sn.overflow), stateOverflow)
	value(exporterWorkloads, prometheus.GaugeValue, float64(len(sn.exported)), stateExported)
	value(exporterWorkloads, prometheus.GaugeValue, float64(sn.rolled), stateRolled)
	// This one and the duration after it count too.
	value(exporterSeries, prometheus.GaugeValue, float64(series+2))
	value(exporterDuration, prometheus.GaugeValue, time.Since(start).Seconds())
}

// self returns the agent's own series as calls that send them, and the pods, whose info
// series go with their workload's (at most MaxSeries of them).
func (e *Exporter) self(self Self, value func(*prometheus.Desc, prometheus.ValueType, float64, ...string)) (own []func(), pods []PodInfo) {
	v := func(d *prometheus.Desc, vt prometheus.ValueType, x float64, labels ...string) {
		own = append(own, func() { value(d, vt, x, labels...) })
	}
	v(agentCgroups, prometheus.GaugeValue, float64(self.TrackedCgroups), stateTracked)
	v(agentCgroups, prometheus.GaugeValue, float64(self.OverflowCgroups), stateOverflow)
	for name, fill := range self.BPFMaps {
		v(agentMapFill, prometheus.GaugeValue, fill, name)
	}
	for _, l := range []struct {
		stage string
		n     uint64
	}{
		{stageKernelMapFull, self.Lost.KernelMapFull}, {stageRingBuffer, self.Lost.RingBuffer},
		{stageUserQueue, self.Lost.UserQueue}, {stageStore, self.Lost.Store}, {stageWatch, self.Lost.Watch},
	} {
		v(agentLost, prometheus.CounterValue, float64(l.n), l.stage)
	}
	v(agentStoreBytes, prometheus.GaugeValue, float64(self.StoreBytes))
	if !self.StoreOldest.IsZero() {
		v(agentStoreAge, prometheus.GaugeValue, time.Since(self.StoreOldest).Seconds())
	}
	writable := 0.0
	if self.StoreWritable {
		writable = 1
	}
	v(agentStoreWritable, prometheus.GaugeValue, writable)
	v(agentWriteFailures, prometheus.CounterValue, float64(self.WriteFailures))
	for trigger, n := range self.Incidents {
		v(agentIncidents, prometheus.CounterValue, float64(n.Total), trigger)
		v(agentOpenIncidents, prometheus.GaugeValue, float64(n.Open), trigger)
	}
	if self.Lease != nil {
		v(agentPodCgroups, prometheus.GaugeValue, float64(len(self.Pods)), stateNamed)
		v(agentPodCgroups, prometheus.GaugeValue, float64(self.UnknownPods), stateUnknown)
		pods = self.Pods
		v(leaseRenewals, prometheus.CounterValue, float64(self.Lease.Renewals))
		if !self.Lease.LastSeen.IsZero() {
			v(leaseGap, prometheus.GaugeValue, self.Lease.LastGap.Seconds())
			v(leaseAge, prometheus.GaugeValue, time.Since(self.Lease.LastSeen).Seconds())
		}
	}
	return own, pods
}

// cumulative is h's finite buckets as Prometheus counts them: at or below each bound. A count
// the kernel read mid-update may trail its buckets by an event or two; the buckets are capped
// at it so that the histogram stays valid.
func (h *histo) cumulative() map[float64]uint64 {
	out := make(map[float64]uint64, len(bucketBounds))
	var n uint64
	for j, le := range bucketBounds {
		n += h.buckets[j]
		out[le] = min(n, h.count)
	}
	return out
}
