package exporter

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/nodectl/nodectl/host/kubeid"
	"github.com/nodectl/nodectl/internal/metricserver"
	"github.com/nodectl/nodectl/rundir"
)

// nodeOf returns a batch of a node of n container cgroups at tick, as the session makes it
// each interval: every sampler reading, and the tracer's series that changed.
func nodeOf(n, tick int) []rundir.Record {
	f := float64(tick)
	var batch []rundir.Record
	for i := range n {
		cg := container(i)
		batch = append(batch,
			rec(rundir.MetricCPUUsage, cg, f),
			rec(rundir.MetricCPUPeriods, cg, 10*f),
			rec(rundir.MetricCPUThrottled, cg, f),
			rec(rundir.MetricCPUThrottledTime, cg, f/10),
			rec(rundir.MetricMemoryUsage, cg, 1e6),
			rec(rundir.MetricMemorySwap, cg, 0),
			rec(rundir.MetricMemoryMajorFaults, cg, f),
			rec(rundir.MetricMemoryRefaults, cg, f, rundir.LabelKind, rundir.RefaultAnon),
			rec(rundir.MetricMemoryRefaults, cg, f, rundir.LabelKind, rundir.RefaultFile),
			rec(rundir.MetricMemoryOOMKills, cg, 0),
			histRec(rundir.MetricRunqLatency, cg, log2(uint64(tick), baseRunq)),
			rec(rundir.MetricRunqPreemptWait, cg, f/100, rundir.LabelPreemptor, container((i+1)%n)),
			rec(rundir.MetricRunqPreemptWait, cg, f/1000, rundir.LabelPreemptor, rundir.CgroupKernel),
		)
		for _, res := range []string{rundir.ResourceCPU, rundir.ResourceMemory, rundir.ResourceIO} {
			for _, kind := range []string{rundir.PressureSome, rundir.PressureFull} {
				batch = append(batch, rec(rundir.MetricCgroupPressure, cg, f/1e3, rundir.LabelResource, res, rundir.LabelKind, kind))
			}
		}
	}
	return batch
}

func timeObserve(e *Exporter, batch []rundir.Record) time.Duration {
	start := time.Now()
	e.Observe(batch)
	return time.Since(start)
}

// Observe must not wait for a scrape stuck after its copy of the state: in the agent's Self
// callback, or sending to a registry that does not read.
func TestObserveNotBlockedBySlowScrape(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	held := false
	e := New(Config{Self: func() Self {
		if held {
			entered <- struct{}{}
			<-release
		}
		return Self{}
	}})
	const cgroups = 1000
	e.Observe(nodeOf(cgroups, 1))
	// What Observe costs unhindered; the bound below is relative to it.
	var alone time.Duration
	for tick := 2; tick < 7; tick++ {
		alone = max(alone, timeObserve(e, nodeOf(cgroups, tick)))
	}
	batch := nodeOf(cgroups, 7)

	observeDuring := func(what string, stuck func() (unstick func())) {
		t.Helper()
		unstick := stuck()
		done := make(chan time.Duration, 1)
		go func() { done <- timeObserve(e, batch) }()
		select {
		case took := <-done:
			if took > 20*alone {
				t.Errorf("Observe took %v during a scrape %s, %v alone", took, what, alone)
			}
			unstick()
		case <-time.After(100 * alone):
			t.Errorf("Observe still waiting after %v (%v alone) for a scrape %s", 100*alone, alone, what)
			unstick()
			<-done
		}
	}

	observeDuring("stuck in the Self callback", func() func() {
		held = true
		scraped := make(chan struct{})
		go func() {
			ch := make(chan prometheus.Metric, 16)
			go func() {
				for range ch {
				}
			}()
			e.Collect(ch)
			close(ch)
			close(scraped)
		}()
		<-entered
		return func() { close(release); <-scraped; held = false }
	})

	observeDuring("whose reader stopped", func() func() {
		ch := make(chan prometheus.Metric)
		scraped := make(chan struct{})
		go func() { e.Collect(ch); close(scraped) }()
		<-ch // the scrape has its copy and waits to send the next
		return func() {
			for {
				select {
				case <-ch:
				case <-scraped:
					return
				}
			}
		}
	})
}

