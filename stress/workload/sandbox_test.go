package workload

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodectl/nodectl/rundir"
)

// The sandbox is ready once its heap and binary are in memory, then its event loop records
// tick lateness and bursts.
func TestSandboxReadyThenTicksAndBursts(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "binary")
	if err := os.WriteFile(bin, bytes.Repeat([]byte{0x90}, 64<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	var out bytes.Buffer
	cfg := SandboxConfig{HeapBytes: 4 << 20, HotShare: 0.25, Binary: bin, BinaryShare: 0.5, Activity: 60 * time.Millisecond, BurstRounds: 1000, Tick: 50 * time.Millisecond}
	if err := Sandbox(ctx, cfg, NewEmitter(&out)); err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	var first string
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var m Measurement
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		if first == "" {
			first = m.Metric
		}
		if m.Value < 0 {
			t.Errorf("%s = %v, want a duration", m.Metric, m.Value)
		}
		count[m.Metric]++
	}
	if first != rundir.MetricSandboxReady || count[rundir.MetricSandboxReady] != 1 {
		t.Errorf("first line %s, %d ready lines; want one ready line first", first, count[rundir.MetricSandboxReady])
	}
	if count[rundir.MetricSandboxTickLateness] < 3 || count[rundir.MetricSandboxActivity] < 3 {
		t.Errorf("in 0.5 s at 50 ms ticks and 60 ms bursts: %v", count)
	}
}

func TestSandboxRefusesBadConfig(t *testing.T) {
	for name, cfg := range map[string]SandboxConfig{
		"no_heap":     {Activity: time.Second, Tick: time.Second, HotShare: 0.5},
		"hot_share_0": {HeapBytes: 1 << 20, Activity: time.Second, Tick: time.Second},
		"no_binary":   {HeapBytes: 1 << 20, Activity: time.Second, Tick: time.Second, HotShare: 0.5, Binary: "/nonexistent/binary"},
	} {
		t.Run(name, func(t *testing.T) {
			if err := Sandbox(context.Background(), cfg, NewEmitter(&bytes.Buffer{})); err == nil {
				t.Error("no error")
			}
		})
	}
}
