package flightrec

import (
	"bufio"
	"cmp"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/klauspost/compress/zstd"
)

// segment is a segment's content: the ticks, one column per series, and the events. A sealed
// segment is decoded from its file; the open one is built tick by tick from the journal.
type segment struct {
	ticks      []int64 // Unix ns, increasing
	cols       []column
	events     []byte // encoded records, back to back
	nEvents    int
	minT, maxT int64  // over ticks and event times
	samples    int64  // logical samples: each series at each tick from its first
	raw        []byte // a sealed segment's decompressed bytes, which cols point into
}

// column is one series in a segment: its catalogue entry, the tick of its first value, and
// data: that value in full, then (tick gap, change) for each later tick it changed.
type column struct {
	key   string
	first int32
	last  int32 // tick of the last change (open segments only)
	data  []byte
}

// apply adds one journal tick (see Store.encodeTick) to g. It checks the whole tick before
// changing anything, so that a tick that does not decode leaves g as it was.
func (g *segment) apply(p []byte) error {
	if err := g.applyTick(p, false); err != nil {
		return err
	}
	return g.applyTick(p, true)
}

// applyTick checks a journal tick or, with commit, adds it to g.
func (g *segment) applyTick(p []byte, commit bool) error {
	d := dec{b: p}
	idx := d.uvarint()
	t := d.varint()
	if d.err == nil && idx != uint64(len(g.ticks)) {
		d.fail("tick out of sequence")
	}
	if d.err == nil && len(g.ticks) > 0 && t <= g.ticks[len(g.ticks)-1] {
		d.fail("tick not after the previous one")
	}
	tick := int32(idx)
	ncols := len(g.cols)
	for range d.count(3) {
		key := d.entry()
		start := d.b
		if d.err != nil {
			break
		}
		d.skipAbs(key[0])
		if commit {
			data := append([]byte(nil), start[:len(start)-len(d.b)]...)
			g.cols = append(g.cols, column{key: string(key), first: tick, last: tick, data: data})
		}
	}
	prev := -1
	for range d.count(2) {
		id := prev + 1 + int(d.uvarint())
		if d.err == nil && (id < 0 || id >= ncols) {
			d.fail("change of an unknown series")
		}
		if d.err != nil {
			break
		}
		prev = id
		c := &g.cols[id]
		start := d.b
		d.skipChange(c.key[0])
		if commit {
			c.data = binary.AppendUvarint(c.data, uint64(tick-c.last))
			c.data = append(c.data, start[:len(start)-len(d.b)]...)
			c.last = tick
		}
	}
	minT, maxT := t, t
	nev := d.count(10)
	for range nev {
		rec, rt := d.skipRecord()
		if commit {
			g.events = append(g.events, rec...)
			minT, maxT = min(minT, clampNanos(rt)), max(maxT, clampNanos(rt))
		}
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("trailing bytes")
	}
	if d.err != nil || !commit {
		return d.err
	}
	if len(g.ticks) == 0 {
		g.minT, g.maxT = minT, maxT
	}
	g.minT, g.maxT = min(g.minT, minT), max(g.maxT, maxT)
	g.ticks = append(g.ticks, t)
	g.nEvents += nev
	g.samples += int64(len(g.cols))
	return nil
}

// clampNanos is t in Unix ns, saturated: an event may carry any time.
func clampNanos(t time.Time) int64 {
	switch {
	case t.Before(time.Unix(0, math.MinInt64)):
		return math.MinInt64
	case t.After(time.Unix(0, math.MaxInt64)):
		return math.MaxInt64
	}
	return t.UnixNano()
}

// A segment file is a fixed header, then a zstd frame holding the ticks, the catalogue and the
// columns, then a zstd frame holding the events (empty when there are none). The header's own
// checksum makes a listing trustworthy without reading the frames.
const (
	segPrefix  = "seg-"
	segSuffix  = ".nfr"
	tmpSuffix  = ".tmp"
	badSuffix  = ".corrupt"
	headerSize = 104
	segVersion = 1

	// Decompression is bounded: a damaged length must not make a reader allocate much.
	maxRaw   = 1 << 30
	maxRatio = 256
)