// self is an agent's figures with every field set.
func self() Self {
	return Self{
		TrackedCgroups: 900, OverflowCgroups: 12,
		BPFMaps:    map[string]float64{"runq": 0.08, "fsync": 0.001},
		Lost:       Lost{KernelMapFull: 1, RingBuffer: 2, UserQueue: 3, Store: 4, Watch: 5},
		StoreBytes: 1 << 30, StoreOldest: time.Now().Add(-time.Hour), StoreWritable: true, WriteFailures: 7,
		Incidents: map[string]Incidents{rundir.EventOOMKill: {Total: 3, Open: 1}, "runq_stall": {Total: 5}},
		Pods: []PodInfo{{Workload: "shop/web-0/app", Kind: kubeid.KindContainer, Namespace: "shop", Pod: "web-0", Container: "app", QoS: "burstable"},
			{Workload: "sbx/agent-7", Kind: kubeid.KindPod, Namespace: "sbx", Pod: "agent-7", QoS: "besteffort", RuntimeClass: "gvisor", Sandbox: true}},
		UnknownPods: 2,
		Lease:       &Lease{Renewals: 30, LastGap: 10 * time.Second, LastSeen: time.Now().Add(-3 * time.Second)},
	}
}

func TestSelf(t *testing.T) {
	got := scrape(t, New(Config{Self: self}))
	wantValues(t, got, map[string]float64{
		key("nodectl_agent_cgroups", labelState, stateTracked):                  900,
		key("nodectl_agent_cgroups", labelState, stateOverflow):                 12,
		key("nodectl_agent_bpf_map_fill_ratio", labelMap, "runq"):               0.08,
		key("nodectl_agent_lost_events_total", labelStage, "kernel_map_full"):   1,
		key("nodectl_agent_lost_events_total", labelStage, "ring_buffer"):       2,
		key("nodectl_agent_lost_events_total", labelStage, "user_queue"):        3,
		key("nodectl_agent_lost_events_total", labelStage, "store"):             4,
		key("nodectl_agent_lost_events_total", labelStage, "watch"):             5,
		key("nodectl_agent_store_bytes"):                                        1 << 30,
		key("nodectl_agent_store_writable"):                                     1,
		key("nodectl_agent_store_write_failures_total"):                         7,
		key("nodectl_agent_incidents_total", labelTrigger, rundir.EventOOMKill): 3,
		key("nodectl_agent_open_incidents", labelTrigger, rundir.EventOOMKill):  1,
		key("nodectl_agent_incidents_total", labelTrigger, "runq_stall"):        5,
	})
	if age := got[key("nodectl_agent_store_oldest_sample_age_seconds")]; age < 3600 || age > 3600+60 {
		t.Errorf("store oldest sample age %v, want an hour", age)
	}
	// An empty store has no oldest sample; a store that refuses writes reads 0.
	got = scrape(t, New(Config{Self: func() Self { return Self{} }}))
	if _, ok := got[key("nodectl_agent_store_oldest_sample_age_seconds")]; ok {
		t.Error("an empty store has an oldest sample age")
	}
	wantValues(t, got, map[string]float64{key("nodectl_agent_store_writable"): 0})
}

// A cgroup name that is not UTF-8 cannot be a label value: that series fails, the rest serve.
func TestBadLabelValue(t *testing.T) {
	e := New(Config{})
	e.Observe([]rundir.Record{rec(rundir.MetricCPUUsage, "/system.slice/bad\xff.service", 1), rec(rundir.MetricCPUUsage, cgKubelet, 2)})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(e)
	mfs, err := reg.Gather()
	if err == nil {
		t.Error("no error for a label value that is not UTF-8")
	}
	for _, mf := range mfs {
		if mf.GetName() == "nodectl_cpu_usage_seconds_total" && len(mf.Metric) != 1 {
			t.Errorf("%d cpu usage series, want the kubelet's", len(mf.Metric))
		}
	}
}

func TestLint(t *testing.T) {
	// A pod's info series goes with its workload's series: cgPod is self's sandbox pod.
	e := New(Config{Self: self, Classify: func(cg string) (string, string, bool) {
		if cg == cgPod {
			return "sbx/agent-7", kubeid.KindPod, true
		}
		w, k := kubeid.Classify(cg)
		return w, k, true
	}})
	var nd node
	e.Observe(nd.batch(1))
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(e)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
	// Every metric is in the scrape, so that the lint saw them all.
	var scraped []string
	for _, mf := range mfs {
		scraped = append(scraped, mf.GetName())
	}
	for _, n := range names {
		if !slices.Contains(scraped, n) {
			t.Errorf("%s not in the scrape", n)
		}
	}
}

