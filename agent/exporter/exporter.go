// Package exporter turns the agent's recording batches into Prometheus metrics per workload and
// for the node, served by internal/metricserver. The records are cumulative series (the tracer's
// only when they changed), gauges and events; the exporter keeps, per cgroup and series, the
// last value it saw and adds what each new one brings to the workload's series, so that a
// counter only grows while its workload lives, and it makes the metrics at scrape time from a
// copy of that state. docs/metrics.md lists the metrics.
package exporter

import (
	"sync"
	"time"

	"github.com/nodectl/nodectl/host/kubeid"
	"github.com/nodectl/nodectl/internal/maproom"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

// DefaultMaxSeries bounds the workloads with series of their own.
const DefaultMaxSeries = 1000

// DefaultForgetGrace is how many batches a forgotten cgroup's records are dropped for: the
// tracer reports a removed cgroup's last values until it forgets its entries, every 30
// snapshots (record/trace.DefaultForgetEvery); adding them again would restart its series.
const DefaultForgetGrace = 40

// Overflow is the workload label of the series of the cgroups beyond Config.MaxSeries.
const Overflow = "_overflow"

// Config configures an Exporter.
type Config struct {
	// MaxSeries bounds the workloads (values of the workload label) with series of their own:
	// a cgroup seen while as many are tracked adds to the Overflow workload's series until it
	// is forgotten. 0 = DefaultMaxSeries.
	MaxSeries int
	// ForgetGrace is how many batches, after Forget, the cgroup's records are dropped for.
	// 0 = DefaultForgetGrace.
	ForgetGrace int
	// Classify names the workload of a cgroup (its workload and kind labels) when it is first
	// seen; nil is kubeid.Classify, by the cgroup's path. The agent names pods through it. !ok defers
	// the cgroup: its records are passed over until a later batch names it (its counters are
	// cumulative, so nothing is lost but the wait).
	Classify func(cgroup string) (workload, kind string, ok bool)
	// Self, if set, returns the agent's own figures at each scrape. It is called without the
	// exporter's lock held and must not call the exporter.
	Self func() Self
	// SeriesBudget bounds the series of a scrape (the agent's own and the node's are always
	// exported): past it the workloads whose tasks waited and ran least add their increases
	// to _overflow's series instead of their own. 0 = DefaultSeriesBudget.
	SeriesBudget int
}

// Exporter keeps the latest state of every exported series; it is a prometheus.Collector.
// Observe, Forget and Collect may be called concurrently.
type Exporter struct {
	cfg Config

	mu        sync.Mutex
	cgroups   map[string]*cgroupState
	workloads map[workloadKey]*workload
	node      *cgroupState // the node's series, never forgotten
	tracked   int          // workloads other than Overflow
	overflow  int          // cgroups in Overflow
	// preempted indexes, by preemptor cgroup, the cgroups it preempted and how many of their
	// sources are of it: forgetting the preemptor drops them, which would otherwise pile up
	// with pod churn.
	preempted map[string]map[*cgroupState]int
	// gone holds forgotten cgroups until the batch number their records count again from;
	// goneOrder is the same in the order they expire.
	gone      map[string]uint64
	goneOrder []tombstone
	batch     uint64 // Observe calls so far
	// rolled is what the workloads the series budget left out counted while left out: the
	// overflow's, never forgotten (its counters would go back).
	rolled *workload
	// planned is when the last scrape ranked the workloads; now tells the time (a test's clock).
	planned time.Time
	now     func() time.Time
	// The rooms of cgroups, workloads, preempted and gone: a churn's maps are made again.
	cgRoom, wlRoom, preRoom, goneRoom maproom.Room
}

type tombstone struct {
	cgroup string
	until  uint64
}

type workloadKey struct{ name, kind string }

// workload is the series of one label set (workload, kind): the cgroups of one identity, or the
// overflow.
type workload struct {
	key     workloadKey
	cgroups int // the cgroups feeding it; it goes with the last
	series  map[seriesKey]*series
	// The series budget's: the seconds its tasks waited and ran, decayed by the clock
	// (scoreHalfLife), and whether the last scrape exported it.
	score    float64
	exported bool
}

type seriesKey struct {
	spec *spec
	a, b string // exported label values after workload and kind
}

type series struct {
	key     seriesKey
	sources int     // sources feeding it; a gauge goes with the last
	value   float64 // counters and gauges
	hist    *histo  // histograms
	// What the last scrape saw of it (marked: there was one): the series budget rolls what it
	// counted since into _overflow when its workload is left out, and adds it to the offset
	// (off, offHist) its own series leaves out.
	marked   bool
	seen     float64
	seenHist *histo
	off      float64
	offHist  *histo
}

// histo is an exported histogram: counts per merged bucket (not cumulative), the last +Inf.
type histo struct {
	buckets [nBuckets]uint64
	count   uint64
	sumNs   uint64
}

// cgroupState is what one cgroup (or the node) fed: the last value of each of its sources.
type cgroupState struct {
	path    string
	w       *workload
	sources map[sourceKey]*source
}

type source struct {
	out  *series
	last float64 // in the exported unit
	// Histograms: the last cumulative log2 buckets, count and sum.
	log2         *[hist.Slots]uint64
	count, sumNs uint64
}

// New returns an exporter; register it with a prometheus.Registerer.
func New(cfg Config) *Exporter {
	if cfg.MaxSeries <= 0 {
		cfg.MaxSeries = DefaultMaxSeries
	}
	if cfg.Classify == nil {
		cfg.Classify = func(cg string) (string, string, bool) { w, k := kubeid.Classify(cg); return w, k, true }
	}
	if cfg.ForgetGrace <= 0 {
		cfg.ForgetGrace = DefaultForgetGrace
	}
	if cfg.SeriesBudget <= 0 {
		cfg.SeriesBudget = DefaultSeriesBudget
	}
	return &Exporter{
		cfg:       cfg,
		cgroups:   map[string]*cgroupState{},
		workloads: map[workloadKey]*workload{},
		node:      &cgroupState{w: &workload{series: map[seriesKey]*series{}}, sources: map[sourceKey]*source{}},
		preempted: map[string]map[*cgroupState]int{},
		gone:      map[string]uint64{},
		rolled:    &workload{key: rolledKey, series: map[seriesKey]*series{}},
		now:       time.Now,
	}
}

// Observe takes one batch of records as the session appends it. Samples of metrics the exporter
// does not export, events and phases are ignored. It keeps no reference to the records.
func (e *Exporter) Observe(batch []rundir.Record) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.batch++
	for len(e.goneOrder) > 0 && e.goneOrder[0].until <= e.batch {
		t := e.goneOrder[0]
		if e.gone[t.cgroup] == t.until {
			delete(e.gone, t.cgroup)
		}
		e.goneOrder = e.goneOrder[1:]
	}
	if len(e.goneOrder) == 0 {
		e.goneOrder = nil // let the backing array go after a burst
		e.gone = maproom.Fit(&e.goneRoom, e.gone)
	}
	for i := range batch {
		r := &batch[i]
		if r.Type != rundir.TypeSample {
			continue
		}
		s, key, out, ok := route(r)
		if !ok {
			continue
		}
		st := e.node
		if !s.node {
			if st = e.cgroup(r.Cgroup); st == nil {
				continue
			}
		}
		src := st.sources[key]
		if src == nil {
			if src = e.newSource(st, s, key, out); src == nil {
				continue
			}
		}
		src.update(s, r)
	}
}