var (
	segMagic   = [4]byte{'N', 'F', 'R', 'S'}
	castagnoli = crc32.MakeTable(crc32.Castagnoli)
)

type header struct {
	first, last, minT, maxT int64
	ticks, series, events   uint32
	colsCRC, evCRC          uint32
	samples                 uint64
	colsLen, colsRaw        uint64
	evLen, evRaw            uint64
}

func (h *header) marshal() []byte {
	b := make([]byte, 0, headerSize)
	b = append(b, segMagic[:]...)
	b = append(b, segVersion, 0, 0, 0)
	for _, v := range []int64{h.first, h.last, h.minT, h.maxT} {
		b = binary.LittleEndian.AppendUint64(b, uint64(v))
	}
	for _, v := range []uint32{h.ticks, h.series, h.events, h.colsCRC} {
		b = binary.LittleEndian.AppendUint32(b, v)
	}
	for _, v := range []uint64{h.samples, h.colsLen, h.colsRaw, h.evLen, h.evRaw} {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	b = binary.LittleEndian.AppendUint32(b, h.evCRC)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

func parseHeader(b []byte, size int64) (header, error) {
	var h header
	le := binary.LittleEndian
	if len(b) < headerSize || [4]byte(b[:4]) != segMagic {
		return h, fmt.Errorf("%w: not a segment", errCorrupt)
	}
	if b[4] != segVersion {
		return h, fmt.Errorf("%w: segment version %d, this reader knows %d", errCorrupt, b[4], segVersion)
	}
	if crc32.Checksum(b[:headerSize-4], castagnoli) != le.Uint32(b[headerSize-4:]) {
		return h, fmt.Errorf("%w: header checksum", errCorrupt)
	}
	i64 := func(off int) int64 { return int64(le.Uint64(b[off:])) }
	h = header{first: i64(8), last: i64(16), minT: i64(24), maxT: i64(32),
		ticks: le.Uint32(b[40:]), series: le.Uint32(b[44:]), events: le.Uint32(b[48:]), colsCRC: le.Uint32(b[52:]),
		samples: le.Uint64(b[56:]), colsLen: le.Uint64(b[64:]), colsRaw: le.Uint64(b[72:]),
		evLen: le.Uint64(b[80:]), evRaw: le.Uint64(b[88:]), evCRC: le.Uint32(b[96:])}
	switch {
	case h.ticks == 0 || h.first > h.last || h.minT > h.first || h.maxT < h.last:
		return h, fmt.Errorf("%w: header times", errCorrupt)
	case h.colsLen > uint64(size) || h.evLen > uint64(size) || headerSize+h.colsLen+h.evLen != uint64(size):
		return h, fmt.Errorf("%w: %d bytes, header says %d", errCorrupt, size, headerSize+h.colsLen+h.evLen)
	}
	return h, nil
}

// segFile is a sealed segment on disk.
type segFile struct {
	path string
	size int64
	h    header
}

func segName(first int64) string { return fmt.Sprintf("%s%020d%s", segPrefix, first, segSuffix) }

// openSegFile reads and checks a segment's header.
func openSegFile(path string) (segFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return segFile{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return segFile{}, err
	}
	b := make([]byte, headerSize)
	if _, err := io.ReadFull(f, b); err != nil {
		return segFile{}, fmt.Errorf("%w: short header", errCorrupt)
	}
	h, err := parseHeader(b, fi.Size())
	if err != nil {
		return segFile{}, err
	}
	name := filepath.Base(path)
	first, perr := strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(name, segPrefix), segSuffix), 10, 64)
	if perr != nil || first != h.first {
		return segFile{}, fmt.Errorf("%w: name %s does not match its first tick %d", errCorrupt, name, h.first)
	}
	return segFile{path: path, size: fi.Size(), h: h}, nil
}

