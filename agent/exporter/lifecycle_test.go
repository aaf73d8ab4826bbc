package exporter

import (
	"fmt"
	"strings"
	"testing"

	"github.com/nodectl/nodectl/host/kubeid"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

// container is the path of the i-th container cgroup of a churning node, cgroupfs driver.
func container(i int) string {
	return fmt.Sprintf("/kubepods/burstable/pod%08d-0000-0000-0000-000000000000/%064x", i, i)
}

func workloadOf(cg string) []string {
	id, kind := kubeid.Classify(cg)
	return []string{LabelWorkload, id, LabelKind, kind}
}

// stateSize counts every entry of the exporter's state.
func stateSize(e *Exporter) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := len(e.cgroups) + len(e.workloads) + len(e.preempted) + len(e.gone) + len(e.goneOrder) + len(e.node.sources) + len(e.rolled.series)
	for _, st := range e.cgroups {
		n += len(st.sources)
	}
	for _, w := range e.workloads {
		n += len(w.series)
	}
	for _, m := range e.preempted {
		n += len(m)
	}
	return n
}

func TestCountersOnlyGrow(t *testing.T) {
	e := New(Config{})
	cg := container(1)
	usage := key("nodectl_cpu_usage_seconds_total", workloadOf(cg)...)
	mem := key("nodectl_memory_usage_bytes", workloadOf(cg)...)
	lat := key("nodectl_runq_latency_seconds_count", workloadOf(cg)...)
	latSum := key("nodectl_runq_latency_seconds_sum", workloadOf(cg)...)
	for i, step := range []struct {
		usage, mem float64
		lat        hist.Log2
		want       float64 // usage
		wantMem    float64
		wantLat    uint64
		wantSumNs  uint64
	}{
		{usage: 10, mem: 100, lat: log2(1, baseRunq), want: 10, wantMem: 100, wantLat: log2(1, baseRunq).Count, wantSumNs: log2(1, baseRunq).SumNs},
		{usage: 15, mem: 50, lat: log2(3, baseRunq), want: 15, wantMem: 50, wantLat: log2(3, baseRunq).Count, wantSumNs: log2(3, baseRunq).SumNs},
		// The producer's entry was recreated: it counts from 0 again, the series goes on.
		{usage: 3, mem: 70, lat: log2(1, baseRunq), want: 18, wantMem: 70, wantLat: log2(4, baseRunq).Count, wantSumNs: log2(4, baseRunq).SumNs},
		{usage: 4, mem: 70, lat: log2(2, baseRunq), want: 19, wantMem: 70, wantLat: log2(5, baseRunq).Count, wantSumNs: log2(5, baseRunq).SumNs},
	} {
		e.Observe([]rundir.Record{
			rec(rundir.MetricCPUUsage, cg, step.usage),
			rec(rundir.MetricMemoryUsage, cg, step.mem),
			histRec(rundir.MetricRunqLatency, cg, step.lat),
		})
		// A batch without the series (nothing changed) leaves them as they are.
		e.Observe(nil)
		got := scrape(t, e)
		if got[usage] != step.want || got[mem] != step.wantMem || got[lat] != float64(step.wantLat) || got[latSum] != float64(step.wantSumNs)/1e9 {
			t.Errorf("step %d: usage %v, memory %v, latency count %v sum %v; want %v, %v, %v, %v", i, got[usage], got[mem], got[lat], got[latSum],
				step.want, step.wantMem, step.wantLat, float64(step.wantSumNs)/1e9)
		}
	}
}

