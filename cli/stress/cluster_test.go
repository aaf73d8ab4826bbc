package stress

import (
	"slices"
	"testing"
	"time"

	"github.com/nodectl/nodectl/rundir"
)

// The writers' device is the one their cgroups wrote the most to, not the busiest overall.
func TestWritersDevice(t *testing.T) {
	at := func(s float64) time.Time { return time.Unix(1000, 0).Add(time.Duration(s * float64(time.Second))) }
	rec := func(s float64, cg, dev string, v float64) rundir.Record {
		return rundir.Record{Type: rundir.TypeSample, Time: at(s), Metric: rundir.MetricBlkBytes, Cgroup: cg,
			Labels: map[string]string{rundir.LabelDevice: dev, rundir.LabelOp: "write"}, Value: &v}
	}
	run := &rundir.Run{Records: []rundir.Record{
		rec(0, "/w1", "8:0", 0), rec(5, "/w1", "8:0", 100<<20),
		rec(0, "/w2", "8:16", 0), rec(5, "/w2", "8:16", 10<<20),
		rec(0, "/other", "8:16", 0), rec(5, "/other", "8:16", 900<<20),
	}}
	if got := writersDevice(run, []string{"/w1", "/w2"}); got != "8:0" {
		t.Errorf("writersDevice = %q, want 8:0", got)
	}
}

func TestLineWriterSplitsLines(t *testing.T) {
	var got []string
	w := &lineWriter{fn: func(b []byte) { got = append(got, string(b)) }}
	for _, part := range []string{"a", "b\nc", "\n\nd"} {
		if n, err := w.Write([]byte(part)); err != nil || n != len(part) {
			t.Fatalf("Write(%q) = %d, %v", part, n, err)
		}
	}
	if !slices.Equal(got, []string{"ab", "c", ""}) || string(w.buf) != "d" {
		t.Errorf("lines %q, left %q", got, w.buf)
	}
}