// frame reads and checks one of the file's frames and decompresses it into buf.
func (f *segFile) frame(off, n, raw uint64, sum uint32, buf []byte) ([]byte, error) {
	if n == 0 {
		if raw != 0 {
			return nil, fmt.Errorf("%w: empty frame", errCorrupt)
		}
		return buf[:0], nil
	}
	file, err := os.Open(f.path)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	src := make([]byte, n)
	if _, err := file.ReadAt(src, int64(off)); err != nil {
		return nil, fmt.Errorf("%w: %v", errCorrupt, err)
	}
	if crc32.Checksum(src, castagnoli) != sum {
		return nil, fmt.Errorf("%w: checksum", errCorrupt)
	}
	return decompress(src, raw, buf)
}

// load decodes the whole segment; buf is reused for its bytes, which the segment then holds.
func (f *segFile) load(buf []byte) (*segment, error) {
	raw, err := f.frame(headerSize, f.h.colsLen, f.h.colsRaw, f.h.colsCRC, buf)
	if err != nil {
		return nil, err
	}
	g, err := decodeCols(raw)
	if err != nil {
		return nil, err
	}
	g.raw = raw
	if len(g.ticks) != int(f.h.ticks) || len(g.cols) != int(f.h.series) || g.ticks[0] != f.h.first || g.ticks[len(g.ticks)-1] != f.h.last {
		return nil, fmt.Errorf("%w: body does not match the header", errCorrupt)
	}
	return g, nil
}

// loadEvents returns the segment's encoded events without decoding its columns.
func (f *segFile) loadEvents() ([]byte, error) {
	return f.frame(headerSize+f.h.colsLen, f.h.evLen, f.h.evRaw, f.h.evCRC, nil)
}

var decoder = sync.OnceValues(func() (*zstd.Decoder, error) {
	return zstd.NewReader(nil, zstd.WithDecoderConcurrency(2), zstd.WithDecoderMaxWindow(64<<20),
		zstd.WithDecodeAllCapLimit(true), zstd.WithDecoderMaxMemory(maxRaw))
})

// decompress decodes one zstd frame of raw bytes, no more.
func decompress(src []byte, raw uint64, buf []byte) ([]byte, error) {
	if raw > maxRaw || raw > uint64(len(src))*maxRatio+64<<10 {
		return nil, fmt.Errorf("%w: %d bytes would decompress to %d", errCorrupt, len(src), raw)
	}
	d, err := decoder()
	if err != nil {
		return nil, err
	}
	if uint64(cap(buf)) < raw {
		buf = make([]byte, 0, raw)
	}
	out, err := d.DecodeAll(src, buf[:0:raw])
	if err != nil || uint64(len(out)) != raw {
		return nil, fmt.Errorf("%w: frame does not decompress", errCorrupt)
	}
	return out, nil
}

// The columns frame: the tick count, the first tick and the later ones as varint
// delta-of-deltas; the series count, then each series' catalogue entry, first tick and data
// length; then the data of every series, back to back.
func decodeCols(raw []byte) (*segment, error) {
	d := dec{b: raw}
	g := &segment{}
	n := d.count(1)
	if n == 0 {
		d.fail("no ticks")
	}
	g.ticks = make([]int64, 0, n)
	var t, delta int64
	for i := range n {
		if i == 0 {
			t = d.varint()
		} else {
			delta += d.varint()
			if delta <= 0 || t+delta < t {
				d.fail("ticks not increasing")
				break
			}
			t += delta
		}
		g.ticks = append(g.ticks, t)
	}
	ns := d.count(6)
	g.cols = make([]column, 0, ns)
	lens := make([]uint64, 0, ns)
	for range ns {
		key := d.entry()
		first := d.uvarint()
		l := d.uvarint()
		if d.err != nil {
			break
		}
		if first >= uint64(len(g.ticks)) {
			d.fail("first tick beyond the segment")
			break
		}
		g.cols = append(g.cols, column{key: string(key), first: int32(first)})
		lens = append(lens, l)
		g.samples += int64(len(g.ticks)) - int64(first)
	}
	for i, l := range lens {
		g.cols[i].data = d.bytes(l)
		if d.err == nil && l == 0 {
			d.fail("empty column")
		}
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("trailing bytes")
	}
	if d.err != nil {
		return nil, d.err
	}
	g.minT, g.maxT = g.ticks[0], g.ticks[len(g.ticks)-1]
	return g, nil
}

