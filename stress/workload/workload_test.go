package workload

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"testing"
	"time"

	"github.com/nodectl/nodectl/rundir"
)

func TestVictimEmitsItsMeasurements(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	err := Victim(ctx, VictimConfig{Dir: dir, Interval: 500 * time.Millisecond, WorkRounds: 1000, WriteBytes: 2 << 20}, NewEmitter(&out))
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		var m Measurement
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("bad line %q: %v", sc.Text(), err)
		}
		if m.Value < 0 || m.T.IsZero() {
			t.Errorf("bad measurement %+v", m)
		}
		counts[m.Metric]++
	}
	for _, m := range []string{rundir.MetricProbeCPUWork, rundir.MetricProbeWrite, rundir.MetricProbeFsync} {
		if counts[m] < 2 {
			t.Errorf("%s: %d measurements, want at least 2 (one per 500ms iteration)", m, counts[m])
		}
	}
}

func BenchmarkCPUWork(b *testing.B) {
	for b.Loop() {
		cpuWork(DefaultWorkRounds)
	}
}

func TestChurnStartsProcessesContinuously(t *testing.T) {
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
	defer cancel()
	if err := Churn(ctx, []string{"true"}, 2, NewEmitter(&out)); err != nil {
		t.Fatal(err)
	}
	var total float64
	var seconds int
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		var m Measurement
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil || m.Metric != rundir.MetricChurnStarts {
			t.Fatalf("bad line %q", sc.Text())
		}
		total += m.Value
		seconds++
	}
	if seconds < 2 || total < float64(seconds) {
		t.Errorf("churn started %.0f processes in %d reported seconds, want at least one a second", total, seconds)
	}
}

func TestChurnFailsOnABadCommand(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := Churn(ctx, []string{"/nonexistent/cmd"}, 1, NewEmitter(io.Discard)); err == nil {
		t.Fatal("churn of a missing command did not fail")
	}
}
