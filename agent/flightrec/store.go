package flightrec

import (
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"math/bits"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/nodectl/nodectl/internal/atomicfile"
	"github.com/nodectl/nodectl/rundir"
)

const (
	pinsName = "pins.json"

	// maxPendingEvents bounds the events kept for the next tick while writing fails.
	maxPendingEvents = 10000
	// sealRetry spaces the retries of a seal that failed: each compresses the whole segment.
	sealRetry = 10 * time.Second
)

// Store is the writer of a directory. Its methods are safe for concurrent use; Read does not
// hold up Append while it decodes.
//
// The writer keeps the series it follows (see catalogue) and what it has not written yet; the
// open segment's columns are in the journal, which a seal reads back a few columns at a time.
type Store struct {
	o   Options
	log *slog.Logger

	mu        sync.Mutex
	closed    bool
	dir       *os.File // held open with an exclusive flock
	jf        *os.File // the journal
	jlen      int64    // its valid length: where the next entry goes
	synced    time.Time
	unsynced  bool
	open      openSeg
	c         catalogue
	ticks     int64    // Appends staged, for coldTicks
	staged    []staged // the values not yet written, one per series
	stagedBkt []uint64 // their histograms' buckets
	pendEv    []byte   // events not yet written, encoded
	pendN     int
	pendT     [2]int64  // their earliest and latest times
	segs      []segFile // sealed, oldest first
	pins      []Pin
	pinsSaved bool
	lastTick  int64
	seals     uint64 // seals done: a journal copied across one is stale
	sealAfter int64  // a failed seal is retried from this tick on
	sealErr   error  // why it failed
	jenc      *zstd.Encoder
	st        Status

	// reused from tick to tick
	payload, part, entry, key []byte
	nPart                     int      // series defined in part
	defs, colds, changes      []int32  // the tick's new hot series, cold cgroups and changed series
	changed                   []uint64 // the changed series' columns, a bit each: they go by column
	lens                      []uint32
	cur, next                 val
}

// openSeg is what the writer keeps of the open segment besides its columns.
type openSeg struct {
	ticks      []int64 // Unix ns
	colStart   []int32 // by tick: its first column
	events     []byte  // encoded records
	nEvents    int
	minT, maxT int64 // over ticks and event times
	samples    int64
}

// staged is a series' latest value appended, which the next tick written holds.
type staged struct {
	id         int32  // the series
	b0, nb, bc uint32 // a histogram's buckets: stagedBkt[b0:b0+nb], room for bc
	bits       uint64 // a float's
	count, sum uint64
	mode       uint8 // a float's encoding, once the tick is encoded
	m          int64
}

// Open opens or creates the store in o.Dir, recovering from a crash: a torn journal tail is
// cut and reported, a damaged segment set aside. It fails when another writer holds the
// directory.
func Open(o Options) (*Store, error) {
	o = o.withDefaults()
	if o.Dir == "" {
		return nil, errors.New("flightrec: no directory")
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("flightrec: %w", err)
	}
	dir, err := lockDir(o.Dir)
	if err != nil {
		return nil, err
	}
	s := &Store{o: o, log: o.Log, dir: dir, c: newCatalogue(), pinsSaved: true}
	s.st.Dir, s.st.Writable = o.Dir, true
	if err := s.recover(); err != nil {
		s.closeFiles()
		return nil, fmt.Errorf("flightrec: %s: %w", o.Dir, err)
	}
	s.jenc, err = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1),
		zstd.WithEncoderCRC(false), zstd.WithWindowSize(partBytes), zstd.WithLowerEncoderMem(true))
	if err != nil {
		s.closeFiles()
		return nil, err
	}
	s.synced = o.Now()
	s.retain(0)
	return s, nil
}

