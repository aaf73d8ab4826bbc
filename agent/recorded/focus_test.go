package recorded

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/nodectl/nodectl/agent/flightrec"
	"github.com/nodectl/nodectl/rundir"
)

// node is a recorder of many cgroups, each with a counter that grows by its rate a second from
// the window's start on, and the incident cgroup's preempted wait by one neighbour.
type node struct {
	rates map[string]map[string]float64 // metric -> cgroup -> rise a second in the window
	from  time.Time                     // the window's start
}

func (n *node) Read(from, to time.Time, _ time.Duration, fn func(rundir.Record) error) error {
	for t := from; !t.After(to); t = t.Add(time.Second) {
		in := max(0, t.Sub(n.from).Seconds())
		for metric, byCg := range n.rates {
			for cg, rate := range byCg {
				r := sampleOf(metric, cg, 100+rate*in)
				switch metric {
				case rundir.MetricRunqPreemptWait:
					r = sampleOf(metric, "/victim", 100+rate*in, rundir.LabelPreemptor, cg)
				case rundir.MetricBlkBytes: // on two devices: the cgroup ranks by their sum
					r = sampleOf(metric, cg, 100+rate*in, rundir.LabelDevice, "8:0", rundir.LabelOp, "write")
					r.Time = t
					if err := fn(r); err != nil {
						return err
					}
					r = sampleOf(metric, cg, 100+rate*in, rundir.LabelDevice, "8:16", rundir.LabelOp, "write")
				}
				r.Time = t
				if err := fn(r); err != nil {
					return err
				}
			}
		}
		v := 1.0
		if err := fn(rundir.Record{Type: rundir.TypeSample, Time: t, Metric: rundir.MetricVmstat, Value: &v}); err != nil {
			return err
		}
	}
	return nil
}

func newNode(cgroups int) *node {
	n := &node{from: tick(120), rates: map[string]map[string]float64{
		rundir.MetricCPUUsage: {}, rundir.MetricMemoryUsage: {}, rundir.MetricRunqPreemptWait: {"/neighbour": 0.5},
	}}
	for i := range cgroups {
		n.rates[rundir.MetricCPUUsage][fmt.Sprintf("/idle%d", i)] = 0
	}
	for i := range 20 {
		n.rates[rundir.MetricCPUUsage][fmt.Sprintf("/busy%02d", i)] = float64(i + 1)
	}
	n.rates[rundir.MetricMemoryUsage]["/grower"] = 1 << 20
	// Twenty cgroups write a little; the disk hog most. Time in fsync is sampled as a value here.
	n.rates[rundir.MetricBlkBytes] = map[string]float64{"/diskhog": 64 << 20}
	for i := range 20 {
		n.rates[rundir.MetricBlkBytes][fmt.Sprintf("/writer%02d", i)] = float64((i + 1) << 20)
	}
	n.rates[rundir.MetricFsyncLatency] = map[string]float64{"/fsyncer": 1e9}
	n.rates[rundir.MetricCPUUsage]["/victim"] = 0.1
	n.rates[rundir.MetricCPUUsage]["/kubelet"] = 0
	return n
}

