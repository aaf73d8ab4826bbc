package rundir

import (
	"cmp"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/nodectl/nodectl/rundir/hist"
)

// Window is a span of a run, (Start, End]: a phase, or the whole run.
type Window struct {
	Name  string    `json:"name"`
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
}

// Seconds is the window's length.
func (w Window) Seconds() float64 { return w.End.Sub(w.Start).Seconds() }

// Phases returns the run's phase windows ordered by start. A phase that started and never
// ended (the run crashed or was interrupted) ends at the last record's time.
func (r *Run) Phases() []Window {
	var windows []Window
	open := map[string]int{} // phase name -> index of its unended window
	for _, rec := range r.Records {
		if rec.Type != TypePhase {
			continue
		}
		switch rec.Event {
		case EventStart:
			open[rec.Name] = len(windows)
			windows = append(windows, Window{Name: rec.Name, Start: rec.Time})
		case EventEnd:
			if i, ok := open[rec.Name]; ok {
				windows[i].End = rec.Time
				delete(open, rec.Name)
			}
		}
	}
	last := r.lastTime()
	for _, i := range open {
		windows[i].End = last
	}
	slices.SortStableFunc(windows, func(a, b Window) int { return a.Start.Compare(b.Start) })
	return windows
}

// Phase returns the first window of the named phase.
func (r *Run) Phase(name string) (Window, bool) {
	for _, w := range r.Phases() {
		if w.Name == name {
			return w, true
		}
	}
	return Window{}, false
}

// Span is the whole run as one window named "run": from the run's start (or its first record,
// if earlier) to its last record.
func (r *Run) Span() Window {
	w := Window{Name: "run", Start: r.Meta.Start, End: r.lastTime()}
	for _, rec := range r.Records {
		if w.Start.IsZero() || rec.Time.Before(w.Start) {
			w.Start = rec.Time
		}
	}
	return w
}

func (r *Run) lastTime() time.Time {
	var last time.Time
	for _, rec := range r.Records {
		if rec.Time.After(last) {
			last = rec.Time
		}
	}
	return last
}

// Series is the samples of one metric for one cgroup and one label set, ordered by time.
type Series struct {
	Metric  string
	Cgroup  string
	Labels  map[string]string
	Samples []Record
	// Before says the counter counted before the recording first read it: in an agent window
	// the cgroup and node samplers' counters run from the cgroup's creation or the node's
	// boot, and a cgroup is read from when the agent follows it. With no sample at or before a
	// window's start, Delta then starts at the series' first sample in the window, not at zero.
	Before bool
}

// at returns the last sample at or before t, nil if there is none.
func (s *Series) at(t time.Time) *Record {
	i := sort.Search(len(s.Samples), func(i int) bool { return s.Samples[i].Time.After(t) })
	if i == 0 {
		return nil
	}
	return &s.Samples[i-1]
}

// Delta is how much a cumulative counter grew over w: the last value at or before w.End minus
// the last value at or before w.Start, a missing value counting as zero (a counter the run
// made, as its cgroups' are) or, for a series counting from Before, as its first value in w.
// A counter that went backwards (its producer restarted) yields zero.
func (s *Series) Delta(w Window) float64 {
	start := s.at(w.Start)
	if start == nil && s.Before {
		if i := sort.Search(len(s.Samples), func(i int) bool { return s.Samples[i].Time.After(w.Start) }); i < len(s.Samples) && !s.Samples[i].Time.After(w.End) {
			start = &s.Samples[i]
		}
	}
	return max(0, value(s.at(w.End))-value(start))
}

// LongestFlat is the longest stretch of w over which a cumulative counter did not grow, as far
// as its samples tell: a recording writes a counter only when it changed (docs/run-format.md),
// so it is the longest time in w between a sample and the next one that grew (or w's end),
// less interval, the sampling period by which the growth may have come earlier.
func (s *Series) LongestFlat(w Window, interval time.Duration) time.Duration {
	last, since := value(s.at(w.Start)), w.Start
	var longest time.Duration
	flat := func(until time.Time) {
		longest = max(longest, until.Sub(since)-interval)
	}
	for i := sort.Search(len(s.Samples), func(i int) bool { return s.Samples[i].Time.After(w.Start) }); i < len(s.Samples) && !s.Samples[i].Time.After(w.End); i++ {
		if v := value(&s.Samples[i]); v > last {
			flat(s.Samples[i].Time)
			last, since = v, s.Samples[i].Time
		}
	}
	flat(w.End)
	return max(0, longest)
}

// HistDelta is the events a cumulative histogram gained over w, by the rule of Delta.
func (s *Series) HistDelta(w Window) hist.Log2 {
	return histOf(s.at(w.End)).Sub(histOf(s.at(w.Start)))
}