// recover reads the directory as a crash left it.
func (s *Store) recover() error {
	l, err := listDir(s.o.Dir)
	if err != nil {
		return err
	}
	for _, t := range l.tmps { // a seal or pins save a crash interrupted
		os.Remove(filepath.Join(s.o.Dir, t))
	}
	for _, d := range l.damaged {
		if !errors.Is(d.err, errCorrupt) {
			return d.err
		}
		s.setAsideLocked(d.path, d.err)
	}
	s.segs = l.segs
	s.st.Corrupt = append(s.st.Corrupt, l.corrupt...)
	if err := s.loadPins(); err != nil {
		return err
	}

	s.jf, err = os.OpenFile(filepath.Join(s.o.Dir, journalName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	b, err := io.ReadAll(s.jf)
	if err != nil {
		return err
	}
	g := &segment{}
	good, cut := replay(b, g, nil)
	if n := len(s.segs); len(g.ticks) > 0 && n > 0 && g.ticks[0] <= s.segs[n-1].h.last {
		// A crash came between sealing the journal and emptying it.
		g, good, cut = &segment{}, 0, nil
	} else if cut != nil {
		s.st.TornBytes = int64(len(b) - good)
		s.log.Warn("flight recorder: cut the journal's torn tail", "dir", s.o.Dir, "bytes", s.st.TornBytes, "ticks kept", len(g.ticks), "why", cut)
	}
	b = nil
	if err := s.follow(g); err != nil {
		// The checksums passed but the columns do not decode: keep the file for a look and
		// start afresh rather than build on it.
		s.log.Error("flight recorder: journal does not decode, set aside", "dir", s.o.Dir, "err", err)
		if err := os.Rename(s.jf.Name(), s.jf.Name()+badSuffix); err != nil {
			return err
		}
		s.st.Corrupt = append(s.st.Corrupt, journalName+badSuffix)
		s.jf.Close()
		s.open, s.c, good = openSeg{}, newCatalogue(), 0
		if s.jf, err = os.OpenFile(filepath.Join(s.o.Dir, journalName), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600); err != nil {
			return err
		}
	}
	if good < journalHeader {
		if _, err := s.jf.WriteAt(journalMagic[:], 0); err != nil {
			return err
		}
		good = journalHeader
	}
	if fi, err := s.jf.Stat(); err != nil {
		return err
	} else if fi.Size() != int64(good) {
		if err := s.jf.Truncate(int64(good)); err != nil {
			return err
		}
	}
	s.jlen = int64(good)
	if n := len(s.segs); n > 0 {
		s.lastTick = s.segs[n-1].h.last
	}
	if n := len(s.open.ticks); n > 0 {
		s.lastTick = s.open.ticks[n-1]
	}
	return nil
}

// follow makes the writer's series those of the replayed journal g, with their last values.
func (s *Store) follow(g *segment) error {
	c := &s.c
	var v val
	for i := range g.cols {
		col := &g.cols[i]
		key, split, cgroup, workload, err := splitEntry(s.key[:0], col.key)
		if err != nil {
			return err
		}
		s.key = key
		cg, scratch := c.cgroup(cgroup, workload, s.part)
		s.part = scratch
		sh := c.shape(key, split)
		if c.find(cg, sh) >= 0 {
			return fmt.Errorf("%w: column %d repeats a series", errCorrupt, i)
		}
		id := c.add(cg, sh)
		ws := c.series(id)
		ws.col, ws.clen, ws.clast, ws.seen = int32(i), uint32(len(col.data)), col.last, g.ticks[col.last]
		d := dec{b: col.data}
		d.abs(key[0], &v)
		for len(d.b) > 0 && d.err == nil {
			d.uvarint()
			d.change(key[0], &v)
		}
		if d.err != nil {
			return d.err
		}
		c.setValue(ws, &v)
		c.cols = append(c.cols, id)
		c.cgs[cg].seen = max(c.cgs[cg].seen, ws.seen)
	}
	o := &s.open
	o.ticks, o.events, o.nEvents, o.minT, o.maxT, o.samples = g.ticks, g.events, g.nEvents, g.minT, g.maxT, g.samples
	i := 0
	for t := range g.ticks {
		for i < len(g.cols) && g.cols[i].first < int32(t) {
			i++
		}
		o.colStart = append(o.colStart, int32(i))
	}
	if len(g.ticks) > 0 {
		c.seg = g.ticks[0]
	}
	return nil
}

// Append writes one tick: its samples take the time t, events and phases keep their own.
// The appender may send only what changed since the last tick: a series keeps its value until
// it changes. When the tick cannot be written (disk full, read-only) Append returns the error
// and counts the tick lost; the values it carried go with the next tick written, and the Store
// keeps working.
func (s *Store) Append(t time.Time, recs []rundir.Record) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if t.Before(time.Unix(0, 1)) || t.After(time.Unix(0, math.MaxInt64)) {
		return fmt.Errorf("flightrec: tick %v out of range", t)
	}
	tn := t.UnixNano()
	if tn <= s.lastTick {
		return fmt.Errorf("flightrec: tick %v is not after the last one, %v", t.UTC(), time.Unix(0, s.lastTick).UTC())
	}
	if err := s.stage(tn, recs); err != nil {
		return err
	}
	if len(s.open.ticks) > 0 && tn/int64(s.o.SegmentSpan) != s.open.ticks[0]/int64(s.o.SegmentSpan) {
		if tn < s.sealAfter {
			s.st.LostTicks++
			return fmt.Errorf("flightrec: tick %v not written: sealing the last segment failed, retrying from %v: %w",
				t.UTC(), time.Unix(0, s.sealAfter).UTC(), s.sealErr)
		}
		if err := s.seal(); err != nil {
			s.sealAfter, s.sealErr = tn+int64(sealRetry), err
			s.st.LostTicks++
			return s.failed("seal segment", err)
		}
	}
	if err := s.writeTick(tn); err != nil {
		s.st.LostTicks++
		return s.failed("write journal", err)
	}
	if !s.st.Writable {
		s.log.Info("flight recorder writing again", "dir", s.o.Dir, "lost ticks", s.st.LostTicks)
		s.st.Writable = true
	}
	if now := s.o.Now(); now.Sub(s.synced) >= s.o.SyncEvery {
		s.synced = now
		s.unsynced = false
		if err := s.jf.Sync(); err != nil {
			s.failed("sync journal", err) // the tick is written; a power cut may lose it
		}
	}
	if !s.pinsSaved {
		s.savePins()
	}
	if s.bytes() > s.o.MaxBytes { // the journal grew past it
		s.retain(0)
	}
	return nil
}

// stage checks the tick and takes its values and events as the next to write.
func (s *Store) stage(tn int64, recs []rundir.Record) error {
	for i := range recs {
		r := &recs[i]
		if r.Type == rundir.TypeSample && (r.Value == nil) == (r.Hist == nil) {
			return fmt.Errorf("flightrec: record %d (%s %s): a sample holds a value or a histogram", i, r.Metric, r.Cgroup)
		}
		if r.Hist != nil && len(r.Hist.Buckets) > maxBuckets {
			return fmt.Errorf("flightrec: record %d (%s %s): %d buckets, at most %d", i, r.Metric, r.Cgroup, len(r.Hist.Buckets), maxBuckets)
		}
	}
	s.ticks++
	c := &s.c
	for i := range recs {
		r := &recs[i]
		if r.Type != rundir.TypeSample {
			if s.pendN >= maxPendingEvents {
				s.st.LostEvents++
				continue
			}
			rt := clampNanos(r.Time)
			if s.pendN == 0 {
				s.pendT = [2]int64{rt, rt}
			}
			s.pendT = [2]int64{min(s.pendT[0], rt), max(s.pendT[1], rt)}
			s.pendEv = appendRecord(s.pendEv, r)
			s.pendN++
			continue
		}
		s.st.Samples++
		kind := kindFloat
		if r.Hist != nil {
			kind = kindHist
		}
		var cg int32
		cg, s.part = c.cgroup(r.Cgroup, r.Workload, s.part)
		c.cgs[cg].seen, c.cgs[cg].tick = tn, uint32(s.ticks)
		var id int32
		id, s.key = c.seriesOf(cg, kind, r, s.key)
		ws := c.series(id)
		ws.seen = tn
		if kind == kindFloat {
			bits := math.Float64bits(*r.Value)
			if ws.stage < 0 && ws.known && c.value(ws, &s.cur).bits == bits {
				continue
			}
			s.stageOf(ws, id).bits = bits
			continue
		}
		h := r.Hist
		if ws.stage < 0 && ws.known && histEqual(c.hists[ws.m], h) {
			continue
		}
		st := s.stageOf(ws, id)
		st.count, st.sum, st.nb = h.Count, h.SumNs, uint32(len(h.Buckets))
		if st.nb > st.bc {
			st.b0, st.bc = uint32(len(s.stagedBkt)), st.nb
			s.stagedBkt = append(s.stagedBkt, h.Buckets...)
		} else {
			copy(s.stagedBkt[st.b0:], h.Buckets)
		}
	}
	return nil
}

// stageOf returns the staged value of series id.
func (s *Store) stageOf(ws *wseries, id int32) *staged {
	if ws.stage < 0 {
		ws.stage = int32(len(s.staged))
		s.staged = append(s.staged, staged{id: id})
	}
	return &s.staged[ws.stage]
}

// nextVal returns a series' staged value.
func (s *Store) nextVal(ws *wseries, v *val) *val {
	st := &s.staged[ws.stage]
	if s.c.kind(ws) == kindFloat {
		v.bits, v.mode, v.m = st.bits, st.mode, st.m
	} else {
		v.count, v.sum, v.bkt = st.count, st.sum, s.stagedBkt[st.b0:st.b0+st.nb]
	}
	return v
}

// writeTick writes tick tn to the journal: its index in the segment and time, the new series
// (catalogue entry and value in full), the changes of the others by column, and the events.
// The first tick of a segment defines every series followed, so that a segment reads on its
// own. A tick with many new series is written as several entries (partBytes each), changes
// and events in the last. Once written, it is the writer's state.
func (s *Store) writeTick(tn int64) error {
	idx := len(s.open.ticks)
	c := &s.c
	s.defs, s.colds, s.changes, s.lens = s.defs[:0], s.colds[:0], s.changes[:0], s.lens[:0]
	if idx == 0 {
		s.defs, s.colds, s.key = c.carry(tn-int64(s.o.SeriesIdle), s.defs, s.colds, s.key)
	}
	for i := range s.staged {
		id := s.staged[i].id
		ws := c.series(id)
		switch {
		case idx == 0: // carried
		case ws.col < 0:
			s.defs = append(s.defs, id)
		case !c.value(ws, &s.cur).equal(c.kind(ws), s.nextVal(ws, &s.next)):
			if w := int(ws.col) / 64; w >= len(s.changed) {
				s.changed = append(s.changed, make([]uint64, w+1-len(s.changed))...)
			}
			s.changed[ws.col/64] |= 1 << (ws.col % 64)
		}
	}
	for w, set := range s.changed {
		for ; set != 0; set &= set - 1 {
			s.changes = append(s.changes, c.cols[w*64+bits.TrailingZeros64(set)])
		}
	}
	clear(s.changed)

	start := s.jlen
	err := s.writeDefs(idx, tn)
	if err == nil {
		err = s.writePart(idx, tn, true)
	}
	if err != nil {
		s.jlen = start
		s.jf.Truncate(start) // best effort: if it fails, replay still stops at the partial tick
		return err
	}
	s.commit(idx, tn)
	return nil
}

// writeDefs writes the tick's new series to the journal, but for the last entry's.
func (s *Store) writeDefs(idx int, tn int64) error {
	c := &s.c
	n := len(s.defs)
	for _, cg := range s.colds {
		n += int(c.cgs[cg].n)
	}
	s.part, s.nPart = slices.Grow(s.part[:0], min(partBytes, n*256)+4096), 0
	s.lens = slices.Grow(s.lens, len(s.defs))
	for _, id := range s.defs {
		ws := c.series(id)
		s.part = appendEntry(s.part, &c.shapes[ws.shape], &c.cgs[ws.cg])
		v0 := len(s.part)
		if ws.stage < 0 {
			s.part = c.appendValue(s.part, ws)
		} else {
			v := s.nextVal(ws, &s.next)
			if c.kind(ws) == kindFloat {
				prefer := uint8(modeRaw)
				if ws.known {
					prefer = ws.mode
				}
				st := &s.staged[ws.stage]
				st.mode, st.m = represent(math.Float64frombits(v.bits), prefer)
				v.mode, v.m = st.mode, st.m
			}
			s.part = appendAbs(s.part, c.kind(ws), v)
		}
		s.lens = append(s.lens, uint32(len(s.part)-v0))
		if err := s.defined(idx, tn); err != nil {
			return err
		}
	}
	for _, cg := range s.colds {
		it := c.coldSeries(cg)
		for it.next() {
			s.part = appendEntry(s.part, &c.shapes[it.cur.shape], &c.cgs[cg])
			s.part = append(s.part, it.cur.val...)
			if err := s.defined(idx, tn); err != nil {
				return err
			}
		}
	}
	return nil
}

// defined counts a series defined in s.part, writing it out when full.
func (s *Store) defined(idx int, tn int64) error {
	s.nPart++
	if len(s.part) < partBytes {
		return nil
	}
	return s.writePart(idx, tn, false)
}

// writePart writes the series defined in s.part as an entry of tick idx; the last entry
// holds the changes and the events too.
func (s *Store) writePart(idx int, tn int64, last bool) error {
	b := slices.Grow(s.payload[:0], len(s.part)+32)
	if last {
		b = slices.Grow(b, len(s.part)+32+len(s.pendEv)+8*len(s.changes))
	}
	b = binary.AppendUvarint(b, uint64(idx))
	b = binary.AppendVarint(b, tn)
	b = binary.AppendUvarint(b, uint64(s.nPart))
	b = append(b, s.part...)
	s.part, s.nPart = s.part[:0], 0
	if !last {
		b = append(b, 0, 0) // no changes, no events
	} else {
		b = s.appendChanges(b)
		b = binary.AppendUvarint(b, uint64(s.pendN))
		b = append(b, s.pendEv...)
	}
	s.payload = b
	return s.writeEntry(b, !last)
}

// appendChanges appends the changes of the tick: the column gap from the previous change, and
// the change.
func (s *Store) appendChanges(b []byte) []byte {
	c := &s.c
	b = binary.AppendUvarint(b, uint64(len(s.changes)))
	prev := int32(-1)
	for _, id := range s.changes {
		ws := c.series(id)
		b = binary.AppendUvarint(b, uint64(ws.col-prev-1))
		prev = ws.col
		n := len(b)
		cur, next := c.value(ws, &s.cur), s.nextVal(ws, &s.next)
		if c.kind(ws) == kindFloat {
			b = appendFloatChange(b, cur, next)
			st := &s.staged[ws.stage]
			st.mode, st.m = next.mode, next.m
		} else {
			b = appendHistChange(b, cur, next)
		}
		s.lens = append(s.lens, uint32(len(b)-n))
	}
	return b
}

// writeEntry appends an entry to the journal. When the disk is full, retention frees space
// and the write is tried once more.
func (s *Store) writeEntry(payload []byte, more bool) error {
	s.entry = frameEntry(slices.Grow(s.entry[:0], len(payload)+32), payload, s.jenc, more)
	if len(s.entry) > maxEntry+entryHeader {
		return fmt.Errorf("tick of %d bytes, beyond %d", len(s.entry), maxEntry)
	}
	for try := 0; ; try++ {
		_, err := s.jf.WriteAt(s.entry, s.jlen)
		if err == nil {
			s.jlen += int64(len(s.entry))
			s.unsynced = true
			return nil
		}
		if try > 0 || !noSpace(err) || s.retain(int64(len(s.entry))) == 0 {
			return err
		}
	}
}

// commit makes the tick written the writer's state.
func (s *Store) commit(idx int, tn int64) {
	c, o := &s.c, &s.open
	base := int32(len(c.cols))
	if idx == 0 {
		c.seg, o.minT, o.maxT = tn, tn, tn
	}
	o.colStart = append(o.colStart, base)
	for i, id := range s.defs {
		ws := c.series(id)
		ws.col, ws.clen, ws.clast = base+int32(i), s.lens[i], int32(idx)
		c.cols = append(c.cols, id)
		if ws.stage >= 0 {
			c.setValue(ws, s.nextVal(ws, &s.next))
		}
	}
	for _, cg := range s.colds {
		g := &c.cgs[cg]
		g.inSeg, g.col0 = tn, int32(len(c.cols))
		for range g.n {
			c.cols = append(c.cols, ^cg)
		}
	}
	for j, id := range s.changes {
		ws := c.series(id)
		ws.clen += uint32(uvarintLen(uint64(int32(idx)-ws.clast))) + s.lens[len(s.defs)+j]
		ws.clast = int32(idx)
		c.setValue(ws, s.nextVal(ws, &s.next))
	}
	for i := range s.staged {
		c.series(s.staged[i].id).stage = -1
	}
	o.ticks = append(o.ticks, tn)
	o.samples += int64(len(c.cols))
	if s.pendN > 0 {
		o.events = append(o.events, s.pendEv...)
		o.nEvents += s.pendN
		o.minT, o.maxT = min(o.minT, s.pendT[0]), max(o.maxT, s.pendT[1])
	}
	o.maxT = max(o.maxT, tn)
	s.lastTick = tn
	s.st.Ticks++

	// Buffers a burst grew (a segment's first tick, many new series) go back to the collector.
	s.staged, s.stagedBkt = shrink(s.staged), shrink(s.stagedBkt)
	s.defs, s.colds, s.changes, s.lens = shrink(s.defs), shrink(s.colds), shrink(s.changes), shrink(s.lens)
	s.pendEv, s.pendN = shrink(s.pendEv), 0
	s.payload, s.entry = shrink(s.payload), shrink(s.entry)

	for cg := range int32(len(c.cgs)) {
		if g := &c.cgs[cg]; g.n > 0 && g.cold == nil && uint32(s.ticks)-g.tick >= coldTicks {
			s.key = c.freeze(cg, s.key)
		}
	}
	if idx == 0 {
		c.compact()
	}
}

// shrink empties b, dropping its array when it is much larger than what b held.
func shrink[T any](b []T) []T {
	if cap(b) > 4096 && cap(b) > 4*len(b) {
		return nil
	}
	return b[:0]
}

func uvarintLen(u uint64) int { return (bits.Len64(u|1) + 6) / 7 }

// seal writes the open segment to its file and empties the journal.
func (s *Store) seal() error {
	sf, err := s.writeSegment()
	// The segment takes about what the journal does.
	if err != nil && noSpace(err) && s.retain(s.jlen) > 0 {
		sf, err = s.writeSegment()
	}
	if err != nil {
		return err
	}
	s.segs = append(s.segs, sf)
	o := &s.open
	*o = openSeg{ticks: shrink(o.ticks), colStart: shrink(o.colStart), events: shrink(o.events)}
	c := &s.c
	for _, id := range c.cols {
		if id >= 0 {
			c.series(id).col = -1
		}
	}
	c.cols, c.seg = shrink(c.cols), 0
	// If this fails, the next tick overwrites the journal from its start anyway, and replay
	// stops at the first older tick after it.
	if err := s.jf.Truncate(journalHeader); err != nil {
		s.failed("empty journal", err)
	}
	s.jlen = journalHeader
	s.seals++
	s.retain(0)
	return nil
}

// retain removes segments, oldest first, while the store is over MaxBytes, while they are
// older than MaxAge, and until need bytes are freed; pinned ones stay. It returns the bytes
// freed.
func (s *Store) retain(need int64) int64 {
	total := s.bytes()
	cutoff := s.o.Now().Add(-s.o.MaxAge).UnixNano()
	var freed int64
	kept := s.segs[:0]
	for _, f := range s.segs {
		if (total > s.o.MaxBytes || f.h.last < cutoff || freed < need) && !s.pinned(f) {
			err := os.Remove(f.path)
			if err == nil || errors.Is(err, fs.ErrNotExist) {
				total -= f.size
				freed += f.size
				s.st.Evicted++
				continue
			}
			s.log.Warn("flight recorder: cannot remove an old segment", "path", f.path, "err", err)
		}
		kept = append(kept, f)
	}
	clear(s.segs[len(kept):])
	s.segs = kept
	return freed
}

func (s *Store) bytes() int64 {
	n := s.jlen
	for _, f := range s.segs {
		n += f.size
	}
	return n
}

func (s *Store) pinned(f segFile) bool {
	for _, p := range s.pins {
		if clampNanos(p.From) <= f.h.maxT && clampNanos(p.To) >= f.h.minT {
			return true
		}
	}
	return false
}

// failed records a failed write and returns it.
func (s *Store) failed(op string, err error) error {
	s.st.WriteFailures++
	s.st.LastError = op + ": " + err.Error()
	s.st.LastErrorTime = s.o.Now()
	if s.st.Writable {
		s.log.Warn("flight recorder cannot write", "dir", s.o.Dir, "op", op, "err", err)
	}
	s.st.Writable = false
	return fmt.Errorf("flightrec: %s: %w", op, err)
}

func noSpace(err error) bool { return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) }

