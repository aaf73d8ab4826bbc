package stress

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodectl/nodectl/rundir"
)

func TestReadDirtyInBytes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vmstat")
	vmstat := "nr_free_pages 100\nnr_dirty 25\nnr_writeback 3\nnr_dirty_threshold 1000\nnr_dirty_background_threshold 500\npgpgout 7\n"
	if err := os.WriteFile(path, []byte(vmstat), 0o644); err != nil {
		t.Fatal(err)
	}
	recs, err := readDirty(path, 4096)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, r := range recs {
		if r.Cgroup != "" || r.Type != rundir.TypeSample {
			t.Errorf("record %+v: want a node-wide sample", r)
		}
		got[r.Metric] = *r.Value
	}
	want := map[string]float64{rundir.MetricDirty: 25 * 4096, rundir.MetricWriteback: 3 * 4096,
		rundir.MetricDirtyThreshold: 1000 * 4096, rundir.MetricDirtyBackThreshold: 500 * 4096}
	if len(got) != len(want) {
		t.Errorf("got %v, want %v", got, want)
	}
	for m, v := range want {
		if got[m] != v {
			t.Errorf("%s = %v, want %v", m, got[m], v)
		}
	}

	if err := os.WriteFile(path, []byte("pgpgout 7\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readDirty(path, 4096); err == nil || !strings.Contains(err.Error(), "has none of nr_dirty") {
		t.Errorf("a vmstat without dirty lines: err %v", err)
	}
}

func TestStormPlan(t *testing.T) {
	r := &stormRun{runHost: runHost{id: "fsync-storm-20260101-120000-a1b2c3"}, cfg: StormConfig{Writers: 3, Bytes: 64 << 20},
		target: "/scratch/fsync-storm-20260101-120000-a1b2c3", device: "254:0"}
	r.plan()
	if len(r.workloads) != 3 {
		t.Fatalf("%d writers, want 3", len(r.workloads))
	}
	for i, w := range r.workloads {
		name := "fsync-writer-" + string(rune('0'+i))
		if w.Name != name || w.Kind != rundir.KindStormWriter || w.Cgroup != RunCgroup(r.id)+"/"+name ||
			w.Target != r.target+"/"+name || w.Device != "254:0" || w.Memory != "192Mi" {
			t.Errorf("writer %d: %+v", i, w)
		}
	}
}