func TestOverflowBeyondMaxSeries(t *testing.T) {
	e := New(Config{MaxSeries: 3})
	var batch []rundir.Record
	for i := 1; i <= 5; i++ {
		batch = append(batch, rec(rundir.MetricCPUUsage, container(i), float64(i)), rec(rundir.MetricMemoryUsage, container(i), 100*float64(i)))
	}
	// A container's sub-cgroup is the container's workload: no new series, no slot taken.
	sub := container(1) + "/init"
	batch = append(batch, rec(rundir.MetricCPUUsage, sub, 0.5))
	e.Observe(batch)
	got := scrape(t, e)
	overflow := []string{LabelWorkload, Overflow, LabelKind, kubeid.KindOther}
	wantValues(t, got, map[string]float64{
		key("nodectl_cpu_usage_seconds_total", workloadOf(container(1))...): 1.5,
		key("nodectl_cpu_usage_seconds_total", workloadOf(container(3))...): 3,
		key("nodectl_cpu_usage_seconds_total", overflow...):                 9,
		key("nodectl_memory_usage_bytes", overflow...):                      900,
		key("nodectl_exporter_cgroups", labelState, stateTracked):           4,
		key("nodectl_exporter_cgroups", labelState, stateOverflow):          2,
	})
	if workloads := labelValues(got, LabelWorkload); len(workloads) != 4 {
		t.Errorf("workloads %v, want 3 and the overflow", workloads)
	}

	// The sub-cgroup goes: the container's counter keeps what it counted.
	e.Forget(sub)
	got = scrape(t, e)
	wantValues(t, got, map[string]float64{key("nodectl_cpu_usage_seconds_total", workloadOf(container(1))...): 1.5})

	// A tracked workload goes: its slot takes the next new cgroup; the overflow stays.
	e.Forget(container(1))
	e.Observe([]rundir.Record{rec(rundir.MetricCPUUsage, container(6), 6)})
	got = scrape(t, e)
	if _, ok := got[key("nodectl_cpu_usage_seconds_total", workloadOf(container(1))...)]; ok {
		t.Error("a forgotten workload's series is still there")
	}
	wantValues(t, got, map[string]float64{
		key("nodectl_cpu_usage_seconds_total", workloadOf(container(6))...): 6,
		key("nodectl_cpu_usage_seconds_total", overflow...):                 9,
		key("nodectl_exporter_cgroups", labelState, stateOverflow):          2,
	})

	// The overflow's cgroups go: a gauge loses their share at once, and goes with the last;
	// the overflow's counters stay, since whatever rolls up into _overflow later adds to them
	// (a counter that went back would read as a reset).
	e.Forget(container(4))
	got = scrape(t, e)
	wantValues(t, got, map[string]float64{key("nodectl_memory_usage_bytes", overflow...): 500, key("nodectl_cpu_usage_seconds_total", overflow...): 9})
	e.Forget(container(5))
	got = scrape(t, e)
	if _, ok := got[key("nodectl_memory_usage_bytes", overflow...)]; ok {
		t.Error("the overflow's gauge after its last cgroup went")
	}
	wantValues(t, got, map[string]float64{key("nodectl_exporter_cgroups", labelState, stateOverflow): 0,
		key("nodectl_cpu_usage_seconds_total", overflow...): 9})
}

