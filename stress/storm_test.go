package stress

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodectl/nodectl/record/sample"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/stress/workload"
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
	ws := planStorm(StormConfig{Writers: 3, Bytes: 64 << 20})
	if len(ws) != 3 {
		t.Fatalf("%d writers, want 3", len(ws))
	}
	for i, w := range ws {
		name := "fsync-writer-" + string(rune('0'+i))
		if w.Name != name || w.Kind != rundir.KindStormWriter || w.Memory != "192Mi" || w.Limits.MemoryBytes != 192<<20 {
			t.Errorf("writer %d: %+v", i, w)
		}
	}
}

// logStormer is a logPlacement whose writers answer at once: each ready when armed and after
// each storm, durable after each go (the first ready sent twice, as a pod's log and its
// attached output both give it); its writer named in fail never becomes durable.
type logStormer struct {
	logPlacement
	fail   string
	ws     []Planned
	events chan<- StormEvent
	storm  int
}

func (p *logStormer) Arm(_ context.Context, ws []Planned, events chan<- StormEvent) error {
	p.ws, p.events = ws, events
	for i, w := range ws {
		c, _ := w.Config.(*workload.FsyncWriterConfig)
		p.steps = append(p.steps, fmt.Sprintf("arm %s %s %d", w.Name, c.Dir, c.Bytes))
		at := time.Unix(100, 0)
		events <- StormEvent{Writer: i, Measurement: workload.Measurement{T: at, Metric: workload.MetricStormReady, Value: 1}}
		events <- StormEvent{Writer: i, Measurement: workload.Measurement{T: at, Metric: workload.MetricStormReady, Value: 1}}
	}
	return nil
}

func (p *logStormer) Release(context.Context) error {
	p.storm++
	p.steps = append(p.steps, "release")
	at := time.Unix(100+int64(p.storm), 0)
	for i, w := range p.ws {
		if w.Name == p.fail {
			continue
		}
		p.events <- StormEvent{Writer: i, Measurement: workload.Measurement{T: at, Metric: rundir.MetricStormDurable, Value: float64(i + 1)}}
		p.events <- StormEvent{Writer: i, Measurement: workload.Measurement{T: at, Metric: workload.MetricStormReady, Value: 1}}
	}
	return nil
}

func (p *logStormer) Check(context.Context) error { return nil }

func (p *logStormer) Settle(context.Context) error {
	p.steps = append(p.steps, "settle")
	return nil
}

// A storm is one sequence on any placement: the writers armed with their bodies writing where
// they were placed, and each storm's phase from just before the go to once every writer is
// durable; a writer that never is fails the run on --timeout.
func TestStormOnAPlacement(t *testing.T) {
	cfg := StormConfig{Writers: 2, Bytes: 1 << 20, Rounds: 2, Pause: time.Millisecond}
	p := &logStormer{}
	if err := StormOn(context.Background(), cfg, p, NewLiveLine(nil, false)); err != nil {
		t.Fatal(err)
	}
	want := []string{"place fsync-writer-0,fsync-writer-1", "arm fsync-writer-0 /work/fsync-writer-0 1048576", "arm fsync-writer-1 /work/fsync-writer-1 1048576"}
	for _, r := range []string{"round-1", "round-2"} {
		want = append(want, "mark "+r+" start", "release", "settle", "mark "+r+" end")
	}
	want = append(want, "finish")
	if !slices.Equal(p.steps, want) {
		t.Errorf("steps:\n got %q\nwant %q", p.steps, want)
	}

	p = &logStormer{fail: "fsync-writer-1"}
	cfg.Timeout = 300 * time.Millisecond
	if err := StormOn(context.Background(), cfg, p, NewLiveLine(nil, false)); !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "1 of 2 writers") {
		t.Fatalf("StormOn = %v, want a timeout naming 1 of 2 writers", err)
	}
	if last := p.steps[len(p.steps)-1]; last != "release" {
		t.Errorf("steps after a writer that never finished: %q", p.steps)
	}
}
