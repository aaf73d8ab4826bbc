package exporter

import (
	"cmp"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/nodectl/nodectl/host/kubeid"
	"github.com/nodectl/nodectl/rundir"
)

// densePod is the i-th pod of a dense node, systemd driver: its cgroup and its two
// containers' (the sandbox's pause and the app).
func densePod(i int) (pod string, containers [2]string) {
	uid := fmt.Sprintf("%08d_0000_0000_0000_000000000000", i)
	pod = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + uid + ".slice"
	for c := range containers {
		containers[c] = fmt.Sprintf("%s/cri-containerd-%012x%052x.scope", pod, 2*i+c, 0)
	}
	return pod, containers
}

// denseNode feeds a node of n pods, busy of them (every n/busy-th, from shift on) burning CPU
// and waiting to run, the others idle but for a trickle, and keeps what it fed each workload.
type denseNode struct {
	n, busy, shift int
	gone           map[int]bool       // pods removed
	usage          map[string]float64 // by workload label value: CPU seconds fed so far
	busyTicks      map[string]uint64  // ticks a container was busy, and idle
	idleTicks      map[string]uint64
}

func (d *denseNode) isBusy(i int) bool { return (i+d.shift)%(d.n/d.busy) == 0 }

// idleRunq is a trickle of waits: one of 4-8 µs.
var idleRunq = []uint64{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}

// tick returns the records of the next tick (cumulative values, as the session's).
func (d *denseNode) tick() []rundir.Record {
	if d.usage == nil {
		d.usage, d.busyTicks, d.idleTicks = map[string]float64{}, map[string]uint64{}, map[string]uint64{}
	}
	var batch []rundir.Record
	for i := range d.n {
		if d.gone[i] {
			continue
		}
		pod, cs := densePod(i)
		rate := 0.001
		if d.isBusy(i) {
			rate = 1
		}
		for _, cg := range append([]string{pod}, cs[:]...) {
			w, _ := kubeid.Classify(cg)
			if cg == pod {
				d.usage[w] += 2 * rate // hierarchical: the pod's reading holds its containers'
			} else {
				d.usage[w] += rate
			}
			batch = append(batch,
				rec(rundir.MetricCPUUsage, cg, d.usage[w]),
				rec(rundir.MetricCPUPeriods, cg, 10*d.usage[w]),
				rec(rundir.MetricCPUThrottled, cg, 0),
				rec(rundir.MetricCPUThrottledTime, cg, 0),
				rec(rundir.MetricMemoryUsage, cg, 1e6),
				rec(rundir.MetricMemorySwap, cg, 0),
				rec(rundir.MetricMemoryMajorFaults, cg, 0),
				rec(rundir.MetricMemoryRefaults, cg, 0, rundir.LabelKind, rundir.RefaultAnon),
				rec(rundir.MetricMemoryRefaults, cg, 0, rundir.LabelKind, rundir.RefaultFile),
				rec(rundir.MetricMemoryOOMKills, cg, 0))
			if cg == pod {
				continue
			}
			// An idle container waits a few µs a tick, a busy one seconds.
			if d.isBusy(i) {
				d.busyTicks[w]++
			} else {
				d.idleTicks[w]++
			}
			h := log2(d.busyTicks[w], baseRunq)
			idle := log2(d.idleTicks[w], idleRunq)
			for b, c := range idle.Buckets {
				h.Buckets[b] += c
			}
			h.Count, h.SumNs = h.Count+idle.Count, h.SumNs+idle.SumNs
			batch = append(batch,
				histRec(rundir.MetricRunqLatency, cg, h),
				rec(rundir.MetricRunqPreemptWait, cg, d.usage[w]/10, rundir.LabelPreemptor, rundir.CgroupKernel),
				rec(rundir.MetricRunqWakeupWait, cg, d.usage[w]/10, rundir.LabelPreemptor, cgKubelet))
		}
	}
	return batch
}

