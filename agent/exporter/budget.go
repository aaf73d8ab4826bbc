package exporter

import (
	"cmp"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/nodectl/nodectl/host/kubeid"
)

// DefaultSeriesBudget bounds the series of a scrape: the node's and the agent's own, then the
// workloads whose tasks waited and ran most, each whole, then _overflow with the others'
// increases (docs/metrics.md, "Series budget"). 500 pods are about 1,500 workloads (the pod's
// cgroup, its pause container and its own) and, whole, 50,000 series.
const DefaultSeriesBudget = 3000

// scoreHalfLife is how long a workload's score takes to halve: its rank follows the last
// minute or so, whatever the scrapes' pace and however many scrapers there are.
const scoreHalfLife = 15 * time.Second

// stickiness favours the workloads exported at the last scrape, so that two of about the same
// score do not swap places at every scrape (each swap ends a series and starts another).
const stickiness = 1.5

// rolledKey is the label set of the rolled-up series: the overflow's.
var rolledKey = workloadKey{Overflow, kubeid.KindOther}

// seconds reports whether a counter's unit is seconds (of waiting or running): such counters,
// and every histogram's sum, rank their workload.
func seconds(name string) bool { return strings.HasSuffix(name, "_seconds_total") }

// lines is how many series s makes in a scrape.
func (s *series) lines() int {
	if s.hist != nil {
		return nBuckets + 2
	}
	return 1
}

// pending is the seconds s counted since the last scrape saw it; none before that scrape
// (a first reading holds the cgroup's whole life, not what it did lately).
func (s *series) pending() float64 {
	switch {
	case !s.marked:
		return 0
	case s.hist != nil: // marked: seenHist is set
		return float64(s.hist.sumNs-s.seenHist.sumNs) / 1e9
	case s.key.spec.typ == counter && s.key.spec.seconds:
		return s.value - s.seen
	}
	return 0
}

// settle marks s seen as it is now. With into, what s counted since the last scrape goes to
// into instead of s's own exported series: into gains it, and s's offset too, so that s, when
// exported again, goes on from the value it was last exported at. A gauge counts nothing: it
// is summed as it is.
func (s *series) settle(into *series) {
	s.marked = true
	switch {
	case s.hist != nil:
		if s.seenHist == nil {
			s.seenHist = &histo{}
		}
		if into != nil {
			d := s.hist.minus(s.seenHist)
			into.hist.add(&d)
			if s.offHist == nil {
				s.offHist = &histo{}
			}
			s.offHist.add(&d)
		}
		*s.seenHist = *s.hist
	case s.key.spec.typ == counter:
		if into != nil {
			into.value += s.value - s.seen
			s.off += s.value - s.seen
		}
		s.seen = s.value
	}
}

// add adds d's counts to h.
func (h *histo) add(d *histo) {
	for i, c := range d.buckets {
		h.buckets[i] += c
	}
	h.count += d.count
	h.sumNs += d.sumNs
}

// minus is h less o's counts (nil: none).
func (h *histo) minus(o *histo) histo {
	d := *h
	if o != nil {
		for i := range d.buckets {
			d.buckets[i] -= o.buckets[i]
		}
		d.count, d.sumNs = d.count-o.count, d.sumNs-o.sumNs
	}
	return d
}

// exported is what s's own series shows: its counts less what went to _overflow.
func (s *series) exported() (float64, histo) {
	var h histo
	if s.hist != nil {
		h = s.hist.minus(s.offHist)
	}
	return s.value - s.off, h
}

// addExported adds what s's own series shows to d.
func (d *series) addExported(s *series) {
	v, h := s.exported()
	d.value += v
	if d.hist != nil {
		d.hist.add(&h)
	}
}

// rollInto settles s into the series of its key in rolled.
func (s *series) rollInto(rolled *workload) { s.settle(rolled.seriesOf(s.key)) }

// budget is a scrape's plan: the workloads it exports whole, how many it rolled into
// _overflow, and the sum of the rolled workloads' gauges by series.
type budget struct {
	exported map[*workload]bool
	rolled   int
	gauges   map[seriesKey]float64
}

// plan decides, under the lock, which workloads this scrape exports whole within
// Config.SeriesBudget, given the lines the agent's own series take (fixed) and the workloads
// with an info series (info). The others' increases since the last scrape are added to
// e.rolled, whose rows, merged with the overflow workload's, stand for them.
func (e *Exporter) plan(fixed int, info map[workloadKey]bool) budget {
	now := e.now()
	decay := 1.0
	if !e.planned.IsZero() {
		decay = math.Exp2(-now.Sub(e.planned).Seconds() / scoreHalfLife.Seconds())
	}
	e.planned = now
	avail := e.cfg.SeriesBudget - fixed
	for _, s := range e.node.w.series {
		avail -= s.lines()
	}
	cost := make(map[*workload]int, len(e.workloads))
	ws := make([]*workload, 0, len(e.workloads))
	total := 0
	for _, w := range e.workloads {
		c := 0
		w.score *= decay
		for _, s := range w.series {
			c += s.lines()
			w.score += s.pending()
		}
		if info[w.key] {
			c++
		}
		cost[w], total = c, total+c
		ws = append(ws, w)
	}
	b := budget{exported: make(map[*workload]bool, len(ws))}
	if total <= avail && len(e.rolled.series) == 0 {
		for _, w := range ws {
			w.exported, b.exported[w] = true, true
			w.settle()
		}
		return b
	}
	// Set aside the overflow's rows, were every workload rolled into it: every key of every
	// series, once.
	union := maps.Clone(e.rolled.series)
	for _, w := range ws {
		maps.Copy(union, w.series)
	}
	for _, s := range union {
		avail -= s.lines()
	}
	rank := func(w *workload) float64 {
		if w.exported {
			return w.score * stickiness
		}
		return w.score
	}
	slices.SortFunc(ws, func(a, c *workload) int {
		return cmp.Or(cmp.Compare(rank(c), rank(a)), cmp.Compare(a.key.name, c.key.name), cmp.Compare(a.key.kind, c.key.kind))
	})
	b.gauges = map[seriesKey]float64{}
	for _, w := range ws {
		// The overflow workload's series are merged with the rollup's, always exported.
		if w.key != rolledKey && cost[w] > avail {
			w.exported = false
			b.rolled++
			for k, s := range w.series {
				if k.spec.typ == gauge {
					b.gauges[k] += s.value
				} else {
					s.rollInto(e.rolled)
				}
			}
			continue
		}
		if w.key != rolledKey {
			avail -= cost[w]
		}
		w.exported, b.exported[w] = true, true
		w.settle()
	}
	return b
}

// settle marks w's series seen.
func (w *workload) settle() {
	for _, s := range w.series {
		s.settle(nil)
	}
}
