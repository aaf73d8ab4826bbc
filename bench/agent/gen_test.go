//go:build linux

package agent

import (
	"fmt"
	"math/rand/v2"

	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

// node makes the agent's batches for a node of many cgroups, one second each, deterministically,
// shaped as docs/flight-recorder.md's "Setup": per cgroup 25 counters (run-queue preemptions
// and preempted wait by three preemptors among them), 2 gauges and 7 log2 histograms of about
// a dozen populated buckets; a fifth of the cgroups busy, their series changing about every
// other second, the others' rarely. As the agent does, a batch holds the counters and
// histograms that changed and every gauge. In the seconds next is told are contended, one busy
// cgroup in ten waits longer for a CPU, preempted by a neighbour, so that a window has cgroups
// whose waits rose for the analyzer to examine.
type node struct {
	rng       *rand.Rand
	contended []string // the cgroups whose waits rise when contended
	series    []*genSeries
	batch     []rundir.Record
	seconds   int
}

// genSeries is one series: a counter (raw integer, step added when it changes, scale to the
// recorded unit), a gauge, or a histogram around a bucket.
type genSeries struct {
	rec       rundir.Record
	busy      bool
	contended bool // waits longer once the node is contended: its run-queue histogram, its neighbour's preempted wait
	raw       uint64
	lo, hi    uint64 // a counter's step
	scale     float64
	gauge     bool
	h         *hist.Log2
	bucket    int
}

// Shares of series that change from one second to the next, in a busy and an idle cgroup:
// with a fifth busy, about 9% of all samples change.
const (
	busyChanges = 0.46
	idleChanges = 0.002
)

// newNode makes cgroups cgroups; the first is the kubelet's, a daemon the agent follows.
func newNode(cgroups int, seed uint64) *node {
	n := &node{rng: rand.New(rand.NewPCG(seed, ^seed))}
	const dev = "253:0"
	type counter struct {
		metric string
		labels map[string]string
		lo, hi uint64
		scale  float64
	}
	l := func(kv ...string) map[string]string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	for c := range cgroups {
		cg := kubeletCgroup
		if c > 0 {
			cg = fmt.Sprintf("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%016x.slice/cri-containerd-%016x%016x.scope",
				n.rng.Uint64(), n.rng.Uint64(), n.rng.Uint64())
		}
		busy, contended := c%5 == 0, c%50 == 10
		if contended {
			n.contended = append(n.contended, cg)
		}
		counters := []counter{
			{rundir.MetricCPUUsage, nil, 1e6, 5e8, 1e-9}, // cpuacct.usage, ns
			{rundir.MetricCPUPeriods, nil, 5, 10, 1},
			{rundir.MetricCPUThrottled, nil, 1, 5, 1},
			{rundir.MetricCPUThrottledTime, nil, 1e6, 1e8, 1e-9},
			{rundir.MetricMemoryMajorFaults, nil, 1, 100, 1},
			{rundir.MetricMemoryRefaults, l(rundir.LabelKind, rundir.RefaultAnon), 1, 500, 1},
			{rundir.MetricMemoryRefaults, l(rundir.LabelKind, rundir.RefaultFile), 1, 500, 1},
			{rundir.MetricMemoryOOMKills, nil, 1, 1, 1},
			{rundir.MetricMemoryLimitEvents, l(rundir.LabelKind, rundir.LimitMax), 1, 50, 1},
			{rundir.MetricMemoryLimitEvents, l(rundir.LabelKind, rundir.LimitHigh), 1, 50, 1},
			{rundir.MetricReclaimPages, l(rundir.LabelKind, rundir.ReclaimDirect), 32, 4096, 1},
			{rundir.MetricBlkBytes, l(rundir.LabelDevice, dev, rundir.LabelOp, rundir.OpWrite), 4096, 1 << 20, 1},
			{rundir.MetricBlkRequests, l(rundir.LabelDevice, dev, rundir.LabelOp, rundir.OpWrite), 1, 64, 1},
		}
		for _, res := range []string{rundir.ResourceCPU, rundir.ResourceMemory, rundir.ResourceIO} {
			for _, kind := range []string{rundir.PressureSome, rundir.PressureFull} {
				counters = append(counters, counter{rundir.MetricCgroupPressure, l(rundir.LabelResource, res, rundir.LabelKind, kind), 1, 1e6, 1e-6})
			}
		}
		// A neighbour pod's cgroup preempts it, besides the kernel's threads and idle.
		neighbour := fmt.Sprintf("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod%d.slice", c%7)
		for _, p := range []string{rundir.CgroupKernel, rundir.CgroupIdle, neighbour} {
			counters = append(counters,
				counter{rundir.MetricRunqPreemptions, l(rundir.LabelPreemptor, p), 1, 200, 1},
				counter{rundir.MetricRunqPreemptWait, l(rundir.LabelPreemptor, p), 1e3, 1e7, 1e-9})
		}
		neighbourWait := len(counters) - 1
		base := rundir.Record{Type: rundir.TypeSample, Cgroup: cg}
		for i, k := range counters {
			r := base
			r.Metric, r.Labels = k.metric, k.labels
			n.series = append(n.series, &genSeries{rec: r, busy: busy, raw: n.rng.Uint64N(1 << 32), lo: k.lo, hi: k.hi, scale: k.scale,
				contended: contended && i == neighbourWait})
		}
		for _, m := range []string{rundir.MetricMemoryUsage, rundir.MetricMemorySwap} {
			r := base
			r.Metric = m
			n.series = append(n.series, &genSeries{rec: r, busy: busy, gauge: true, raw: 4096 * n.rng.Uint64N(1<<18), scale: 1})
		}
		for _, h := range []struct {
			metric string
			labels map[string]string
		}{
			{rundir.MetricRunqLatency, nil},
			{rundir.MetricFsyncLatency, l(rundir.LabelSyscall, rundir.SyscallFsync, rundir.LabelDevice, dev)},
			{rundir.MetricBlkQueue, l(rundir.LabelDevice, dev, rundir.LabelOp, rundir.OpRead)},
			{rundir.MetricBlkQueue, l(rundir.LabelDevice, dev, rundir.LabelOp, rundir.OpWrite)},
			{rundir.MetricBlkService, l(rundir.LabelDevice, dev, rundir.LabelOp, rundir.OpRead)},
			{rundir.MetricBlkService, l(rundir.LabelDevice, dev, rundir.LabelOp, rundir.OpWrite)},
			{rundir.MetricReclaimStall, l(rundir.LabelKind, rundir.ReclaimDirect)},
		} {
			r := base
			r.Metric, r.Labels = h.metric, h.labels
			s := &genSeries{rec: r, busy: busy, h: &hist.Log2{}, bucket: 10 + n.rng.IntN(10),
				contended: contended && h.metric == rundir.MetricRunqLatency}
			s.observe(n.rng, 200, 0)
			n.series = append(n.series, s)
		}
	}
	return n
}

// kubeletCgroup is the daemon's cgroup in the generated node and its meta.
const kubeletCgroup = "/system.slice/kubelet.service"

// contention is how many buckets (powers of two) longer a contended cgroup's waits get.
const contention = 4

// observe adds k values around the series' bucket, shift buckets up.
func (s *genSeries) observe(r *rand.Rand, k, shift int) {
	for range k {
		b := max(0, s.bucket+shift+r.IntN(6)-r.IntN(6))
		if b >= len(s.h.Buckets) {
			s.h.Buckets = append(s.h.Buckets, make([]uint64, b+1-len(s.h.Buckets))...)
		}
		s.h.Buckets[b]++
		s.h.Count++
		s.h.SumNs += 1<<b + r.Uint64N(1<<b)
	}
}

// next returns the next second's batch, valid until the next call; contended says whether
// the contended cgroups wait longer in it.
func (n *node) next(contended bool) []rundir.Record {
	n.batch = n.batch[:0]
	first := n.seconds == 0
	n.seconds++
	for _, s := range n.series {
		p := idleChanges
		if s.busy {
			p = busyChanges
		}
		hot := contended && s.contended
		changed := first || hot || n.rng.Float64() < p
		r := s.rec
		switch {
		case s.h != nil:
			if !changed {
				continue
			}
			if !first {
				shift := 0
				if hot {
					shift = contention
				}
				s.observe(n.rng, 1+n.rng.IntN(40), shift)
			}
			// The tracer hands over a histogram of its own each time.
			h := *s.h
			h.Buckets = append([]uint64(nil), s.h.Buckets...)
			r.Hist = &h
		case s.gauge:
			if changed && !first {
				s.raw = 4096 * n.rng.Uint64N(1<<18)
			}
			v := float64(s.raw) * s.scale
			r.Value = &v
		default:
			if !changed {
				continue
			}
			if !first {
				step := s.lo + n.rng.Uint64N(s.hi-s.lo+1)
				if hot {
					step <<= contention
				}
				s.raw += step
			}
			v := float64(s.raw) * s.scale
			r.Value = &v
		}
		n.batch = append(n.batch, r)
	}
	return n.batch
}
