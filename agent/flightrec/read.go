package flightrec

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/nodectl/nodectl/internal/atomicfile"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

// Reader reads a store's directory without writing to it: while its agent writes, or a copy
// of a dead one's, read-only or not. Every call looks at the directory afresh.
type Reader struct {
	dir string

	mu  sync.Mutex
	bad map[string]string // segments whose frames turned out damaged: path -> why
}

// OpenReader returns a reader of dir.
func OpenReader(dir string) (*Reader, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("flightrec: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("flightrec: %s is not a directory", dir)
	}
	return &Reader{dir: dir, bad: map[string]string{}}, nil
}

// Read is Store.Read on the directory: sealed segments and the journal up to its last whole
// tick. Damaged segments are skipped and listed by Span.
func (r *Reader) Read(from, to time.Time, step time.Duration, fn func(rundir.Record) error) error {
	return r.ReadSeries(from, to, step, nil, fn)
}

// ReadSeries is Read of the series keep admits (see Store.ReadSeries).
func (r *Reader) ReadSeries(from, to time.Time, step time.Duration, keep Keep, fn func(rundir.Record) error) error {
	v, _, err := r.scan(keep)
	if err != nil {
		return err
	}
	return v.read(from, to, step, keep, fn, func(f segFile, err error) {
		r.mu.Lock()
		r.bad[f.path] = err.Error()
		r.mu.Unlock()
	})
}

// Span says what the directory holds.
func (r *Reader) Span() (Span, error) {
	_, sp, err := r.scan(nil)
	return sp, err
}

// scan lists the directory and replays its journal, keeping the series keep admits (nil: all).
func (r *Reader) scan(keep Keep) (*view, Span, error) {
	var sp Span
	// The journal before the listing: should the writer seal it in between, the listing shows
	// the new segment and the journal read is recognised as stale below.
	b, err := os.ReadFile(filepath.Join(r.dir, journalName))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, sp, fmt.Errorf("flightrec: %w", err)
	}
	g := &segment{}
	good, _ := replay(b, g, keep)
	l, err := listDir(r.dir)
	if err != nil {
		return nil, sp, fmt.Errorf("flightrec: %w", err)
	}
	sp.Corrupt = l.corrupt
	for _, d := range l.damaged {
		sp.Corrupt = append(sp.Corrupt, filepath.Base(d.path))
	}
	r.mu.Lock()
	v := &view{}
	for _, f := range l.segs {
		if _, bad := r.bad[f.path]; bad {
			sp.Corrupt = append(sp.Corrupt, filepath.Base(f.path))
			continue
		}
		v.segs = append(v.segs, f)
		sp.Bytes += f.size
		sp.Series = max(sp.Series, int(f.h.series))
	}
	r.mu.Unlock()
	sp.Segments = len(v.segs)
	if n := len(v.segs); len(g.ticks) == 0 || n == 0 || g.ticks[0] > v.segs[n-1].h.last {
		sp.Bytes += int64(len(b))
		sp.TornBytes = int64(len(b) - good)
		if len(g.ticks) > 0 {
			v.open = g
			sp.Series = max(sp.Series, len(g.cols))
		}
	}
	if len(v.segs) > 0 {
		sp.Oldest = time.Unix(0, v.segs[0].h.first).UTC()
		sp.Newest = time.Unix(0, v.segs[len(v.segs)-1].h.last).UTC()
	}
	if v.open != nil {
		if sp.Oldest.IsZero() {
			sp.Oldest = time.Unix(0, g.ticks[0]).UTC()
		}
		sp.Newest = time.Unix(0, g.ticks[len(g.ticks)-1]).UTC()
	}
	return v, sp, nil
}

// listing is what a directory holds.
type listing struct {
	segs    []segFile // readable, by time, not overlapping
	damaged []damage  // segments whose header is damaged, or that overlap an earlier one
	corrupt []string  // names already set aside
	tmps    []string  // files a crash left half-written
}

type damage struct {
	path string
	err  error
}

func listDir(dir string) (listing, error) {
	var l listing
	entries, err := os.ReadDir(dir)
	if err != nil {
		return l, err
	}
	for _, e := range entries {
		name := e.Name()
		switch {
		case strings.HasSuffix(name, badSuffix):
			l.corrupt = append(l.corrupt, name)
		case atomicfile.Pending(name) || strings.HasSuffix(name, tmpSuffix):
			l.tmps = append(l.tmps, name)
		case strings.HasPrefix(name, segPrefix) && strings.HasSuffix(name, segSuffix):
			path := filepath.Join(dir, name)
			f, err := openSegFile(path)
			switch {
			case errors.Is(err, fs.ErrNotExist): // retention removed it meanwhile
			case err != nil:
				l.damaged = append(l.damaged, damage{path, err})
			default:
				l.segs = append(l.segs, f)
			}
		}
	}
	slices.SortFunc(l.segs, func(a, b segFile) int { return cmp.Compare(a.h.first, b.h.first) })
	kept := l.segs[:0]
	for _, f := range l.segs {
		if n := len(kept); n > 0 && f.h.first <= kept[n-1].h.last {
			l.damaged = append(l.damaged, damage{f.path, fmt.Errorf("%w: overlaps %s", errCorrupt, filepath.Base(kept[n-1].path))})
			continue
		}
		kept = append(kept, f)
	}
	l.segs = kept
	return l, nil
}

