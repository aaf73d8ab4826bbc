package flightrec

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/nodectl/nodectl/rundir"
)

// The writer's catalogue holds every series it follows, for up to SeriesIdle after its last
// sample, in as few bytes as it can: at 1,000 cgroups and their churn that is most of the
// writer's memory. A series' identity is its cgroup (with its workload), kept once for all of
// the cgroup's series, and its shape (kind, metric and labels), kept once for all the series
// sharing it. Its value is kept as written: a float's integer and mode, a histogram's encoding
// in full. A cgroup that sent nothing for coldTicks ticks, a removed one most often, is packed
// into one byte slice of a few bytes a series until it sends again.
type catalogue struct {
	cgs    []wcgroup
	cgIdx  map[string]int32 // by key
	shapes []shape
	shIdx  map[string]int32
	ws     [][]wseries // hot series, in pages of wsPage: the pages neither move nor double as they grow
	nws    int32       // series slots made
	hists  [][]byte    // histograms' values, in full
	cols   []int32     // the open segment's columns: a series, or ^cgroup for a cold one's
	seg    int64       // the open segment's first tick; 0 before it has one

	freeCgs, freeShapes, freeWs, freeHists []int32

	n      int   // series followed
	lastCg int32 // the cgroup of the last sample, -1 when none: samples come by cgroup
}

// coldTicks: a cgroup that sent nothing for this many ticks is packed. Its series are then
// mostly its removed pod's, kept for SeriesIdle; a quiet cgroup's come back at a cost of a few
// microseconds.
const coldTicks = 5

// wcgroup is a cgroup and workload, and its series: hot, each a wseries, or cold, packed.
type wcgroup struct {
	key    string // the cgroup and the workload as a catalogue entry has them
	series []sref // hot: its series; nil when cold or free
	cold   []byte // cold: its series, packed (see coldSeries)
	inSeg  int64  // cold: the first tick of the segment its columns are in; 0 when in none
	seen   int64  // time of its last sample
	tick   uint32 // the tick of its last sample, counting Appends (wrapping)
	col0   int32  // cold: where its columns' deltas start from
	hint   int32  // where to look for the next sample's series: ticks come in the same order
	n      int32  // series; 0 when the slot is free
}

// names returns the cgroup and the workload.
func (g *wcgroup) names() (cgroup, workload string) {
	n, i := uvarintPrefix(g.key)
	cgroup, rest := g.key[i:i+int(n)], g.key[i+int(n):]
	_, i = uvarintPrefix(rest)
	return cgroup, rest[i:]
}

// uvarintPrefix reads the uvarint s starts with, which the writer put there.
func uvarintPrefix(s string) (v uint64, n int) {
	for i := 0; i < len(s) && i < binary.MaxVarintLen64; i++ {
		v |= uint64(s[i]&0x7f) << (7 * i)
		if s[i] < 0x80 {
			return v, i + 1
		}
	}
	return 0, 0
}

// sref is a hot series of a cgroup: its shape, to find it by, and its index in ws.
type sref struct{ shape, id int32 }

// shape is what a series is besides its cgroup and workload: its kind, metric and labels, as
// its catalogue entry has them, where the cgroup and workload go before the labels.
type shape struct {
	key   string
	split int32 // where the labels start
	refs  int32 // series of this shape; 0 when the slot is free
}

// wseries is a hot series.
type wseries struct {
	seen  int64 // time of its last sample
	m     int64 // its value as written: a float's integer in mode, or bits in modeRaw; a histogram's index in hists
	cg    int32
	shape int32
	col   int32  // its column in the open segment; -1 when not in it
	clen  uint32 // that column's bytes so far
	clast int32  // the tick of that column's last value
	stage int32  // its value to write, in Store.staged; -1 when none
	mode  uint8
	known bool // it has a value written: m holds it
}

func newCatalogue() catalogue {
	return catalogue{cgIdx: map[string]int32{}, shIdx: map[string]int32{}, lastCg: -1}
}

const wsPage = 1024

func (c *catalogue) series(id int32) *wseries { return &c.ws[id/wsPage][id%wsPage] }

// newSeries returns a free series slot.
func (c *catalogue) newSeries() int32 {
	if n := len(c.freeWs); n > 0 {
		id := c.freeWs[n-1]
		c.freeWs = c.freeWs[:n-1]
		return id
	}
	if c.nws%wsPage == 0 {
		c.ws = append(c.ws, make([]wseries, wsPage))
	}
	c.nws++
	return c.nws - 1
}

// alloc returns a free slot of a slice of slots, growing it when none is free.
func alloc[T any](slots *[]T, free *[]int32) int32 {
	if n := len(*free); n > 0 {
		i := (*free)[n-1]
		*free = (*free)[:n-1]
		return i
	}
	var zero T
	*slots = append(*slots, zero)
	return int32(len(*slots) - 1)
}

