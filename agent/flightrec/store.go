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
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/klauspost/compress/zstd"
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
	open      *segment // what the journal holds
	series    map[string]*wseries
	cat       []*wseries // the open segment's series by column; the last one's after a seal
	dirty     []*wseries // series with a value not yet written
	pendEv    []byte     // events not yet written, encoded
	pendN     int
	segs      []segFile // sealed, oldest first
	pins      []Pin
	pinsSaved bool
	lastTick  int64
	sealAfter int64 // a failed seal is retried from this tick on
	sealErr   error // why it failed
	jenc      *zstd.Encoder
	st        Status

	// reused from tick to tick
	payload, entry, key []byte
	defs, changes       []*wseries
}

// wseries is a series as the writer follows it.
type wseries struct {
	key   string // catalogue entry
	kind  byte
	id    int32 // column in the open segment, -1 when not in it
	seen  int64 // tick of its last sample
	known bool  // cur was written
	dirty bool  // next is to be written
	cur   val   // as written
	next  val   // as last appended
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
	s := &Store{o: o, log: o.Log, dir: dir, series: map[string]*wseries{}, open: &segment{}, pinsSaved: true}
	s.st.Dir, s.st.Writable = o.Dir, true
	if err := s.recover(); err != nil {
		s.closeFiles()
		return nil, fmt.Errorf("flightrec: %s: %w", o.Dir, err)
	}
	s.jenc, err = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1),
		zstd.WithEncoderCRC(false), zstd.WithWindowSize(1<<20), zstd.WithLowerEncoderMem(true))
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
	good, cut := replay(b, s.open)
	if n := len(s.segs); len(s.open.ticks) > 0 && n > 0 && s.open.ticks[0] <= s.segs[n-1].h.last {
		// A crash came between sealing the journal and emptying it.
		s.open, good, cut = &segment{}, 0, nil
	} else if cut != nil {
		s.st.TornBytes = int64(len(b) - good)
		s.log.Warn("flight recorder: cut the journal's torn tail", "dir", s.o.Dir, "bytes", s.st.TornBytes, "ticks kept", len(s.open.ticks), "why", cut)
	}
	if err := s.follow(); err != nil {
		// The checksums passed but the columns do not decode: keep the file for a look and
		// start afresh rather than build on it.
		s.log.Error("flight recorder: journal does not decode, set aside", "dir", s.o.Dir, "err", err)
		if err := os.Rename(s.jf.Name(), s.jf.Name()+badSuffix); err != nil {
			return err
		}
		s.st.Corrupt = append(s.st.Corrupt, journalName+badSuffix)
		s.jf.Close()
		s.open, s.series, good = &segment{}, map[string]*wseries{}, 0
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
	if good != len(b) {
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

// follow makes the writer's series those of the replayed journal, with their last values.
func (s *Store) follow() error {
	for i := range s.open.cols {
		c := &s.open.cols[i]
		ws := &wseries{key: c.key, kind: c.key[0], id: int32(i), seen: s.open.ticks[c.last], known: true}
		d := dec{b: c.data}
		d.abs(ws.kind, &ws.cur)
		for len(d.b) > 0 && d.err == nil {
			d.uvarint()
			d.change(ws.kind, &ws.cur)
		}
		if d.err != nil {
			return d.err
		}
		s.series[c.key] = ws
		s.cat = append(s.cat, ws)
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
	payload := s.encodeTick(tn)
	if err := s.writeEntry(payload); err != nil {
		s.st.LostTicks++
		return s.failed("write journal", err)
	}
	if err := s.commit(payload, tn); err != nil {
		return fmt.Errorf("flightrec: %w", err)
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
	for i := range recs {
		r := &recs[i]
		if r.Type != rundir.TypeSample {
			if s.pendN >= maxPendingEvents {
				s.st.LostEvents++
				continue
			}
			s.pendEv = appendRecord(s.pendEv, r)
			s.pendN++
			continue
		}
		s.st.Samples++
		kind := kindFloat
		if r.Hist != nil {
			kind = kindHist
		}
		s.key = appendEntry(s.key[:0], kind, r)
		ws := s.series[string(s.key)]
		if ws == nil {
			ws = &wseries{key: string(s.key), kind: kind, id: -1}
			s.series[ws.key] = ws
		}
		ws.seen = tn
		if kind == kindFloat {
			bits := math.Float64bits(*r.Value)
			if !ws.dirty && ws.known && bits == ws.cur.bits {
				continue
			}
			ws.next.bits = bits
		} else {
			h := r.Hist
			if !ws.dirty && ws.known && h.Count == ws.cur.count && h.SumNs == ws.cur.sum && slices.Equal(h.Buckets, ws.cur.bkt) {
				continue
			}
			ws.next.setHist(h)
		}
		if !ws.dirty {
			ws.dirty = true
			s.dirty = append(s.dirty, ws)
		}
	}
	return nil
}

// encodeTick makes the journal payload of tick tn: its index in the segment and time, the new
// series (catalogue entry and value in full), the changes of the others by column, and the
// events. The first tick of a segment defines every series alive, so that a segment reads on
// its own: the last segment's in their order, less those idle for SeriesIdle, then the new.
func (s *Store) encodeTick(tn int64) []byte {
	idx := len(s.open.ticks)
	s.defs, s.changes = s.defs[:0], s.changes[:0]
	if idx == 0 {
		for _, ws := range s.cat {
			if !ws.dirty && ws.seen < tn-int64(s.o.SeriesIdle) {
				delete(s.series, ws.key)
				continue
			}
			s.defs = append(s.defs, ws)
		}
	}
	for _, ws := range s.dirty {
		switch {
		case idx == 0 && ws.known: // in s.cat
		case ws.id < 0:
			s.defs = append(s.defs, ws)
		case !ws.next.equal(ws.kind, &ws.cur):
			s.changes = append(s.changes, ws)
		}
	}
	slices.SortFunc(s.changes, func(a, b *wseries) int { return cmp.Compare(a.id, b.id) })
	b := binary.AppendUvarint(s.payload[:0], uint64(idx))
	b = binary.AppendVarint(b, tn)
	b = binary.AppendUvarint(b, uint64(len(s.defs)))
	for _, ws := range s.defs {
		b = append(b, ws.key...)
		v := &ws.cur
		if ws.dirty {
			v = &ws.next
			if ws.kind == kindFloat {
				prefer := uint8(modeRaw)
				if ws.known {
					prefer = ws.cur.mode
				}
				v.mode, v.m = represent(math.Float64frombits(v.bits), prefer)
			}
		}
		b = appendAbs(b, ws.kind, v)
	}
	b = binary.AppendUvarint(b, uint64(len(s.changes)))
	prev := int32(-1)
	for _, ws := range s.changes {
		b = binary.AppendUvarint(b, uint64(ws.id-prev-1))
		prev = ws.id
		if ws.kind == kindFloat {
			b = appendFloatChange(b, &ws.cur, &ws.next)
		} else {
			b = appendHistChange(b, &ws.cur, &ws.next)
		}
	}
	b = binary.AppendUvarint(b, uint64(s.pendN))
	b = append(b, s.pendEv...)
	s.payload = b
	return b
}

// writeEntry appends a tick to the journal. A failed write is cut off again so that the next
// tick follows the last whole one; when the disk is full, retention frees space and the
// write is tried once more.
func (s *Store) writeEntry(payload []byte) error {
	s.entry = frameEntry(s.entry[:0], payload, s.jenc)
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
		s.jf.Truncate(s.jlen) // best effort: if it fails, replay still stops at the partial entry
		if try > 0 || !noSpace(err) || s.retain(int64(len(s.entry))) == 0 {
			return err
		}
	}
}

// commit makes the written tick the writer's state.
func (s *Store) commit(payload []byte, tn int64) error {
	base := int32(len(s.open.cols))
	// No checking pass: the tick was made by encodeTick.
	if err := s.open.applyTick(payload, true); err != nil {
		return fmt.Errorf("journal tick does not decode (a bug): %w", err)
	}
	if base == 0 {
		clear(s.cat)
		s.cat = s.cat[:0]
	}
	s.cat = append(s.cat, s.defs...)
	for i, ws := range s.defs {
		ws.id = base + int32(i)
		s.open.cols[ws.id].key = ws.key // one copy of the string, not two
		if ws.dirty {
			ws.cur.set(&ws.next)
		}
		ws.known = true
	}
	for _, ws := range s.changes {
		ws.cur.set(&ws.next)
	}
	for _, ws := range s.dirty {
		ws.dirty = false
	}
	s.dirty = s.dirty[:0]
	s.pendEv, s.pendN = s.pendEv[:0], 0
	s.lastTick = tn
	s.st.Ticks++
	if cap(s.payload) > 1<<20 { // a segment's first tick, which defines every series: rare
		s.payload, s.entry = nil, nil
	}
	return nil
}

// seal writes the open segment to its file and empties the journal.
func (s *Store) seal() error {
	sf, err := writeSegment(s.o.Dir, s.open)
	if err != nil && noSpace(err) {
		var raw int64
		for i := range s.open.cols {
			raw += int64(len(s.open.cols[i].data))
		}
		if s.retain(raw/2+int64(len(s.open.events))) > 0 {
			sf, err = writeSegment(s.o.Dir, s.open)
		}
	}
	if err != nil {
		return err
	}
	s.segs = append(s.segs, sf)
	s.open = &segment{}
	for _, ws := range s.series {
		ws.id = -1
	}
	// If this fails, the next tick overwrites the journal from its start anyway, and replay
	// stops at the first older tick after it.
	if err := s.jf.Truncate(journalHeader); err != nil {
		s.failed("empty journal", err)
	}
	s.jlen = journalHeader
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
	err = writeFileAtomic(path, append(b, '\n'))
	if err == nil {
		err = syncDir(s.o.Dir)
	}
	s.pinsSaved = err == nil
	if err != nil {
		return s.failed("save pins", err)
	}
	return nil
}

func writeFileAtomic(path string, b []byte) error {
	tmp := path + tmpSuffix
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
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
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	v := &view{segs: slices.Clone(s.segs), open: s.open.snapshot()}
	s.mu.Unlock()
	return v.read(from, to, step, fn, s.setAside)
}

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
	st.Series = len(s.series)
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