// view is what one read sees: sealed segments and the open one.
type view struct {
	segs []segFile
	open *segment // nil when the journal holds no tick
}

func (v *view) read(from, to time.Time, step time.Duration, keep Keep, fn func(rundir.Record) error, bad func(segFile, error)) error {
	if step < 0 || to.Before(from) {
		return fmt.Errorf("flightrec: bad window [%v, %v] step %v", from, to, step)
	}
	r := &reading{from: clampNanos(from), to: clampNanos(to), step: int64(step), keep: keep, fn: fn, known: map[string]*rseries{}, intern: newInterner()}
	// Events first: they are few, and their times need not fall in their tick's segment.
	skip := map[string]bool{}
	var buf, zbuf []byte // reused from segment to segment
	var cols colScratch
	for _, f := range v.segs {
		if f.h.events == 0 || f.h.maxT < r.from || f.h.minT > r.to {
			continue
		}
		b, err := f.loadEvents(buf, &zbuf)
		if err == nil {
			buf = b
			err = r.addEvents(b, int(f.h.events), from, to)
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			bad(f, err)
			skip[f.path] = true
		}
	}
	if v.open != nil {
		if err := r.addEvents(v.open.events, v.open.nEvents, from, to); err != nil {
			return fmt.Errorf("flightrec: journal: %w", err)
		}
	}
	slices.SortStableFunc(r.events, func(a, b rundir.Record) int { return a.Time.Compare(b.Time) })

	for _, f := range v.segs {
		if f.h.last < r.from {
			continue
		}
		if f.h.first > r.to {
			break
		}
		if skip[f.path] {
			r.forget()
			continue
		}
		g, err := f.load(&cols, r.keep)
		if err == nil {
			err = r.segment(g)
		}
		if r.fnErr != nil {
			return r.fnErr
		}
		if err != nil {
			r.forget()
			if !errors.Is(err, fs.ErrNotExist) {
				bad(f, err)
			}
		}
	}
	if g := v.open; g != nil && g.ticks[len(g.ticks)-1] >= r.from && g.ticks[0] <= r.to {
		if err := r.segment(g); err != nil {
			if r.fnErr != nil {
				return r.fnErr
			}
			return fmt.Errorf("flightrec: journal: %w", err)
		}
	}
	return r.finish()
}

// rseries is a series as a read follows it across segments.
type rseries struct {
	info    seriesInfo
	v       val
	has     bool
	carried bool // changed after the last tick emitted, not sent yet
	seg     int  // the last segment it was seen in
}

// A read decodes a segment column by column, for cache locality, a chunk of ticks at a time,
// to bound memory. Each change is due at a selection: the first emitted tick at or after it.
// A column's change is put in that selection's bucket once the column moves past it, with the
// state there; the buckets of a chunk are then sent tick by tick.
const chunkTicks = 60

type reading struct {
	from, to, step int64
	keep           Keep // nil: every series
	fn             func(rundir.Record) error
	fnErr          error

	known   map[string]*rseries // by catalogue entry
	intern  *interner
	carry   []*rseries // changed after the last tick emitted
	started bool       // the window's first tick was emitted
	nextSel int64      // with a step, the time from which the next tick is emitted
	lastT   int64      // the last tick of the window seen
	nseg    int

	events []rundir.Record
	ev     int

	// Scratch, reused from segment to segment, and slabs the records' values come from.
	sel     []int32 // the segment's emitted ticks
	due     []int32 // by tick: the selection its changes are due at; len(sel) after the last
	cols    []rcol
	buckets [][]entry // by selection of the chunk
	tmp     val
	vals    []float64
	hist    []hist.Log2
	bkts    []uint64
}

// rcol is a column being decoded.
type rcol struct {
	rs      *rseries
	rest    []byte // what is left to decode
	first   int32  // tick of its first value
	next    int32  // tick of its next value
	pending int32  // selection its last change is due at; -1 when none
}

// entry is a series' state at an emitted tick.
type entry struct {
	rs   *rseries
	bits uint64
	h    *hist.Log2
}