// Pin keeps the segments overlapping [from, to] from retention, under id (replacing a pin of
// the same id). Pins are saved in the directory. When saving fails, the pin holds in this
// process and saving is retried after the next tick written.
func (s *Store) Pin(id string, from, to time.Time) error {
	if id == "" || to.Before(from) {
		return fmt.Errorf("flightrec: bad pin %q [%v, %v]", id, from, to)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	p := Pin{ID: id, From: from.UTC(), To: to.UTC()}
	if i := slices.IndexFunc(s.pins, func(p Pin) bool { return p.ID == id }); i >= 0 {
		s.pins[i] = p
	} else {
		s.pins = append(s.pins, p)
		slices.SortFunc(s.pins, func(a, b Pin) int { return cmp.Compare(a.ID, b.ID) })
	}
	return s.savePins()
}

// Unpin removes a pin; retention may then remove what it kept.
func (s *Store) Unpin(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	i := slices.IndexFunc(s.pins, func(p Pin) bool { return p.ID == id })
	if i < 0 {
		return fmt.Errorf("flightrec: no pin %q", id)
	}
	s.pins = slices.Delete(s.pins, i, i+1)
	err := s.savePins()
	s.retain(0)
	return err
}

// savePins replaces pins.json atomically.
func (s *Store) savePins() error {
	b, err := json.MarshalIndent(s.pins, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(s.o.Dir, pinsName)
	err = atomicfile.Write(path, append(b, '\n'), 0o600)
	s.pinsSaved = err == nil
	if err != nil {
		return s.failed("save pins", err)
	}
	return nil
}

func (s *Store) loadPins() error {
	path := filepath.Join(s.o.Dir, pinsName)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, &s.pins); err != nil {
		// pins.json is replaced atomically, so this is damage, not a crash: say so loudly
		// and keep the file for a look.
		s.pins = nil
		s.log.Error("flight recorder: pins do not parse, set aside", "path", path, "err", err)
		if err := os.Rename(path, path+badSuffix); err != nil {
			return err
		}
		s.st.Corrupt = append(s.st.Corrupt, pinsName+badSuffix)
	}
	return nil
}

// setAside renames a damaged segment out of the way and reports it.
func (s *Store) setAside(f segFile, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i := slices.IndexFunc(s.segs, func(g segFile) bool { return g.path == f.path }); i >= 0 {
		s.segs = slices.Delete(s.segs, i, i+1)
		s.setAsideLocked(f.path, err)
	}
}

func (s *Store) setAsideLocked(path string, err error) {
	s.log.Error("flight recorder: damaged segment set aside", "path", path, "err", err)
	if rerr := os.Rename(path, path+badSuffix); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
		s.log.Error("flight recorder: cannot set a damaged segment aside", "path", path, "err", rerr)
	}
	s.st.Corrupt = append(s.st.Corrupt, filepath.Base(path)+badSuffix)
}