func value(r *Record) float64 {
	if r == nil || r.Value == nil {
		return 0
	}
	return *r.Value
}

func histOf(r *Record) hist.Log2 {
	if r == nil || r.Hist == nil {
		return hist.Log2{}
	}
	return *r.Hist
}

// SeriesSet is a selection of series; its sums run over all of them.
type SeriesSet []*Series

// Series returns every series of metric, ordered by cgroup and labels.
func (r *Run) Series(metric string) SeriesSet {
	if r.series == nil {
		r.series = indexSeries(r.Records)
		if r.Meta.Scenario == ScenarioAgent {
			for m := range sampledCounters {
				for _, s := range r.series[m] {
					s.Before = true
				}
			}
		}
	}
	return r.series[metric]
}

// sampledCounters are the cumulative series of the cgroup and node samplers, which count from
// a cgroup's creation or the node's boot; the tracers' count from when they attached.
var sampledCounters = map[string]bool{
	MetricCPUUsage: true, MetricCPUPeriods: true, MetricCPUThrottled: true, MetricCPUThrottledTime: true,
	MetricCgroupPressure: true, MetricMemoryLimitEvents: true, MetricMemoryMajorFaults: true,
	MetricMemoryOOMKills: true, MetricMemoryRefaults: true, MetricMemorySwapPages: true,
	MetricSystemPressure: true, MetricVmstat: true, MetricDiskBytes: true, MetricDiskIOs: true,
	MetricDiskIOTime: true, MetricDiskWeightedIOTime: true,
}

// indexKey identifies a series without building a string: most series have at most two
// labels, held in order; more fall back to SeriesKey in rest.
type indexKey struct {
	metric, cgroup string
	k1, v1, k2, v2 string
	rest           string
}

func keyOf(rec *Record) indexKey {
	k := indexKey{metric: rec.Metric, cgroup: rec.Cgroup}
	switch len(rec.Labels) {
	case 0:
	case 1:
		for lk, lv := range rec.Labels {
			k.k1, k.v1 = lk, lv
		}
	case 2:
		i := 0
		for lk, lv := range rec.Labels {
			if i == 0 {
				k.k1, k.v1 = lk, lv
			} else {
				k.k2, k.v2 = lk, lv
			}
			i++
		}
		if k.k2 < k.k1 {
			k.k1, k.v1, k.k2, k.v2 = k.k2, k.v2, k.k1, k.v1
		}
	default:
		k.rest = SeriesKey("", "", rec.Labels)
	}
	return k
}

// compare orders keys as SeriesKey orders their series: by metric, cgroup, then labels.
func (k indexKey) compare(o indexKey) int {
	return cmp.Or(strings.Compare(k.metric, o.metric), strings.Compare(k.cgroup, o.cgroup),
		strings.Compare(k.k1, o.k1), strings.Compare(k.v1, o.v1), strings.Compare(k.k2, o.k2),
		strings.Compare(k.v2, o.v2), strings.Compare(k.rest, o.rest))
}

// indexSeries groups recs' samples by series. It counts each series' samples first and gives
// them one backing array: appending record by record doubled an incident's analysis's memory
// (BenchmarkIncidentAnalysis).
func indexSeries(recs []Record) map[string]SeriesSet {
	type building struct {
		key indexKey
		s   *Series
		n   int
	}
	byKey := map[indexKey]*building{}
	of := make([]*building, len(recs))
	total := 0
	for i := range recs {
		rec := &recs[i]
		if rec.Type != TypeSample || rec.Metric == "" {
			continue
		}
		key := keyOf(rec)
		b, ok := byKey[key]
		if !ok {
			b = &building{key: key, s: &Series{Metric: rec.Metric, Cgroup: rec.Cgroup, Labels: rec.Labels}}
			byKey[key] = b
		}
		b.n++
		of[i] = b
		total++
	}
	all := make([]*building, 0, len(byKey))
	for _, b := range byKey {
		all = append(all, b)
	}
	// Ordered by cgroup and labels, as SeriesKey orders them.
	slices.SortFunc(all, func(a, b *building) int { return a.key.compare(b.key) })
	backing := make([]Record, total)
	off := 0
	for _, b := range all {
		b.s.Samples = backing[off : off : off+b.n]
		off += b.n
	}
	for i, b := range of {
		if b != nil {
			b.s.Samples = append(b.s.Samples, recs[i])
		}
	}
	index := map[string]SeriesSet{}
	for _, b := range all {
		s := b.s
		// Producers append concurrently, so samples may be slightly out of order.
		slices.SortStableFunc(s.Samples, func(a, b Record) int { return a.Time.Compare(b.Time) })
		index[s.Metric] = append(index[s.Metric], s)
	}
	return index
}