func (r *reading) addEvents(b []byte, n int, from, to time.Time) error {
	d := dec{b: b}
	for range n {
		rec := d.record()
		if d.err != nil {
			return d.err
		}
		if !rec.Time.Before(from) && !rec.Time.After(to) {
			r.events = append(r.events, rec)
		}
	}
	if len(d.b) != 0 {
		return fmt.Errorf("%w: trailing event bytes", errCorrupt)
	}
	return nil
}

// forget drops what the read knows of the series after a segment it could not read: the next
// one sends every series again, not only what changed.
func (r *reading) forget() {
	r.known = map[string]*rseries{}
	r.carry = nil
}

// lookup returns the read's series of a catalogue entry, nil when keep leaves it out. The key
// may be in a segment's buffer: the read keeps a copy.
func (r *reading) lookup(key string) (*rseries, error) {
	if rs := r.known[key]; rs != nil {
		return rs, nil
	}
	if !keeps(r.keep, unsafe.Slice(unsafe.StringData(key), len(key))) {
		return nil, nil
	}
	info, err := parseEntry(key, r.intern)
	if err != nil {
		return nil, err
	}
	rs := &rseries{info: info}
	r.known[strings.Clone(key)] = rs
	return rs, nil
}

// keeps says whether keep (nil: all) admits the series of catalogue entry key, reading its
// metric and cgroup in place. An entry that does not parse is admitted, for the read to report.
func keeps(keep Keep, key []byte) bool {
	if keep == nil {
		return true
	}
	d := dec{b: key}
	d.byte()
	metric := d.bytes(d.uvarint())
	cgroup := d.bytes(d.uvarint())
	return d.err != nil || keep(unsafe.String(unsafe.SliceData(cgroup), len(cgroup)), unsafe.String(unsafe.SliceData(metric), len(metric)))
}

func (r *reading) segment(g *segment) error {
	lo, _ := slices.BinarySearch(g.ticks, r.from)
	hi, found := slices.BinarySearch(g.ticks, r.to)
	if !found {
		hi--
	}
	if lo > hi {
		return nil
	}
	r.nseg++
	// Which ticks are emitted: the window's first, then each at least step after the last
	// (every one without a step). The window's last is finish's.
	r.sel = r.sel[:0]
	for i := lo; i <= hi; i++ {
		if t := g.ticks[i]; !r.started || r.step == 0 || t >= r.nextSel {
			r.sel = append(r.sel, int32(i))
			r.started, r.nextSel = true, t+r.step
		}
	}
	nsel := int32(len(r.sel))
	r.due = slices.Grow(r.due[:0], hi+1)[:hi+1]
	k := int32(0)
	for i := range r.due {
		for k < nsel && r.sel[k] < int32(i) {
			k++
		}
		r.due[i] = k
	}

	r.cols = slices.Grow(r.cols[:0], len(g.cols))[:len(g.cols)]
	for i := range g.cols {
		c := &g.cols[i]
		if c.data == nil { // left out by the journal's replay
			r.cols[i] = rcol{pending: -1}
			continue
		}
		rs, err := r.lookup(c.key)
		if err != nil {
			return err
		}
		if rs == nil { // left out: never decoded
			r.cols[i] = rcol{pending: -1}
			continue
		}
		rs.seg = r.nseg
		r.cols[i] = rcol{rs: rs, rest: c.data, first: c.first, next: c.first, pending: -1}
		if rs.carried {
			r.cols[i].pending = r.due[0]
			rs.carried = false
		}
	}
	carry := r.carry
	r.carry = nil

	// Chunks end at an emitted tick (the last one at hi).
	chunk := int32(0) // first selection of the chunk
	for start := int32(0); start <= int32(hi); {
		end, last := int32(hi), nsel-1 // last tick and selection of the chunk
		for s := chunk; s < nsel; s++ {
			if r.sel[s]-start >= chunkTicks-1 {
				end, last = r.sel[s], s
				break
			}
		}
		if last < chunk { // no selection left: the changes are carried
			last = chunk - 1
		}
		r.buckets = slices.Grow(r.buckets[:0], int(last-chunk+1))[:last-chunk+1]
		for i := range r.buckets {
			r.buckets[i] = r.buckets[i][:0]
		}
		if chunk == 0 && nsel > 0 {
			for _, rs := range carry {
				if rs.seg != r.nseg { // carried, and not in this segment
					rs.carried = false
					r.put(0, rs)
				}
			}
		}
		if err := r.chunk(g, end, chunk, last); err != nil {
			return err
		}
		for s := chunk; s <= last; s++ {
			if err := r.emit(g.ticks[r.sel[s]], r.buckets[s-chunk]); err != nil {
				return err
			}
		}
		chunk, start = last+1, end+1
	}
	for _, rs := range carry {
		if rs.seg != r.nseg && rs.carried {
			r.carry = append(r.carry, rs)
		}
	}
	for i := range r.cols {
		if col := &r.cols[i]; col.pending == nsel {
			col.rs.carried = true
			r.carry = append(r.carry, col.rs)
		}
	}
	r.lastT = g.ticks[hi]
	return nil
}