// cgroup is the state of the cgroup at path, new if need be; nil for no cgroup, an unresolved
// one (<unknown:id>: not attributable, and never forgotten) or a cgroup just forgotten.
func (e *Exporter) cgroup(path string) *cgroupState {
	if st := e.cgroups[path]; st != nil {
		return st
	}
	if path == "" || path[0] == '<' {
		return nil
	}
	if _, ok := e.gone[path]; ok {
		return nil
	}
	name, kind, ok := e.cfg.Classify(path)
	if !ok {
		return nil
	}
	k := workloadKey{name, kind}
	w := e.workloads[k]
	if w == nil {
		if e.tracked >= e.cfg.MaxSeries {
			k = workloadKey{Overflow, kubeid.KindOther}
			w = e.workloads[k]
		} else {
			e.tracked++
		}
		if w == nil {
			w = &workload{key: k, series: map[seriesKey]*series{}}
			e.workloads[k] = w
		}
	}
	if w.key.name == Overflow {
		e.overflow++
	}
	w.cgroups++
	st := &cgroupState{path: path, w: w, sources: map[sourceKey]*source{}}
	e.cgroups[path] = st
	return st
}

// newSource starts feeding a series of st's workload from one of st's series; nil when the
// source is a run-queue wait behind a preemptor just forgotten, whose last values would count
// twice.
func (e *Exporter) newSource(st *cgroupState, s *spec, key sourceKey, out [2]string) *source {
	if s.preemptor {
		by := key.a
		if _, ok := e.gone[by]; ok {
			return nil
		}
		out[0] = e.preemptorClass(st, by)
		if by != "" && by[0] != '<' && by != st.path {
			if e.preempted[by] == nil {
				e.preempted[by] = map[*cgroupState]int{}
			}
			e.preempted[by][st]++
		}
	}
	ser := st.w.seriesOf(seriesKey{s, out[0], out[1]})
	ser.sources++
	src := &source{out: ser}
	if s.typ == histogram {
		src.log2 = &[hist.Slots]uint64{}
	}
	st.sources[key] = src
	return src
}

// preemptorClass collapses the preemptor of st's tasks into a bounded class.
func (e *Exporter) preemptorClass(st *cgroupState, by string) string {
	switch by {
	case rundir.CgroupIdle:
		return PreemptorIdle
	case rundir.CgroupThrottled:
		return PreemptorThrottled
	case rundir.CgroupKernel:
		return PreemptorKernel
	case st.path:
		return PreemptorOwn
	}
	// Another cgroup of the same workload (a container's sub-cgroup) is the workload's own.
	if name, kind, _ := e.cfg.Classify(by); st.w.key == (workloadKey{name, kind}) {
		return PreemptorOwn
	}
	return PreemptorNeighbour
}