// Read calls fn with the records of [from, to] in time order: for every series alive in the
// window its state at the first tick at or after from, then its value at each later tick up
// to to where it changed; with step > 0, only at ticks at least step apart (and always the
// last tick up to to), each series carrying its state there. Events and phases come with
// their own time. Records share their Labels map with the others of their series: fn must
// not change it. A damaged segment is set aside and skipped.
func (s *Store) Read(from, to time.Time, step time.Duration, fn func(rundir.Record) error) error {
	return s.ReadSeries(from, to, step, nil, fn)
}

// Keep says whether a read wants the series of a cgroup ("" for the node's) and metric. The
// strings are the reader's: valid during the call only.
type Keep func(cgroup, metric string) bool

// ReadSeries is Read of the series keep admits (nil: all); events come whatever it says. The
// others are skipped undecoded, so a read of a few cgroups' series costs what they hold,
// whatever the node's churn left in the window.
func (s *Store) ReadSeries(from, to time.Time, step time.Duration, keep Keep, fn func(rundir.Record) error) error {
	v, err := s.view(from, to, keep)
	if err != nil {
		return err
	}
	return v.read(from, to, step, keep, fn, s.setAside)
}

// view is what a read of [from, to] needs: the sealed segments and, when it holds ticks of
// the window, the open segment decoded from the journal (its series keep admits). The journal is copied outside the
// store's lock, so a long copy does not hold up Append: only a seal rewrites the bytes below
// the journal's length, and a copy a seal overlapped is taken again (the segments then hold
// what the journal did).
func (s *Store) view(from, to time.Time, keep Keep) (*view, error) {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, ErrClosed
		}
		v := &view{segs: slices.Clone(s.segs)}
		o, jf, jlen, seals := &s.open, s.jf, s.jlen, s.seals
		inWindow := len(o.ticks) > 0 && o.maxT >= clampNanos(from) && o.minT <= clampNanos(to)
		s.mu.Unlock()
		if !inWindow {
			return v, nil
		}
		if beforeJournalCopy != nil {
			beforeJournalCopy()
		}
		journal := make([]byte, jlen)
		_, err := jf.ReadAt(journal, 0)
		s.mu.Lock()
		closed, sealed := s.closed, s.seals != seals
		s.mu.Unlock()
		switch {
		case closed:
			return nil, ErrClosed
		case sealed:
			continue
		case err != nil:
			return nil, fmt.Errorf("flightrec: read journal: %w", err)
		}
		g := &segment{}
		if good, cut := replay(journal, g, keep); cut != nil || good != len(journal) {
			return nil, fmt.Errorf("flightrec: journal does not decode: %v", cut)
		}
		v.open = g
		return v, nil
	}
}