// chunk decodes every column up to tick end, filling the buckets of selections chunk..last.
func (r *reading) chunk(g *segment, end, chunk, last int32) error {
	d := dec{}
	ticks := int32(len(g.ticks))
	for c := range r.cols {
		col := &r.cols[c]
		rs := col.rs
		if rs == nil {
			continue
		}
		kind := rs.info.kind
		for col.next <= end {
			i := col.next
			due := r.due[i]
			d.b = col.rest
			if i == col.first {
				d.abs(kind, &r.tmp)
				if d.err == nil && (!rs.has || !r.tmp.equal(kind, &rs.v)) {
					r.settle(col, due, chunk)
					rs.v.set(&r.tmp)
					rs.has = true
					col.pending = due
				}
			} else {
				r.settle(col, due, chunk)
				d.change(kind, &rs.v)
				col.pending = due
			}
			col.next = ticks
			if len(d.b) > 0 {
				gap := d.uvarint()
				if gap == 0 || gap >= uint64(ticks) || i+int32(gap) >= ticks {
					d.fail("bad tick gap")
				}
				col.next = i + int32(gap)
			}
			if d.err != nil {
				return d.err
			}
			col.rest = d.b
		}
		if col.pending >= chunk && col.pending <= last {
			r.put(col.pending-chunk, rs)
			col.pending = -1
		}
	}
	return nil
}

// settle puts a column's pending change in its bucket before a change due at another
// selection replaces it: the state now is the state at that selection.
func (r *reading) settle(col *rcol, due, chunk int32) {
	if col.pending >= 0 && col.pending != due && col.pending < int32(len(r.sel)) {
		r.put(col.pending-chunk, col.rs)
		col.pending = -1
	}
}

// put adds a series' state now to a bucket of the chunk.
func (r *reading) put(b int32, rs *rseries) {
	e := entry{rs: rs, bits: rs.v.bits}
	if rs.info.kind == kindHist {
		if len(r.hist) == 0 {
			r.hist = make([]hist.Log2, 256)
		}
		e.h = &r.hist[0]
		r.hist = r.hist[1:]
		e.h.Count, e.h.SumNs = rs.v.count, rs.v.sum
		if n := len(rs.v.bkt); n > 0 {
			if cap(r.bkts)-len(r.bkts) < n {
				r.bkts = make([]uint64, 0, 4096)
			}
			l := len(r.bkts)
			r.bkts = append(r.bkts, rs.v.bkt...)
			e.h.Buckets = r.bkts[l : l+n : l+n]
		}
	}
	r.buckets[b] = append(r.buckets[b], e)
}

// emit sends the events up to t, then the states due at t.
func (r *reading) emit(t int64, states []entry) error {
	tt := time.Unix(0, t).UTC()
	if err := r.flushEvents(tt); err != nil {
		return err
	}
	for _, e := range states {
		rs := e.rs
		rec := rundir.Record{Type: rundir.TypeSample, Time: tt, Metric: rs.info.metric, Cgroup: rs.info.cgroup,
			Workload: rs.info.workload, Labels: rs.info.labels, Hist: e.h}
		if e.h == nil {
			if len(r.vals) == 0 {
				r.vals = make([]float64, 1024)
			}
			rec.Value = &r.vals[0]
			*rec.Value = math.Float64frombits(e.bits)
			r.vals = r.vals[1:]
		}
		if err := r.call(rec); err != nil {
			return err
		}
	}
	return nil
}

func (r *reading) call(rec rundir.Record) error {
	if err := r.fn(rec); err != nil {
		r.fnErr = err
		return err
	}
	return nil
}

func (r *reading) flushEvents(upTo time.Time) error {
	for ; r.ev < len(r.events) && !r.events[r.ev].Time.After(upTo); r.ev++ {
		if err := r.call(r.events[r.ev]); err != nil {
			return err
		}
	}
	return nil
}

// finish sends what changed after the last tick emitted, at the window's last tick, and the
// events left.
func (r *reading) finish() error {
	if len(r.carry) > 0 {
		r.buckets = append(r.buckets[:0], nil)
		for _, rs := range r.carry {
			rs.carried = false
			r.put(0, rs)
		}
		if err := r.emit(r.lastT, r.buckets[0]); err != nil {
			return err
		}
	}
	for ; r.ev < len(r.events); r.ev++ {
		if err := r.call(r.events[r.ev]); err != nil {
			return err
		}
	}
	return nil
}