// update adds what r brings since the source's last record to its series. A value below the
// last is a reset (the producer's entry was recreated): all of it is new.
func (src *source) update(s *spec, r *rundir.Record) {
	out := src.out
	switch s.typ {
	case counter:
		if r.Value == nil {
			return
		}
		v := *r.Value * s.scale
		if v >= src.last {
			out.value += v - src.last
		} else {
			out.value += v
		}
		src.last = v
	case gauge:
		if r.Value == nil {
			return
		}
		v := *r.Value * s.scale
		out.value += v - src.last
		src.last = v
	case histogram:
		if r.Hist != nil {
			src.addHist(r.Hist)
		}
	}
}

func (src *source) addHist(h *hist.Log2) {
	var now [hist.Slots]uint64
	for i, c := range h.Buckets {
		now[min(i, hist.Slots-1)] += c // a longer histogram than the kernel's: the rest is +Inf anyway
	}
	reset := h.Count < src.count || h.SumNs < src.sumNs
	for i := 0; i < hist.Slots && !reset; i++ {
		reset = now[i] < src.log2[i]
	}
	if reset {
		*src.log2 = [hist.Slots]uint64{}
		src.count, src.sumNs = 0, 0
	}
	out := src.out.hist
	for i, c := range now {
		out.buckets[mergedBucket[i]] += c - src.log2[i]
	}
	out.count += h.Count - src.count
	out.sumNs += h.SumNs - src.sumNs
	*src.log2, src.count, src.sumNs = now, h.Count, h.SumNs
}

// Forget drops a removed cgroup: its workload's series go at the next scrape when it was the
// workload's last cgroup, and a gauge it alone fed goes with it. Its records are dropped for
// Config.ForgetGrace batches; after that the path counts as a new cgroup.
func (e *Exporter) Forget(cgroup string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.cgRoom.Saw(len(e.cgroups))
	e.wlRoom.Saw(len(e.workloads))
	e.preRoom.Saw(len(e.preempted))
	defer func() {
		e.cgroups, e.workloads = maproom.Fit(&e.cgRoom, e.cgroups), maproom.Fit(&e.wlRoom, e.workloads)
		e.preempted = maproom.Fit(&e.preRoom, e.preempted)
	}()
	if st := e.cgroups[cgroup]; st != nil {
		for key, src := range st.sources {
			e.dropSource(st, key, src)
		}
		delete(e.cgroups, cgroup)
		w := st.w
		if w.key.name == Overflow {
			e.overflow--
		}
		if w.cgroups--; w.cgroups == 0 {
			switch {
			case w.key == rolledKey:
				// _overflow's counters never go back, whatever rolls up into it later.
				e.absorb(w)
			case len(e.rolled.series) > 0:
				// Once the budget rolls up, what a workload counted since the last scrape
				// is not lost with it: it goes to _overflow.
				for k, s := range w.series {
					if k.spec.typ != gauge {
						s.rollInto(e.rolled)
					}
				}
			}
			delete(e.workloads, w.key)
			if w.key.name != Overflow {
				e.tracked--
			}
		}
	}
	for victim := range e.preempted[cgroup] {
		for _, m := range preemptorMetrics {
			key := sourceKey{metric: m, a: cgroup}
			if src := victim.sources[key]; src != nil {
				e.dropSource(victim, key, src)
			}
		}
	}
	until := e.batch + uint64(e.cfg.ForgetGrace) + 1
	e.gone[cgroup] = until
	e.goneRoom.Saw(len(e.gone))
	e.goneOrder = append(e.goneOrder, tombstone{cgroup, until})
}

// dropSource stops src feeding its series: a gauge loses its share, and goes with its last
// source; a counter or histogram keeps what it counted while its workload lives.
func (e *Exporter) dropSource(st *cgroupState, key sourceKey, src *source) {
	out := src.out
	out.sources--
	if out.key.spec.typ == gauge {
		out.value -= src.last
		if out.sources == 0 {
			delete(st.w.series, out.key)
		}
	}
	if m := e.preempted[key.a]; m != nil && out.key.spec.preemptor {
		if m[st]--; m[st] <= 0 {
			delete(m, st)
		}
		if len(m) == 0 {
			delete(e.preempted, key.a)
		}
	}
	delete(st.sources, key)
}

// absorb keeps the counters of the overflow workload, which goes with its last cgroup, in the
// rollup its rows were merged with, so that _overflow's counters never go back.
func (e *Exporter) absorb(w *workload) {
	for k, s := range w.series {
		if k.spec.typ == gauge {
			continue
		}
		e.rolled.seriesOf(k).addExported(s)
	}
}

// seriesOf is w's series of key k, new if need be.
func (w *workload) seriesOf(k seriesKey) *series {
	s := w.series[k]
	if s == nil {
		s = &series{key: k}
		if k.spec.typ == histogram {
			s.hist = &histo{}
		}
		w.series[k] = s
	}
	return s
}