// cgroup returns the index of a cgroup, made hot, adding it when new. scratch is returned
// for reuse.
func (c *catalogue) cgroup(cgroup, workload string, scratch []byte) (int32, []byte) {
	if i := c.lastCg; i >= 0 {
		if cg, wl := c.cgs[i].names(); cg == cgroup && wl == workload {
			return i, scratch
		}
	}
	scratch = appendStr(appendStr(scratch[:0], cgroup), workload)
	i, ok := c.cgIdx[string(scratch)]
	if !ok {
		i = alloc(&c.cgs, &c.freeCgs)
		c.cgs[i] = wcgroup{key: string(scratch)}
		c.cgIdx[c.cgs[i].key] = i
	}
	if c.cgs[i].cold != nil {
		c.thaw(i)
	}
	c.lastCg = i
	return i, scratch
}

// shape returns the index of a shape, adding it when new. key is the shape as appendShape
// makes it, labels starting at split.
func (c *catalogue) shape(key []byte, split int) int32 {
	if i, ok := c.shIdx[string(key)]; ok {
		return i
	}
	i := alloc(&c.shapes, &c.freeShapes)
	c.shapes[i] = shape{key: string(key), split: int32(split)}
	c.shIdx[c.shapes[i].key] = i
	return i
}

// seriesOf returns the index of hot cgroup cg's series of a sample of kind, adding it when
// new. A cgroup's samples come in the same order tick after tick: the sample is compared with
// the few series after the last one found before its shape is encoded and looked up. scratch
// is returned for reuse.
func (c *catalogue) seriesOf(cg int32, kind byte, r *rundir.Record, scratch []byte) (int32, []byte) {
	g := &c.cgs[cg]
	n := int32(len(g.series))
	for k := range min(n, 4) {
		j := (g.hint + k) % n
		if c.shapes[g.series[j].shape].is(kind, r) {
			g.hint = j + 1
			return g.series[j].id, scratch
		}
	}
	scratch, split := appendShape(scratch[:0], kind, r)
	sh := c.shape(scratch, split)
	if id := c.find(cg, sh); id >= 0 {
		return id, scratch
	}
	return c.add(cg, sh), scratch
}

// is says whether a sample of kind has this shape.
func (sh *shape) is(kind byte, r *rundir.Record) bool {
	if sh.key[0] != kind {
		return false
	}
	if metric, _ := cutStr(sh.key[1:]); metric != r.Metric {
		return false
	}
	n, i := uvarintPrefix(sh.key[sh.split:])
	if int(n) != len(r.Labels) {
		return false
	}
	labels := sh.key[int(sh.split)+i:]
	for range n {
		var name, value string
		name, labels = cutStr(labels)
		value, labels = cutStr(labels)
		if v, ok := r.Labels[name]; !ok || v != value {
			return false
		}
	}
	return true
}

// cutStr cuts the string s starts with, as appendStr put it there.
func cutStr(s string) (str, rest string) {
	n, i := uvarintPrefix(s)
	return s[i : i+int(n)], s[i+int(n):]
}

// find returns the index of cgroup cg's hot series of shape sh, -1 when it has none.
func (c *catalogue) find(cg, sh int32) int32 {
	g := &c.cgs[cg]
	n := int32(len(g.series))
	for k := range n {
		j := (g.hint + k) % n
		if r := g.series[j]; r.shape == sh {
			g.hint = j + 1
			return r.id
		}
	}
	return -1
}

// add adds a series, with no value yet, to hot cgroup cg.
func (c *catalogue) add(cg, sh int32) int32 {
	id := c.newSeries()
	*c.series(id) = wseries{cg: cg, shape: sh, col: -1, stage: -1}
	g := &c.cgs[cg]
	g.series = append(g.series, sref{sh, id})
	g.n++
	c.shapes[sh].refs++
	c.n++
	return id
}

func (c *catalogue) kind(ws *wseries) byte { return c.shapes[ws.shape].key[0] }

// release frees what a hot series holds besides its shape.
func (c *catalogue) release(id int32) {
	ws := c.series(id)
	if ws.known && c.kind(ws) == kindHist {
		c.hists[ws.m] = nil
		c.freeHists = append(c.freeHists, int32(ws.m))
	}
	*ws = wseries{}
	c.freeWs = append(c.freeWs, id)
}

// forget counts a series of shape sh dropped, and frees the shape with its last series.
func (c *catalogue) forget(sh int32) {
	c.n--
	s := &c.shapes[sh]
	if s.refs--; s.refs == 0 {
		delete(c.shIdx, s.key)
		*s = shape{}
		c.freeShapes = append(c.freeShapes, sh)
	}
}