// labelValues lists the distinct values of a label in a scrape.
func labelValues(got map[string]float64, label string) []string {
	seen := map[string]bool{}
	var out []string
	for k := range got {
		_, rest, ok := strings.Cut(k, label+"=\"")
		if !ok {
			continue
		}
		v := rest[:strings.IndexByte(rest, '"')]
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

func TestForget(t *testing.T) {
	const grace = 3
	e := New(Config{ForgetGrace: grace})
	pod, kubelet := container(1), cgKubelet
	neighbour := key("nodectl_runq_preempt_wait_seconds_total", append(workloadOf(kubelet), rundir.LabelPreemptor, PreemptorNeighbour)...)
	usage := key("nodectl_cpu_usage_seconds_total", workloadOf(pod)...)
	e.Observe([]rundir.Record{
		rec(rundir.MetricCPUUsage, pod, 5),
		histRec(rundir.MetricRunqLatency, pod, log2(1, baseRunq)),
		rec(rundir.MetricRunqPreemptWait, kubelet, 1.5, rundir.LabelPreemptor, pod),
	})
	e.Forget(pod)
	got := scrape(t, e)
	podID, _ := kubeid.Classify(pod)
	for k := range got {
		if strings.Contains(k, podID) {
			t.Errorf("%s after Forget", k)
		}
	}
	wantValues(t, got, map[string]float64{neighbour: 1.5})

	// The tracer's last values of the removed cgroup come after: dropped, not a new series,
	// and the kubelet's wait behind it is not counted twice.
	late := []rundir.Record{
		rec(rundir.MetricCPUUsage, pod, 6),
		histRec(rundir.MetricRunqLatency, pod, log2(2, baseRunq)),
		rec(rundir.MetricRunqPreemptWait, kubelet, 2, rundir.LabelPreemptor, pod),
	}
	for range grace {
		e.Observe(late)
		got = scrape(t, e)
		if _, ok := got[usage]; ok {
			t.Fatal("a forgotten cgroup's late record made its series again")
		}
		wantValues(t, got, map[string]float64{neighbour: 1.5})
	}

	// Past the grace, a cgroup of that path is a new one: it starts from its own values.
	e.Observe([]rundir.Record{
		rec(rundir.MetricCPUUsage, pod, 0.25),
		rec(rundir.MetricRunqPreemptWait, kubelet, 0.5, rundir.LabelPreemptor, pod),
	})
	wantValues(t, scrape(t, e), map[string]float64{usage: 0.25, neighbour: 2})
}

func TestChurnReturnsToBaseline(t *testing.T) {
	// 200 live containers are past the default series budget: what the budget rolled up into
	// _overflow stays, a series per key of the metrics' (bounded by their label values), and
	// nothing else.
	e := New(Config{})
	var nd node
	steady := func(n int) []rundir.Record {
		return append(nd.batch(n),
			rec(rundir.MetricRunqPreemptWait, cgKubelet, float64(n), rundir.LabelPreemptor, cgNeighbour),
			rec(rundir.MetricRunqWakeupWait, cgKubelet, float64(n), rundir.LabelPreemptor, cgNeighbour))
	}
	e.Observe(steady(1))
	series := func() float64 { return scrape(t, e)[key("nodectl_exporter_series")] }
	baseSeries, baseState := series(), stateSize(e)

	// 10,000 containers, 200 at a time, each preempting the kubelet and preempted by it; each
	// goes in the batch after the next. No overflow: fewer than MaxSeries live at once.
	const total, live = 10000, 200
	tick := 2
	for first := 0; first < total; first += live {
		batch := steady(tick)
		for i := first; i < first+live; i++ {
			cg := container(i)
			batch = append(batch,
				rec(rundir.MetricCPUUsage, cg, float64(tick)),
				rec(rundir.MetricMemoryUsage, cg, 1e6),
				histRec(rundir.MetricRunqLatency, cg, log2(uint64(tick), baseRunq)),
				rec(rundir.MetricRunqPreemptWait, cg, 0.5, rundir.LabelPreemptor, cgKubelet),
				rec(rundir.MetricRunqPreemptWait, cgKubelet, 0.5, rundir.LabelPreemptor, cg),
				rec(rundir.MetricRunqWakeupWait, cgKubelet, 0.25, rundir.LabelPreemptor, cg))
		}
		e.Observe(batch)
		tick++
		if first > 0 {
			for i := first - live; i < first; i++ {
				e.Forget(container(i))
			}
		}
	}
	if got := scrape(t, e)[key("nodectl_exporter_cgroups", labelState, stateOverflow)]; got != 0 {
		t.Fatalf("%v cgroups overflowed", got)
	}
	for i := total - live; i < total; i++ {
		e.Forget(container(i))
	}
	for range DefaultForgetGrace + 1 {
		e.Observe(steady(tick))
		tick++
	}
	rolledLines, rolledKeys := 0, len(e.rolled.series)
	for _, r := range e.rolled.series {
		rolledLines += r.lines()
	}
	if rolledKeys == 0 || rolledKeys > len(specs)+len(nodeSpecs) {
		t.Errorf("%d series rolled up into _overflow, want some, one per key at most", rolledKeys)
	}
	if s, st := series(), stateSize(e); s != baseSeries+float64(rolledLines) || st != baseState+rolledKeys {
		t.Errorf("after 10,000 cgroups came and went: %v series and %d state entries, want the baseline's %v and %d and the rollup's %d and %d",
			s, st, baseSeries, baseState, rolledLines, rolledKeys)
	}
}