// beforeJournalCopy, when set (by tests), runs after a read has taken the journal's length
// and before it copies the journal.
var beforeJournalCopy func()

// Status says what the store holds and how writing goes.
func (s *Store) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.st
	st.Corrupt = slices.Clone(s.st.Corrupt)
	st.Pins = slices.Clone(s.pins)
	st.Segments = len(s.segs)
	st.JournalBytes = s.jlen
	st.Bytes = s.bytes()
	st.Series = s.c.n
	st.StoredSamples = s.open.samples
	for _, f := range s.segs {
		st.StoredSamples += int64(f.h.samples)
		if s.pinned(f) {
			st.PinnedBytes += f.size
		}
	}
	if len(s.segs) > 0 {
		st.Oldest = time.Unix(0, s.segs[0].h.first).UTC()
	} else if len(s.open.ticks) > 0 {
		st.Oldest = time.Unix(0, s.open.ticks[0]).UTC()
	}
	if s.lastTick > 0 {
		st.Newest = time.Unix(0, s.lastTick).UTC()
	}
	return st
}

// Close syncs the journal and releases the directory. The journal is not sealed: the next
// Open continues it.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	var err error
	if s.unsynced {
		err = s.jf.Sync()
	}
	if cerr := s.closeFiles(); err == nil {
		err = cerr
	}
	return err
}

func (s *Store) closeFiles() error {
	var err error
	if s.jf != nil {
		err = s.jf.Close()
	}
	if s.jenc != nil {
		s.jenc.Close()
	}
	if derr := s.dir.Close(); err == nil { // releases the flock
		err = derr
	}
	return err
}