// On a node of many cgroups an incident's analysis keeps the incident's cgroup, the daemons,
// its preemptors and the first risers of each ranking, and reads only those cgroups' samples
// (the node's always); on a small node, every cgroup.
func TestIncidentFocus(t *testing.T) {
	meta := rundir.Meta{Interval: rundir.Duration(time.Second),
		Workloads: []rundir.Workload{{Name: "kubelet", Kind: rundir.KindDaemon, Cgroup: "/kubelet"}}}
	w := Window{BaselineFrom: tick(0), From: tick(120), To: tick(240), Cgroup: "/victim"}
	src := newNode(100)
	w, err := w.Bounded(src, meta, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"/victim": true, "/kubelet": true, "/neighbour": true, "/grower": true, "/diskhog": true, "/fsyncer": true}
	for i := 20 - focusEach; i < 20; i++ { // the 16 busiest of 20
		want[fmt.Sprintf("/busy%02d", i)] = true
	}
	for i := 20 - focusIOEach + 1; i < 20; i++ { // the disk hog and the 7 writers of most bytes
		want[fmt.Sprintf("/writer%02d", i)] = true
	}
	if len(w.Cgroups) != len(want) {
		t.Errorf("focus %v, want %v", w.Cgroups, want)
	}
	for cg := range want {
		if !w.Cgroups[cg] {
			t.Errorf("%s not in focus %v", cg, w.Cgroups)
		}
	}
	run, err := w.Run(src, meta)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range run.Records {
		if r.Type == rundir.TypeSample {
			seen[r.Cgroup] = true
		}
	}
	if seen["/idle0"] || seen["/busy00"] || !seen["/busy19"] || !seen[""] {
		t.Errorf("read the samples of %v", seen)
	}

	small := Window{BaselineFrom: tick(0), From: tick(120), To: tick(240), Cgroup: "/victim"}
	if small, err = small.Bounded(newNode(10), meta, 0); err != nil || small.Cgroups != nil {
		t.Errorf("a node of 33 cgroups: focus %v, %v; want every cgroup (nil)", small.Cgroups, err)
	}
}

// sampleOf is a sample of metric in cg with labels kv (name, value, ...).
func sampleOf(metric, cg string, v float64, kv ...string) rundir.Record {
	l := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		l[kv[i]] = kv[i+1]
	}
	return rundir.Record{Type: rundir.TypeSample, Metric: metric, Cgroup: cg, Value: &v, Labels: l}
}

var t0 = time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)

func tick(n int) time.Time { return t0.Add(time.Duration(n) * time.Second) }

// `analyze --data-dir` reads a window as the agent does (Bounded): on a node of many cgroups
// the same focus, so the same report, and the directory's series count from its segments.
func TestDataDirReadsAsTheAgent(t *testing.T) {
	dir := t.TempDir()
	meta := rundir.Meta{Interval: rundir.Duration(time.Second),
		Workloads: []rundir.Workload{{Name: "kubelet", Kind: rundir.KindDaemon, Cgroup: "/kubelet"}}}
	w := Window{BaselineFrom: tick(0), From: tick(120), To: tick(240)}
	store, err := flightrec.Open(flightrec.Options{Dir: dir, SegmentSpan: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	var batch []rundir.Record
	var at time.Time
	err = newNode(100).Read(w.BaselineFrom, w.To, 0, func(r rundir.Record) error {
		if !r.Time.Equal(at) && len(batch) > 0 {
			if err := store.Append(at, batch); err != nil {
				return err
			}
			batch = batch[:0]
		}
		at = r.Time
		batch = append(batch, r)
		return nil
	})
	if err == nil {
		err = store.Append(at, batch)
	}
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(meta)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, MetaFile), b, 0o600); err != nil {
		t.Fatal(err)
	}

	inAgent, err := w.Bounded(store, meta, store.Status().Series)
	if err != nil {
		t.Fatal(err)
	}
	if inAgent.Cgroups == nil || inAgent.Ticks <= 0 {
		t.Fatalf("the agent's read of a node of 122 cgroups has ticks %d and focus %v", inAgent.Ticks, inAgent.Cgroups)
	}
	want, err := AnalyzeWindow(store, meta, inAgent)
	if err != nil {
		t.Fatal(err)
	}
	rd, err := flightrec.OpenReader(dir)
	if err != nil {
		t.Fatal(err)
	}
	if sp, err := rd.Span(); err != nil || sp.Series != store.Status().Series {
		t.Errorf("the directory's span says %d series (%v), the store follows %d", sp.Series, err, store.Status().Series)
	}
	rec, err := OpenDataDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := rec.Analyze(context.Background(), w)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("analyze --data-dir:\n%+v\nthe agent:\n%+v", got, want)
	}
}
