package workload

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/nodectl/nodectl/rundir"
)

// Each go is one storm: ready, then the three times, and no file left between storms or after.
func TestFsyncWriterOneMeasurePerGo(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	in := strings.NewReader(StormGo + StormGo)
	if err := FsyncWriter(context.Background(), FsyncWriterConfig{Dir: dir, Bytes: 3<<20 + 5}, in, NewEmitter(&out)); err != nil {
		t.Fatal(err)
	}
	var metrics []string
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		var m Measurement
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("bad line %q: %v", sc.Text(), err)
		}
		metrics = append(metrics, m.Metric)
		if m.Metric == rundir.MetricStormDurable && m.Value <= 0 {
			t.Errorf("durable time %v", m.Value)
		}
	}
	storm := []string{rundir.MetricStormWrite, rundir.MetricStormFsync, rundir.MetricStormDurable}
	want := append(append(append(append([]string{MetricStormReady}, storm...), MetricStormReady), storm...), MetricStormReady)
	if strings.Join(metrics, " ") != strings.Join(want, " ") {
		t.Errorf("emitted %v, want %v", metrics, want)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("left %v in %s", ents, dir)
	}
}

func TestFsyncWriterStopsWhileWaiting(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	defer r.Close()
	dir := t.TempDir()
	done := make(chan error, 1)
	go func() {
		done <- FsyncWriter(ctx, FsyncWriterConfig{Dir: dir, Bytes: 1 << 20}, r, NewEmitter(&bytes.Buffer{}))
	}()
	cancel()
	if err := <-done; err != nil {
		t.Errorf("stopped writer returned %v", err)
	}
}
