package flightrec

import (
	"fmt"
	"math/rand/v2"

	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

// gen makes ticks shaped as docs/flight-recorder.md's "Setup": per cgroup 25 counters, 2
// gauges and 7 histograms with about 11 populated buckets; a fifth of the cgroups busy, whose
// series change about every other second, the others rarely. Like the agent, it sends the
// counters and histograms that changed and every gauge.
type gen struct {
	rng    *rand.Rand
	series []*gseries // of cgroups first.. on
	recs   []rundir.Record
	lo, hi int // the cgroups alive, as pods come and go; all of them unless live says otherwise
	first  int // the first cgroup kept
	made   int // cgroups made
	keep   int // cgroups kept, the last made
}

type gseries struct {
	rec    rundir.Record // metric, cgroup, workload, labels
	sent   bool          // at least once: a series' first tick sends it whatever its kind
	busy   bool
	gauge  bool
	step   func(r *rand.Rand, v uint64) uint64 // a counter's next raw value
	scale  func(uint64) float64                // raw value to the recorded one
	raw    uint64
	h      *hist.Log2 // histograms
	center int        // the bucket their values cluster at
}

// Changes per second of a busy cgroup's series and of an idle one's: with a fifth busy, about
// 9% of all samples change from one second to the next.
const (
	busyChange = 0.46
	idleChange = 0.002
)

func newGen(cgroups int, seed uint64) *gen {
	g := &gen{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), hi: cgroups, keep: cgroups}
	for range cgroups {
		g.addCgroup()
	}
	g.recs = make([]rundir.Record, 0, len(g.series))
	return g
}

// live makes the next ticks send only cgroups lo..hi-1, the others being gone or not there
// yet. Cgroups are made as they come; gone ones are forgotten but for the last made, as many
// as newGen made, so that the generator's heap stays about the same.
func (g *gen) live(lo, hi int) {
	for g.made < hi {
		g.addCgroup()
	}
	first := min(lo, max(g.first, g.made-g.keep))
	gone := (first - g.first) * seriesPerCgroup
	clear(g.series[:gone])
	g.series, g.first, g.lo, g.hi = g.series[gone:], first, lo, hi
}