// Scraped over HTTP from the agent's server: the exposition holds what the exporter counts,
// and every histogram series has at most 12 buckets, +Inf the last.
func TestServedByMetricServer(t *testing.T) {
	e := New(Config{Self: self})
	var nd node
	e.Observe(nd.batch(1))
	e.Observe(nodeOf(50, 1))
	reg := prometheus.NewRegistry()
	reg.MustRegister(e)
	s, err := metricserver.Listen("127.0.0.1:0", reg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	resp, err := http.Get(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %v %v", s.URL(), resp.Status, err)
	}
	lines, series := 0, -1.0
	buckets := map[string][]string{} // histogram series -> its le values, in order
	for line := range strings.Lines(string(body)) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		lines++
		name, rest, _ := strings.Cut(line, " ")
		if strings.HasPrefix(name, "nodectl_exporter_series") {
			series, _ = strconv.ParseFloat(rest, 64)
		}
		if base, labels, ok := strings.Cut(name, "_bucket{"); ok {
			le := leLabel.FindStringSubmatch(labels)
			id := base + "{" + leLabel.ReplaceAllString(labels, "")
			buckets[id] = append(buckets[id], le[1])
		}
	}
	if series != float64(lines) {
		t.Errorf("nodectl_exporter_series says %v, the exposition has %d series", series, lines)
	}
	if len(buckets) == 0 {
		t.Fatal("no histogram served")
	}
	for id, les := range buckets {
		if len(les) > 12 || les[len(les)-1] != "+Inf" {
			t.Errorf("%s: buckets %v, want at most 12 ending in +Inf", id, les)
		}
	}
}

var leLabel = regexp.MustCompile(`,?le="([^"]*)"`)

// docs/metrics.md lists every metric the exporter makes, and no other.
func TestDocListsEveryMetric(t *testing.T) {
	doc, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(nodectl_[a-z_]+)`").FindAllStringSubmatch(string(doc), -1) {
		listed[m[1]] = true
	}
	for _, n := range names {
		if !listed[n] {
			t.Errorf("%s is not in docs/metrics.md", n)
		}
		delete(listed, n)
	}
	for n := range listed {
		t.Errorf("docs/metrics.md lists %s, which the exporter does not make", n)
	}
}

// The Grafana dashboards (deploy/grafana) query only what the exporter makes: every metric
// name, with a histogram's _bucket, _sum and _count, and every label a selector or a
// grouping names is one of the metric's (or Prometheus' own: instance, job, le).
func TestGrafanaDashboardsQueryExportedMetrics(t *testing.T) {
	files, err := filepath.Glob("../../deploy/grafana/*.json")
	if err != nil || len(files) < 3 {
		t.Fatalf("dashboards %v (%v): want node overview, pod neighbours, heartbeats and incidents", files, err)
	}
	isHistogram := func(name string) bool {
		for _, s := range specs {
			if s.typ == histogram && strings.Contains(s.desc.String(), `fqName: "`+name+`"`) {
				return true
			}
		}
		return false
	}
	metric := regexp.MustCompile(`\b(nodectl_[a-z_]+)(\{[^}]*\})?`)
	matcher := regexp.MustCompile(`([a-z_]+)\s*(=~|!~|!=|=)`)
	grouping := regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var dash struct {
			Title  string `json:"title"`
			Panels []struct {
				Title   string `json:"title"`
				Targets []struct {
					Expr string `json:"expr"`
				} `json:"targets"`
			} `json:"panels"`
			Templating struct {
				List []struct {
					Query any `json:"query"`
				} `json:"list"`
			} `json:"templating"`
		}
		if err := json.Unmarshal(b, &dash); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		var exprs []string
		for _, p := range dash.Panels {
			if len(p.Targets) == 0 {
				t.Errorf("%s: panel %q has no query", file, p.Title)
			}
			for _, tg := range p.Targets {
				exprs = append(exprs, tg.Expr)
			}
		}
		for _, v := range dash.Templating.List {
			switch q := v.Query.(type) {
			case string:
				exprs = append(exprs, q)
			case map[string]any:
				if s, ok := q["query"].(string); ok {
					exprs = append(exprs, s)
				}
			}
		}
		for _, expr := range exprs {
			known := map[string]bool{"instance": true, "job": true}
			for _, m := range metric.FindAllStringSubmatch(expr, -1) {
				name := m[1]
				if _, ok := metricLabels[name]; !ok {
					base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
					if base == name || !isHistogram(base) {
						t.Errorf("%s: %q queries %s, which the exporter does not make", file, expr, name)
						continue
					}
					if strings.HasSuffix(name, "_bucket") {
						known["le"] = true
					}
					name = base
				}
				for _, l := range metricLabels[name] {
					known[l] = true
				}
				for _, lm := range matcher.FindAllStringSubmatch(m[2], -1) {
					if !slices.Contains(metricLabels[name], lm[1]) && lm[1] != "instance" && lm[1] != "job" {
						t.Errorf("%s: %q selects %s on label %s, which it does not have (it has %v)", file, expr, name, lm[1], metricLabels[name])
					}
				}
			}
			for _, g := range grouping.FindAllStringSubmatch(expr, -1) {
				for _, l := range strings.Split(g[1], ",") {
					if l = strings.TrimSpace(l); l != "" && !known[l] {
						t.Errorf("%s: %q groups by %s, which none of its metrics has", file, expr, l)
					}
				}
			}
		}
	}
}
