package collect

import (
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

func counter(metric, cg string, v float64) rundir.Record {
	return rundir.Record{Type: rundir.TypeSample, Time: time.Unix(0, 0), Metric: metric, Cgroup: cg, Value: &v}
}

func histogram(metric, cg string, count, sum uint64) rundir.Record {
	return rundir.Record{Type: rundir.TypeSample, Time: time.Unix(0, 0), Metric: metric, Cgroup: cg,
		Hist: &hist.Log2{Count: count, SumNs: sum}}
}

func TestChangesPassesOnChangedSeriesOnly(t *testing.T) {
	var c Changes
	first := []rundir.Record{
		counter(rundir.MetricBlkBytes, "/a", 4096),
		counter(rundir.MetricBlkBytes, "/b", 0),
		histogram(rundir.MetricRunqLatency, "/a", 2, 4000),
	}
	if got := c.Filter(first); len(got) != len(first) {
		t.Fatalf("first batch passed on %d of %d samples", len(got), len(first))
	}
	if got := c.Filter(first); len(got) != 0 {
		t.Errorf("an unchanged batch passed on %+v", got)
	}
	second := []rundir.Record{
		counter(rundir.MetricBlkBytes, "/a", 8192),         // changed
		counter(rundir.MetricBlkBytes, "/b", 0),            // same
		histogram(rundir.MetricRunqLatency, "/a", 3, 5000), // changed
	}
	got := c.Filter(second)
	if len(got) != 2 || got[0].Cgroup != "/a" || *got[0].Value != 8192 || got[1].Hist.Count != 3 {
		t.Errorf("changed batch passed on %+v, want /a's bytes and histogram", got)
	}
	// A series that left (its cgroup removed) and came back is passed on again.
	c.Filter(second[:1])
	if got := c.Filter(second); len(got) != 2 {
		t.Errorf("returning series: passed on %d samples, want /b's and the histogram", len(got))
	}
}

func TestChangesTellsSeriesApartByLabels(t *testing.T) {
	var c Changes
	r := counter(rundir.MetricBlkBytes, "/a", 1)
	r.Labels = map[string]string{rundir.LabelOp: rundir.OpRead}
	w := counter(rundir.MetricBlkBytes, "/a", 1)
	w.Labels = map[string]string{rundir.LabelOp: rundir.OpWrite}
	if got := c.Filter([]rundir.Record{r, w}); len(got) != 2 {
		t.Errorf("two label sets of one metric passed on as %d series", len(got))
	}
}

// A series is the same whatever order its labels were set in, with few labels or many.
func TestChangesKeysLabelsInAnyOrder(t *testing.T) {
	for _, keys := range [][]string{{"a", "b", "c"}, {"a", "b", "c", "d", "e"}} {
		var c Changes
		first, second := counter(rundir.MetricBlkBytes, "/a", 1), counter(rundir.MetricBlkBytes, "/a", 1)
		first.Labels, second.Labels = map[string]string{}, map[string]string{}
		for i, k := range keys {
			first.Labels[k] = k
			second.Labels[keys[len(keys)-1-i]] = keys[len(keys)-1-i]
		}
		c.Filter([]rundir.Record{first})
		if got := c.Filter([]rundir.Record{second}); len(got) != 0 {
			t.Errorf("%d labels: the same series with its labels set in another order passed on again", len(keys))
		}
		other := counter(rundir.MetricBlkBytes, "/a", 1)
		other.Labels = map[string]string{"a": "a"}
		if got := c.Filter([]rundir.Record{other}); len(got) != 1 {
			t.Errorf("%d labels: a series with fewer labels taken for the same", len(keys))
		}
	}
}

// After a churn the maps are made again at the size of what is left, and still tell what
// changed.
func TestChangesShrinkAfterAChurn(t *testing.T) {
	var c Changes
	var churn []rundir.Record
	for i := range 5000 {
		churn = append(churn, counter(rundir.MetricBlkBytes, fmt.Sprintf("/c%d", i), 1))
	}
	c.Filter(churn)
	c.Filter(churn)
	left := churn[:10]
	for range 60 { // a minute of batches
		c.Filter(left)
	}
	if c.room.Oversized(len(left)) || len(c.last) != len(left) {
		t.Fatalf("a minute after the churn: %d series remembered, want %d, and maps made again at that size", len(c.last), len(left))
	}
	if got := c.Filter(left); len(got) != 0 {
		t.Errorf("an unchanged batch after the shrink passed on %d samples", len(got))
	}
	changed := append([]rundir.Record{counter(rundir.MetricBlkBytes, "/c0", 2)}, left[1:]...)
	if got := c.Filter(changed); len(got) != 1 || got[0].Cgroup != "/c0" {
		t.Errorf("after the shrink: passed on %+v, want /c0's change", got)
	}
}

// Waves of wakeups make batches of thousands between batches of tens: the maps keep their room
// from one wave to the next instead of being made again, to grow again at the next wave.
func TestChangesKeepTheirRoomBetweenWaves(t *testing.T) {
	var c Changes
	round := 0
	waves := func() {
		for i := range 5 { // a wave every fifth batch, as 1,000 sleepers started together wake
			round++
			n := 30
			if i == 0 {
				n = 3000
			}
			batch := make([]rundir.Record, n)
			for j := range batch {
				batch[j] = counter(rundir.MetricBlkBytes, fmt.Sprintf("/c%d", j), float64(round))
			}
			if got := c.Filter(batch); len(got) != n {
				t.Fatalf("round %d: passed on %d of %d changed samples", round, len(got), n)
			}
		}
	}
	maps := func() []uintptr {
		p := []uintptr{reflect.ValueOf(c.last).Pointer(), reflect.ValueOf(c.next).Pointer()}
		slices.Sort(p)
		return p
	}
	waves()
	before := maps()
	for range 4 {
		waves()
	}
	if after := maps(); !slices.Equal(before, after) {
		t.Error("the maps were made again between waves")
	}
}
