package collect

import "github.com/nodectl/nodectl/rundir"

// Changes compacts cumulative series for a recording: of each batch of full snapshots it
// passes on only the samples whose value changed since the previous batch (every one the first
// time). A reader loses nothing: the value of a cumulative series at T is its last sample at or
// before T (docs/run-format.md). Gauges must not go through it: their readings are the data.
type Changes struct {
	last map[string]rundir.Record // by series key, as last passed on
}

// Filter returns the samples of snapshot that changed. A series absent from snapshot is
// forgotten (its cgroup was removed, or its producer failed this time): should it come back,
// it is passed on again, which costs a line and loses nothing.
func (c *Changes) Filter(snapshot []rundir.Record) []rundir.Record {
	current := make(map[string]rundir.Record, len(snapshot))
	var out []rundir.Record
	for _, r := range snapshot {
		k := rundir.SeriesKey(r.Metric, r.Cgroup, r.Labels)
		current[k] = r
		if old, ok := c.last[k]; ok && sameValue(old, r) {
			continue
		}
		out = append(out, r)
	}
	c.last = current
	return out
}

// sameValue says whether two samples of one series carry the same value. Cumulative
// histograms only change by gaining events, so count and sum tell.
func sameValue(a, b rundir.Record) bool {
	switch {
	case a.Hist != nil || b.Hist != nil:
		return a.Hist != nil && b.Hist != nil && a.Hist.Count == b.Hist.Count && a.Hist.SumNs == b.Hist.SumNs
	case a.Value != nil && b.Value != nil:
		return *a.Value == *b.Value
	}
	return false
}
