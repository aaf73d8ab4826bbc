package stress

import (
	"maps"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodectl/nodectl/record/sample"
	"github.com/nodectl/nodectl/rundir"
)

// The storm records the node's dirty memory, read from vmstat, in bytes.
func TestDirtyRecordsInBytes(t *testing.T) {
	procfs := t.TempDir()
	vmstat := "nr_free_pages 100\nnr_dirty 25\nnr_writeback 3\nnr_dirty_threshold 1000\nnr_dirty_background_threshold 500\npgpgout 7\n"
	if err := os.WriteFile(filepath.Join(procfs, "vmstat"), []byte(vmstat), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := sample.ReadDirty(procfs)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, r := range dirtyRecords(time.Now(), d) {
		if r.Cgroup != "" || r.Type != rundir.TypeSample {
			t.Errorf("record %+v: want a node-wide sample", r)
		}
		got[r.Metric] = *r.Value
	}
	page := float64(os.Getpagesize())
	want := map[string]float64{rundir.MetricDirty: 25 * page, rundir.MetricWriteback: 3 * page,
		rundir.MetricDirtyThreshold: 1000 * page, rundir.MetricDirtyBackThreshold: 500 * page}
	if !maps.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
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