// dropCgroup frees a cgroup left with no series.
func (c *catalogue) dropCgroup(cg int32) {
	delete(c.cgIdx, c.cgs[cg].key)
	c.cgs[cg] = wcgroup{}
	c.freeCgs = append(c.freeCgs, cg)
	if c.lastCg == cg {
		c.lastCg = -1
	}
}

// value sets v to a hot series' value as written, and returns it.
func (c *catalogue) value(ws *wseries, v *val) *val {
	if c.kind(ws) == kindHist {
		d := dec{b: c.hists[ws.m]}
		d.abs(kindHist, v)
		return v
	}
	v.mode, v.m, v.bits = ws.mode, ws.m, uint64(ws.m)
	if ws.mode != modeRaw {
		v.bits = math.Float64bits(floatOf(ws.mode, ws.m))
	}
	return v
}

// appendValue appends a hot series' value as written, in full.
func (c *catalogue) appendValue(b []byte, ws *wseries) []byte {
	if c.kind(ws) == kindHist {
		return append(b, c.hists[ws.m]...)
	}
	var v val
	return appendAbs(b, kindFloat, c.value(ws, &v))
}

// setValue makes v, whose float mode and m are set, a hot series' value as written.
func (c *catalogue) setValue(ws *wseries, v *val) {
	if c.kind(ws) == kindFloat {
		ws.mode, ws.m = v.mode, v.m
		if v.mode == modeRaw {
			ws.m = int64(v.bits)
		}
	} else {
		if !ws.known {
			ws.m = int64(alloc(&c.hists, &c.freeHists))
		}
		c.hists[ws.m] = appendAbs(c.hists[ws.m][:0], kindHist, v)
	}
	ws.known = true
}

// A cold cgroup's series are packed one after the other, by column, each as: its shape; how
// long before the last series' last sample it had its last (zigzag; the first's, from the
// cgroup's); its column, as the delta from the last series' (from col0-1); that column's last
// tick and, unless 0 (the column is the value alone), its length; its value in full. The
// columns hold in the segment that began at inSeg; in any other, the series are in none.
type coldSeries struct {
	shape int32
	seen  int64
	col   int32 // -1 when in no column
	clen  uint32
	clast int32
	val   []byte
}

func appendCold(b []byte, cs *coldSeries, prevSeen int64, colDelta int32) []byte {
	b = binary.AppendUvarint(b, uint64(cs.shape))
	b = binary.AppendUvarint(b, zigzag(prevSeen-cs.seen))
	b = binary.AppendUvarint(b, uint64(colDelta))
	b = binary.AppendUvarint(b, uint64(cs.clast))
	if cs.clast != 0 {
		b = binary.AppendUvarint(b, uint64(cs.clen))
	}
	return append(b, cs.val...)
}

// coldIter reads a cold cgroup's series from off.
type coldIter struct {
	c     *catalogue
	g     *wcgroup
	inSeg bool
	off   int
	col   int32 // the last series' column
	seen  int64 // and last sample
	cur   coldSeries
}

func (c *catalogue) coldSeries(cg int32) coldIter {
	g := &c.cgs[cg]
	return coldIter{c: c, g: g, inSeg: g.inSeg != 0 && g.inSeg == c.seg, col: g.col0 - 1, seen: g.seen}
}

func (it *coldIter) next() bool {
	if it.off == len(it.g.cold) {
		return false
	}
	d := dec{b: it.g.cold[it.off:]}
	cs := &it.cur
	cs.shape = int32(d.uvarint())
	cs.seen = it.seen - unzigzag(d.uvarint())
	it.seen = cs.seen
	it.col += int32(d.uvarint())
	cs.col = -1
	if it.inSeg {
		cs.col = it.col
	}
	cs.clast = int32(d.uvarint())
	if cs.clast != 0 {
		cs.clen = uint32(d.uvarint())
	}
	start := d.b
	d.skipAbs(it.c.shapes[cs.shape].key[0])
	cs.val = start[:len(start)-len(d.b)]
	if cs.clast == 0 {
		cs.clen = uint32(len(cs.val))
	}
	if d.err != nil {
		panic(fmt.Sprintf("flightrec: a cold cgroup does not decode (a bug): %v", d.err))
	}
	it.off = len(it.g.cold) - len(d.b)
	return true
}