func (g *gen) addCgroup() {
	usec := func(v uint64) float64 { return float64(v) * 1e-6 } // as the cgroup sampler reads usage_usec
	psi := func(v uint64) float64 { return float64(v) / 1e6 }   // as it reads PSI totals
	nsec := func(v uint64) float64 { return float64(v) / 1e9 }  // as the tracer converts ns
	count := func(v uint64) float64 { return float64(v) }
	add := func(lo, hi uint64) func(*rand.Rand, uint64) uint64 {
		return func(r *rand.Rand, v uint64) uint64 { return v + lo + r.Uint64N(hi-lo+1) }
	}
	type counter struct {
		metric string
		labels map[string]string
		step   func(*rand.Rand, uint64) uint64
		scale  func(uint64) float64
	}
	dev := "259:0"
	c := g.made
	g.made++
	pod := fmt.Sprintf("%08x-%04x-%04x-%04x-%012x", g.rng.Uint32(), g.rng.Uint32()&0xffff, g.rng.Uint32()&0xffff, g.rng.Uint32()&0xffff, g.rng.Uint64()&0xffffffffffff)
	cg := fmt.Sprintf("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%s.slice/cri-containerd-%016x%016x.scope", pod, g.rng.Uint64(), g.rng.Uint64())
	wl := fmt.Sprintf("default/app-%d-%05x", c%40, g.rng.Uint32()&0xfffff)
	busy := c%5 == 0
	counters := []counter{
		{rundir.MetricCPUUsage, nil, add(1e3, 5e5), usec},
		{rundir.MetricCPUPeriods, nil, add(5, 10), count},
		{rundir.MetricCPUThrottled, nil, add(1, 5), count},
		{rundir.MetricCPUThrottledTime, nil, add(1e3, 1e5), usec},
		{rundir.MetricMemoryMajorFaults, nil, add(1, 100), count},
		{rundir.MetricMemoryRefaults, map[string]string{rundir.LabelKind: rundir.RefaultAnon}, add(1, 500), count},
		{rundir.MetricMemoryRefaults, map[string]string{rundir.LabelKind: rundir.RefaultFile}, add(1, 500), count},
		{rundir.MetricMemoryOOMKills, nil, add(1, 1), count},
		{rundir.MetricMemoryLimitEvents, map[string]string{rundir.LabelKind: rundir.LimitMax}, add(1, 50), count},
		{rundir.MetricMemoryLimitEvents, map[string]string{rundir.LabelKind: rundir.LimitHigh}, add(1, 50), count},
		{rundir.MetricReclaimPages, map[string]string{rundir.LabelKind: rundir.ReclaimDirect}, add(32, 4096), count},
	}
	for _, res := range []string{rundir.ResourceCPU, rundir.ResourceMemory, rundir.ResourceIO} {
		for _, kind := range []string{rundir.PressureSome, rundir.PressureFull} {
			counters = append(counters, counter{rundir.MetricCgroupPressure, map[string]string{rundir.LabelResource: res, rundir.LabelKind: kind}, add(1, 1e6), psi})
		}
	}
	for _, p := range []string{rundir.CgroupKernel, rundir.CgroupIdle, fmt.Sprintf("/kubepods.slice/kubepods-besteffort.slice/pod-%d.slice", c%7)} {
		counters = append(counters,
			counter{rundir.MetricRunqPreemptions, map[string]string{rundir.LabelPreemptor: p}, add(1, 200), count},
			counter{rundir.MetricRunqPreemptWait, map[string]string{rundir.LabelPreemptor: p}, add(1e3, 1e8), nsec})
	}
	counters = append(counters,
		counter{rundir.MetricBlkBytes, map[string]string{rundir.LabelDevice: dev, rundir.LabelOp: rundir.OpWrite}, func(r *rand.Rand, v uint64) uint64 { return v + 4096*(1+r.Uint64N(256)) }, count},
		counter{rundir.MetricBlkRequests, map[string]string{rundir.LabelDevice: dev, rundir.LabelOp: rundir.OpWrite}, add(1, 64), count})
	base := rundir.Record{Type: rundir.TypeSample, Cgroup: cg, Workload: wl}
	for _, k := range counters {
		r := base
		r.Metric, r.Labels = k.metric, k.labels
		g.series = append(g.series, &gseries{rec: r, busy: busy, step: k.step, scale: k.scale, raw: g.rng.Uint64N(1 << 30)})
	}
	for _, m := range []string{rundir.MetricMemoryUsage, rundir.MetricMemorySwap} {
		r := base
		r.Metric = m
		g.series = append(g.series, &gseries{rec: r, busy: busy, gauge: true, scale: count, raw: 4096 * g.rng.Uint64N(1<<18)})
	}
	hists := []struct {
		metric string
		labels map[string]string
	}{
		{rundir.MetricRunqLatency, nil},
		{rundir.MetricFsyncLatency, map[string]string{rundir.LabelSyscall: rundir.SyscallFsync, rundir.LabelDevice: dev}},
		{rundir.MetricBlkQueue, map[string]string{rundir.LabelDevice: dev, rundir.LabelOp: rundir.OpRead}},
		{rundir.MetricBlkQueue, map[string]string{rundir.LabelDevice: dev, rundir.LabelOp: rundir.OpWrite}},
		{rundir.MetricBlkService, map[string]string{rundir.LabelDevice: dev, rundir.LabelOp: rundir.OpRead}},
		{rundir.MetricBlkService, map[string]string{rundir.LabelDevice: dev, rundir.LabelOp: rundir.OpWrite}},
		{rundir.MetricReclaimStall, map[string]string{rundir.LabelKind: rundir.ReclaimDirect}},
	}
	for _, h := range hists {
		r := base
		r.Metric, r.Labels = h.metric, h.labels
		center := 10 + g.rng.IntN(12)
		// Room for every bucket it will have: the generator's heap stays as it starts, and
		// the writer's is measured apart from it.
		gs := &gseries{rec: r, busy: busy, h: &hist.Log2{Buckets: make([]uint64, 0, center+6)}, center: center}
		gs.addEvents(g.rng, 200)
		g.series = append(g.series, gs)
	}
}

// addEvents adds n values around the series' center: 11-12 populated buckets.
func (s *gseries) addEvents(r *rand.Rand, n int) {
	for range n {
		b := s.center + r.IntN(6) - r.IntN(6)
		for len(s.h.Buckets) <= b {
			s.h.Buckets = append(s.h.Buckets, 0)
		}
		s.h.Buckets[b]++
		s.h.Count++
		s.h.SumNs += 1<<b + r.Uint64N(1<<b)
	}
}

// seriesPerCgroup is the generator's series per cgroup.
const seriesPerCgroup = 34

// tick returns the records of the next second; they are valid until the next call.
func (g *gen) tick() []rundir.Record {
	clear(g.recs) // the last tick's histograms are the caller's no more
	g.recs = g.recs[:0]
	for _, s := range g.series[(g.lo-g.first)*seriesPerCgroup : (g.hi-g.first)*seriesPerCgroup] {
		p := idleChange
		if s.busy {
			p = busyChange
		}
		first := !s.sent
		s.sent = true
		changed := first || g.rng.Float64() < p
		switch {
		case s.h != nil:
			if !changed {
				continue
			}
			if !first {
				s.addEvents(g.rng, 1+g.rng.IntN(40))
			}
			// The tracer hands over a fresh histogram each time.
			h := *s.h
			h.Buckets = append([]uint64(nil), s.h.Buckets...)
			r := s.rec
			r.Hist = &h
			g.recs = append(g.recs, r)
		case s.gauge:
			if changed && !first {
				s.raw = 4096 * g.rng.Uint64N(1<<18)
			}
			v := s.scale(s.raw)
			r := s.rec
			r.Value = &v
			g.recs = append(g.recs, r)
		default:
			if !changed {
				continue
			}
			if !first {
				s.raw = s.step(g.rng, s.raw)
			}
			v := s.scale(s.raw)
			r := s.rec
			r.Value = &v
			g.recs = append(g.recs, r)
		}
	}
	return g.recs
}
