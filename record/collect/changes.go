package collect

import (
	"math"

	"github.com/nodectl/nodectl/internal/maproom"
	"github.com/nodectl/nodectl/rundir"
)

// Changes compacts cumulative series for a recording: of each batch of full snapshots it
// passes on only the samples whose value changed since the previous batch (every one the first
// time). A reader loses nothing: the value of a cumulative series at T is its last sample at or
// before T (docs/run-format.md). Gauges must not go through it: their readings are the data.
//
// It runs on every interval over every traced series (tens of thousands on a node of a
// thousand cgroups), so it tells series apart by a comparable key of the strings they already
// hold and keeps its two maps from one batch to the next: a batch allocates nothing once warm.
type Changes struct {
	last, next map[seriesID]value
	room       maproom.Room
	recent     int // records in the largest of the last batches, decaying by a 16th a batch
}

// Filter returns the samples of snapshot that changed, moved to its front: snapshot is the
// caller's no more (a snapshot is made for one interval; copying out what passed cost the
// agent a quarter of the bytes it allocates). A series absent from snapshot is forgotten (its
// cgroup was removed, or its producer failed this time): should it come back, it is passed on
// again, which costs a line and loses nothing.
func (c *Changes) Filter(snapshot []rundir.Record) []rundir.Record {
	if c.next == nil {
		c.next = make(map[seriesID]value, len(snapshot))
	}
	out := snapshot[:0]
	for i := range snapshot {
		r := &snapshot[i]
		id, v := idOf(r), valueOf(r)
		c.next[id] = v
		if old, ok := c.last[id]; ok && old == v && v.known {
			continue
		}
		out = append(out, *r)
	}
	c.last, c.next = c.next, c.last
	// After a churn of thousands of cgroups the maps would keep megabytes of room. Not after a
	// burst: wakeups come in waves (1,000 sandboxes started together wake together), and
	// making the maps again between two waves made them grow again at the next (a tenth of
	// the agent's allocations). So the size they are fit to is the largest of the last ones,
	// decaying by a 16th a batch: a churn's room goes within a minute.
	c.recent = max(len(snapshot), c.recent-c.recent/16)
	if c.room.Oversized(c.recent) {
		c.last, c.next = maproom.Fit(&c.room, c.last), make(map[seriesID]value, len(snapshot))
	} else {
		clear(c.next)
	}
	return out
}

// maxInline is how many labels a seriesID holds inline; more go through rundir.SeriesKey.
const maxInline = 3

// seriesID is a series' identity: metric, cgroup and labels in key order.
type seriesID struct {
	metric, cgroup string
	labels         [maxInline][2]string
	more           string // rundir.SeriesKey when there are more labels than fit
}

func idOf(r *rundir.Record) seriesID {
	id := seriesID{metric: r.Metric, cgroup: r.Cgroup}
	if len(r.Labels) > maxInline {
		id.more = rundir.SeriesKey(r.Metric, r.Cgroup, r.Labels)
		return id
	}
	n := 0
	for k, v := range r.Labels {
		// Insertion into key order: a map's own order varies.
		i := n
		for ; i > 0 && id.labels[i-1][0] > k; i-- {
			id.labels[i] = id.labels[i-1]
		}
		id.labels[i] = [2]string{k, v}
		n++
	}
	return id
}

// value is what tells two samples of one series apart. Cumulative histograms only change by
// gaining events, so count and sum tell.
type value struct {
	known bool // a value or a histogram; a sample with neither never compares equal
	hist  bool
	a, b  uint64
}

func valueOf(r *rundir.Record) value {
	switch {
	case r.Hist != nil:
		return value{known: true, hist: true, a: r.Hist.Count, b: r.Hist.SumNs}
	case r.Value != nil:
		return value{known: true, a: math.Float64bits(*r.Value)}
	}
	return value{}
}