// freeze packs hot cgroup cg; scratch is returned for reuse.
func (c *catalogue) freeze(cg int32, scratch []byte) []byte {
	g := &c.cgs[cg]
	slices.SortFunc(g.series, func(a, b sref) int { return cmp.Compare(c.series(a.id).col, c.series(b.id).col) })
	b := scratch[:0]
	var v []byte
	g.inSeg, g.col0 = 0, 0
	prev, seen := int32(-1), g.seen
	for _, r := range g.series {
		ws := c.series(r.id)
		if ws.col >= 0 {
			g.inSeg = c.seg
			c.cols[ws.col] = ^cg
		}
		v = c.appendValue(v[:0], ws)
		b = appendCold(b, &coldSeries{shape: ws.shape, seen: ws.seen, clen: ws.clen, clast: ws.clast, val: v}, seen, ws.col-prev)
		prev, seen = ws.col, ws.seen
		c.release(r.id)
	}
	g.cold, g.series = slices.Clone(b), nil
	if c.lastCg == cg {
		c.lastCg = -1
	}
	return b
}

// thaw makes cold cgroup cg hot.
func (c *catalogue) thaw(cg int32) {
	it := c.coldSeries(cg)
	series := make([]sref, 0, c.cgs[cg].n)
	var v val
	for it.next() {
		cs := &it.cur
		id := c.newSeries()
		ws := c.series(id)
		*ws = wseries{seen: cs.seen, cg: cg, shape: cs.shape, col: cs.col, clen: cs.clen, clast: cs.clast, stage: -1}
		d := dec{b: cs.val}
		d.abs(c.kind(ws), &v)
		c.setValue(ws, &v)
		if cs.col >= 0 {
			c.cols[cs.col] = id
		}
		series = append(series, sref{cs.shape, id})
	}
	g := &c.cgs[cg]
	g.series, g.cold, g.inSeg, g.hint = series, nil, 0, 0
}

// carry is a segment's start: it drops the series with no sample since idleBefore (none with
// a value to write), and appends to defs the hot series left, by shape then cgroup, which puts
// alike columns side by side, and to colds the cold cgroups, by cgroup. The cold cgroups'
// series are to take the columns after the hot ones', in that order.
func (c *catalogue) carry(idleBefore int64, defs, colds []int32, scratch []byte) ([]int32, []int32, []byte) {
	defs = slices.Grow(defs, int(c.nws)-len(c.freeWs)) // the hot series
	for cg := range int32(len(c.cgs)) {
		g := &c.cgs[cg]
		if g.n == 0 {
			continue
		}
		if g.cold == nil {
			kept := g.series[:0]
			for _, r := range g.series {
				if ws := c.series(r.id); ws.stage < 0 && ws.seen < idleBefore {
					c.release(r.id)
					c.forget(r.shape)
					g.n--
					continue
				}
				kept = append(kept, r)
				defs = append(defs, r.id)
			}
			g.series, g.hint = kept, 0
		} else {
			b, seen := scratch[:0], g.seen
			it := c.coldSeries(cg)
			for it.next() {
				cs := &it.cur
				if cs.seen < idleBefore {
					c.forget(cs.shape)
					g.n--
					continue
				}
				cs.clen, cs.clast = uint32(len(cs.val)), 0
				b = appendCold(b, cs, seen, 1)
				seen = cs.seen
			}
			g.cold, g.inSeg, scratch = append(g.cold[:0], b...), 0, b
			if g.n > 0 {
				colds = append(colds, cg)
			}
		}
		if g.n == 0 {
			c.dropCgroup(cg)
		}
	}
	shRank := ranks(c.shapes, func(s *shape) bool { return s.refs > 0 }, func(a, b *shape) int { return cmp.Compare(a.key, b.key) })
	cgRank := ranks(c.cgs, func(g *wcgroup) bool { return g.n > 0 }, func(a, b *wcgroup) int { return cmp.Compare(a.key, b.key) })
	slices.SortFunc(defs, func(a, b int32) int {
		wa, wb := c.series(a), c.series(b)
		return cmp.Or(cmp.Compare(shRank[wa.shape], shRank[wb.shape]), cmp.Compare(cgRank[wa.cg], cgRank[wb.cg]))
	})
	slices.SortFunc(colds, func(a, b int32) int { return cmp.Compare(cgRank[a], cgRank[b]) })
	return defs, colds, scratch
}

// ranks returns the rank of each slot in use by cmp.
func ranks[T any](slots []T, used func(*T) bool, cmp func(a, b *T) int) []int32 {
	order := make([]int32, 0, len(slots))
	for i := range slots {
		if used(&slots[i]) {
			order = append(order, int32(i))
		}
	}
	slices.SortFunc(order, func(a, b int32) int { return cmp(&slots[a], &slots[b]) })
	rank := make([]int32, len(slots))
	for r, i := range order {
		rank[i] = int32(r)
	}
	return rank
}
