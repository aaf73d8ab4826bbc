package flightrec

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodectl/nodectl/rundir"
)

// seedStore writes a small store with sealed segments and a journal; it returns the journal,
// a segment file, a journal tick's payload and a segment's columns frame, decompressed.
func seedStore(f *testing.F) (journal, seg, tick, cols []byte) {
	dir := f.TempDir()
	ticks := randomTicks(10, 8, 5) // small: the fuzzer minimizes what it finds, byte by byte
	s, err := Open(Options{Dir: dir, SegmentSpan: 4 * time.Second, Now: func() time.Time { return t0 }})
	if err != nil {
		f.Fatal(err)
	}
	appendAll(f, s, ticks)
	segs := s.segs
	s.Close()
	if journal, err = os.ReadFile(filepath.Join(dir, journalName)); err != nil {
		f.Fatal(err)
	}
	var j journalReader
	j.reset(bytes.NewReader(journal), int64(len(journal)))
	for p, _, err := j.next(); err == nil; p, _, err = j.next() {
		tick = append(tick[:0], p...) // the last
	}
	if len(tick) == 0 {
		f.Fatal("no tick in the journal")
	}
	if seg, err = os.ReadFile(segs[0].path); err != nil {
		f.Fatal(err)
	}
	h := segs[0].h
	if cols, err = segs[0].frame(headerSize, h.colsLen, h.colsRaw, h.colsCRC, nil, new([]byte)); err != nil {
		f.Fatal(err)
	}
	return journal, seg, tick, cols
}

var (
	fuzzFrom = time.Unix(0, 0)
	fuzzTo   = time.Unix(1<<40, 0)
)

// Whatever the files hold, a reader neither panics nor allocates beyond what the bytes could
// decode to.
func FuzzOpenReader(f *testing.F) {
	journal, seg, _, _ := seedStore(f)
	f.Add(journal, seg)
	f.Add(journal[:len(journal)/2], seg[:len(seg)-1])
	f.Add(journal[:journalHeader], seg[:headerSize])
	f.Add([]byte{}, []byte{})
	dir := f.TempDir() // one per worker: a fresh one per input would be most of the time
	f.Fuzz(func(t *testing.T, journal, seg []byte) {
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, journalName), journal, 0o600); err != nil {
			t.Fatal(err)
		}
		var first int64 // named as its header says, to be read past the listing
		if len(seg) >= 16 {
			first = int64(binary.LittleEndian.Uint64(seg[8:]))
		}
		if err := os.WriteFile(filepath.Join(dir, segName(first)), seg, 0o600); err != nil {
			t.Fatal(err)
		}
		rd, err := OpenReader(dir)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rd.Span(); err != nil {
			t.Fatal(err)
		}
		for _, step := range []time.Duration{0, 3 * time.Second} {
			if err := rd.Read(fuzzFrom, fuzzTo, step, func(rundir.Record) error { return nil }); err != nil {
				t.Log(err) // a journal that does not decode is reported, not a panic
			}
		}
	})
}

// The decoders behind the checksums: a journal tick (or one of its entries), a segment's
// columns, records.
func FuzzDecode(f *testing.F) {
	journal, _, tick, cols := seedStore(f)
	f.Add(tick)
	f.Add(cols)
	f.Add(journal)
	f.Add(tick[:len(tick)/2])
	f.Fuzz(func(t *testing.T, b []byte) {
		discard := func(rundir.Record) error { return nil }
		g := &segment{}
		if g.apply(b, true, nil) == nil && len(g.ticks) > 0 {
			(&view{open: g}).read(fuzzFrom, fuzzTo, 0, nil, discard, nil)
		}
		if g := (&segment{}); g.apply(b, false, nil) == nil { // a tick's entry but its last
			g.dropPart()
		}
		if g, err := decodeCols(bufio.NewReader(bytes.NewReader(b)), uint64(len(b)), nil, &colScratch{}); err == nil {
			(&view{open: g}).read(fuzzFrom, fuzzTo, 0, nil, discard, nil)
			(&view{open: g}).read(fuzzFrom, fuzzTo, 2*time.Second, func(_, metric string) bool { return len(metric)%2 == 0 }, discard, nil)
		}
		replay(b, &segment{}, nil)
		d := dec{b: b}
		for d.err == nil && len(d.b) > 0 {
			d.record()
		}
	})
}