// A node of 500 pods (1,500 workloads, about 30,000 series whole) scrapes within the series
// budget; the busy pods' workloads keep their series, whole and exact, also when other pods
// turn busy; what the others count goes to _overflow's series, so that the increases of the
// exported workloads and of the overflow add up to what the node counted, scrape after
// scrape, whichever workloads change places.
func TestSeriesBudget(t *testing.T) {
	for _, c := range []struct{ pods, busy, budget int }{{500, 10, 0}, {500, 25, 0}, {500, 10, 1500}, {120, 4, 0}} {
		t.Run(fmt.Sprintf("pods=%d,busy=%d,budget=%d", c.pods, c.busy, c.budget), func(t *testing.T) {
			budget := cmp.Or(c.budget, DefaultSeriesBudget)
			// An agent for 500 pods follows their 1,500 cgroups (--max-cgroups).
			e := New(Config{SeriesBudget: c.budget, MaxSeries: 4 * c.pods, Self: self})
			// Scraped every 15 s: a workload's score halves from one scrape to the next.
			clock := t0
			e.now = func() time.Time { return clock }
			d := &denseNode{n: c.pods, busy: c.busy}
			overflow := []string{LabelWorkload, Overflow, LabelKind, kubeid.KindOther}
			usageOf := func(got map[string]float64, w, kind string) (float64, bool) {
				v, ok := got[key("nodectl_cpu_usage_seconds_total", LabelWorkload, w, LabelKind, kind)]
				return v, ok
			}
			prevFed, lastOwn, rolledOnce := map[string]float64{}, map[string]float64{}, map[string]bool{}
			var prevOverflow, prevOverflowWait float64
			// At the fifth tick other pods turn busy and the busy ones idle: the new busy
			// pods' workloads are exported from the scrape after (their score passes the
			// old ones', decayed, at the second scrape of their load).
			const shiftAt, removeAt = 5, 7
			rolledPod := -1
			for k := 1; k <= 8; k++ {
				if k == shiftAt {
					d.shift = 1
				}
				e.Observe(d.tick())
				clock = clock.Add(15 * time.Second)
				// At the seventh, a pod rolled up at the sixth scrape is removed: what it
				// counted since goes to _overflow all the same.
				if k == removeAt && rolledPod >= 0 {
					d.gone = map[int]bool{rolledPod: true}
					pod, cs := densePod(rolledPod)
					for _, cg := range append([]string{pod}, cs[:]...) {
						e.Forget(cg)
					}
				}
				got := scrape(t, e)
				lines := got[key("nodectl_exporter_series")]
				if lines > float64(budget) {
					t.Errorf("scrape %d: %v series, budget %d", k, lines, budget)
				}
				// The gauge counts what was sent: each histogram's +Inf bucket, which the
				// scrape's map leaves out, too.
				sent := len(got)
				for k := range got {
					if strings.Contains(k, "_count{") {
						sent++
					}
				}
				if float64(sent) != lines {
					t.Errorf("scrape %d: nodectl_exporter_series %v, %d sent", k, lines, sent)
				}
				rolled := got[key("nodectl_exporter_workloads", labelState, stateRolled)]
				if rolled == 0 {
					t.Fatalf("scrape %d: no workload rolled up, %v series", k, lines)
				}
				// Every busy workload is exported; one never rolled up, with all it counted.
				var seen float64 // the exported workloads' increases since they were last seen
				for i := 0; i < c.pods; i++ {
					if d.gone[i] {
						continue
					}
					pod, cs := densePod(i)
					rolledCgroups := 0
					for _, cg := range append([]string{pod}, cs[:]...) {
						w, kind := kubeid.Classify(cg)
						v, ok := usageOf(got, w, kind)
						if ok {
							if !rolledOnce[w] && v != d.usage[w] {
								t.Errorf("scrape %d: %s used %v, fed %v", k, w, v, d.usage[w])
							}
							// A series that comes back goes on from where it was.
							if v < lastOwn[w] {
								t.Errorf("scrape %d: %s's usage went back from %v to %v", k, w, lastOwn[w], v)
							}
							seen += v - lastOwn[w]
							lastOwn[w] = v
						} else {
							rolledOnce[w] = true
						}
						if !ok && d.isBusy(i) && k > 1 && k != shiftAt {
							t.Errorf("scrape %d: busy %s (%s) not exported", k, w, kind)
						} else if !ok {
							rolledCgroups++
						}
						if info, named := got[key("nodectl_pod_info", LabelWorkload, w)]; named && !ok {
							t.Errorf("scrape %d: %s's info (%v) without its series", k, w, info)
						}
					}
					if k == removeAt-1 && rolledPod < 0 && rolledCgroups == 1+len(cs) {
						rolledPod = i
					}
				}
				if k == removeAt-1 && rolledPod < 0 && c.pods >= 500 {
					t.Fatalf("scrape %d: no pod rolled up whole", k)
				}
				// What the node counted since the last scrape is in the exported workloads'
				// increases since they were last seen and in the overflow's; the overflow's
				// counters never go back.
				ov, _ := got[key("nodectl_cpu_usage_seconds_total", overflow...)]
				ovWait := got[key("nodectl_runq_latency_seconds_sum", overflow...)]
				if ov < prevOverflow || ovWait < prevOverflowWait {
					t.Errorf("scrape %d: _overflow's counters went back: usage %v after %v, wait %v after %v", k, ov, prevOverflow, ovWait, prevOverflowWait)
				}
				var fed float64
				for w, u := range d.usage {
					fed += u - prevFed[w]
				}
				seen += ov - prevOverflow
				if math.Abs(seen-fed) > 1e-6*fed {
					t.Errorf("scrape %d: exported and overflow usage rose %v, the node's %v", k, seen, fed)
				}
				prevFed = map[string]float64{}
				for w, u := range d.usage {
					prevFed[w] = u
				}
				prevOverflow, prevOverflowWait = ov, ovWait
				t.Logf("scrape %d: %v series, %v workloads exported, %v rolled", k, lines, got[key("nodectl_exporter_workloads", labelState, stateExported)], rolled)
			}
		})
	}
}