// SeriesKey identifies a series: metric, cgroup and the sorted label pairs.
func SeriesKey(metric, cgroup string, labels map[string]string) string {
	var b strings.Builder
	b.WriteString(metric)
	b.WriteByte(0)
	b.WriteString(cgroup)
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		b.WriteByte(0)
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(labels[k])
	}
	return b.String()
}

// LongestFlat is the longest stretch of w over which none of the counters grew (Series'
// LongestFlat, the shortest of theirs), zero without a series.
func (ss SeriesSet) LongestFlat(w Window, interval time.Duration) time.Duration {
	if len(ss) == 0 {
		return 0
	}
	flat := ss[0].LongestFlat(w, interval)
	for _, s := range ss[1:] {
		flat = min(flat, s.LongestFlat(w, interval))
	}
	return flat
}

// Cgroup selects the series of one cgroup ("" selects series without a cgroup).
func (ss SeriesSet) Cgroup(path string) SeriesSet {
	return ss.filter(func(s *Series) bool { return s.Cgroup == path })
}

// CgroupIn selects the series of any of the cgroups.
func (ss SeriesSet) CgroupIn(paths ...string) SeriesSet {
	return ss.filter(func(s *Series) bool { return slices.Contains(paths, s.Cgroup) })
}

// Label selects the series whose label key has value.
func (ss SeriesSet) Label(key, value string) SeriesSet {
	return ss.filter(func(s *Series) bool { return s.Labels[key] == value })
}

// LabelIn selects the series whose label key has any of values.
func (ss SeriesSet) LabelIn(key string, values ...string) SeriesSet {
	return ss.filter(func(s *Series) bool { return slices.Contains(values, s.Labels[key]) })
}

func (ss SeriesSet) filter(keep func(*Series) bool) SeriesSet {
	var out SeriesSet
	for _, s := range ss {
		if keep(s) {
			out = append(out, s)
		}
	}
	return out
}

// ByCgroup groups the series by cgroup.
func (ss SeriesSet) ByCgroup() map[string]SeriesSet {
	return ss.group(func(s *Series) string { return s.Cgroup })
}

// ByLabel groups the series by the value of a label ("" for series without it).
func (ss SeriesSet) ByLabel(key string) map[string]SeriesSet {
	return ss.group(func(s *Series) string { return s.Labels[key] })
}

// Busiest is the value of label key whose series weigh the most by weight (the device with the
// most fsyncs, or bytes): series without the label are left out, a tie goes to the smaller
// value, and "" when none weighs anything.
func (ss SeriesSet) Busiest(key string, weight func(SeriesSet) float64) string {
	best, most := "", 0.0
	for v, set := range ss.ByLabel(key) {
		if w := weight(set); v != "" && (w > most || w == most && w > 0 && v < best) {
			best, most = v, w
		}
	}
	return best
}

func (ss SeriesSet) group(key func(*Series) string) map[string]SeriesSet {
	out := map[string]SeriesSet{}
	for _, s := range ss {
		k := key(s)
		out[k] = append(out[k], s)
	}
	return out
}

// Delta sums Series.Delta over the set.
func (ss SeriesSet) Delta(w Window) float64 {
	var sum float64
	for _, s := range ss {
		sum += s.Delta(w)
	}
	return sum
}

// HistDelta sums Series.HistDelta over the set.
func (ss SeriesSet) HistDelta(w Window) hist.Log2 {
	var sum hist.Log2
	for _, s := range ss {
		sum = sum.Add(s.HistDelta(w))
	}
	return sum
}

// Samples returns the samples of the set inside w (after Start, at or before End) that carry a
// value, ordered by time: the readings of a gauge such as a probe's per-iteration latency.
func (ss SeriesSet) Samples(w Window) []Record {
	var out []Record
	for _, s := range ss {
		lo := sort.Search(len(s.Samples), func(i int) bool { return s.Samples[i].Time.After(w.Start) })
		hi := sort.Search(len(s.Samples), func(i int) bool { return s.Samples[i].Time.After(w.End) })
		for _, rec := range s.Samples[lo:hi] {
			if rec.Value != nil {
				out = append(out, rec)
			}
		}
	}
	slices.SortStableFunc(out, func(a, b Record) int { return a.Time.Compare(b.Time) })
	return out
}

// Values returns the values of Samples(w).
func (ss SeriesSet) Values(w Window) []float64 {
	samples := ss.Samples(w)
	out := make([]float64, len(samples))
	for i, rec := range samples {
		out[i] = *rec.Value
	}
	return out
}