// countWriter counts and checksums what goes through it.
type countWriter struct {
	w   io.Writer
	n   uint64
	crc uint32
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += uint64(n)
	c.crc = crc32.Update(c.crc, castagnoli, p[:n])
	return n, err
}

// writeSegment seals g into dir: a temporary file, synced, renamed into place, and the
// directory synced, so that a segment file is always whole. The columns go in catalogue order
// sorted by series (metric first), which puts alike columns side by side for zstd.
func writeSegment(dir string, g *segment) (sf segFile, err error) {
	path := filepath.Join(dir, segName(g.ticks[0]))
	tmp := path + tmpSuffix
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return segFile{}, err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderConcurrency(1),
		zstd.WithEncoderCRC(false), zstd.WithWindowSize(4<<20))
	if err != nil {
		return segFile{}, err
	}
	bw := bufio.NewWriterSize(f, 256<<10)
	if _, err := bw.Write(make([]byte, headerSize)); err != nil {
		return segFile{}, err
	}
	order := make([]int, len(g.cols))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(g.cols[a].key, g.cols[b].key) })

	h := header{first: g.ticks[0], last: g.ticks[len(g.ticks)-1], minT: g.minT, maxT: g.maxT,
		ticks: uint32(len(g.ticks)), series: uint32(len(g.cols)), events: uint32(g.nEvents), samples: uint64(g.samples)}
	cw := &countWriter{w: bw}
	enc.Reset(cw)
	b := binary.AppendUvarint(nil, uint64(len(g.ticks)))
	var prev, delta int64
	for i, t := range g.ticks {
		if i == 0 {
			b = binary.AppendVarint(b, t)
		} else {
			b = binary.AppendVarint(b, t-prev-delta)
			delta = t - prev
		}
		prev = t
	}
	b = binary.AppendUvarint(b, uint64(len(g.cols)))
	for _, i := range order {
		c := &g.cols[i]
		b = append(b, c.key...)
		b = binary.AppendUvarint(b, uint64(c.first))
		b = binary.AppendUvarint(b, uint64(len(c.data)))
	}
	raw := uint64(len(b))
	if _, err := enc.Write(b); err != nil {
		return segFile{}, err
	}
	for _, i := range order {
		raw += uint64(len(g.cols[i].data))
		if _, err := enc.Write(g.cols[i].data); err != nil {
			return segFile{}, err
		}
	}
	if err := enc.Close(); err != nil {
		return segFile{}, err
	}
	h.colsLen, h.colsRaw, h.colsCRC = cw.n, raw, cw.crc
	if len(g.events) > 0 {
		cw = &countWriter{w: bw}
		enc.Reset(cw)
		if _, err := enc.Write(g.events); err != nil {
			return segFile{}, err
		}
		if err := enc.Close(); err != nil {
			return segFile{}, err
		}
		h.evLen, h.evRaw, h.evCRC = cw.n, uint64(len(g.events)), cw.crc
	}
	if err := bw.Flush(); err != nil {
		return segFile{}, err
	}
	if _, err := f.WriteAt(h.marshal(), 0); err != nil {
		return segFile{}, err
	}
	if err := f.Sync(); err != nil {
		return segFile{}, err
	}
	if err := f.Close(); err != nil {
		return segFile{}, err
	}
	if err := os.Rename(tmp, path); err != nil {
		return segFile{}, err
	}
	if err := syncDir(dir); err != nil {
		return segFile{}, err
	}
	return segFile{path: path, size: int64(headerSize + h.colsLen + h.evLen), h: h}, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
