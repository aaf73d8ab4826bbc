package flightrec

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/klauspost/compress/zstd"
)

// segment is a segment's content: the ticks, one column per series, and the events. A sealed
// segment is decoded from its file, the open one from the journal.
type segment struct {
	ticks      []int64 // Unix ns, increasing
	cols       []column
	events     []byte // encoded records, back to back
	nEvents    int
	minT, maxT int64 // over ticks and event times
	samples    int64 // logical samples: each series at each tick from its first
	series     int   // a sealed segment's series, cols holding those a read keeps

	// A journal tick whose first entries were applied and its last not yet.
	inPart   bool
	partT    int64 // its time
	partCols int   // the columns before it
}

// column is one series in a segment: its catalogue entry, the tick of its first value, and
// data: that value in full, then (tick gap, change) for each later tick it changed.
type column struct {
	key   string
	kind  byte // the entry's first byte: kindFloat or kindHist
	first int32
	last  int32  // tick of the last change (open segments only)
	data  []byte // nil: a series a journal's replay left out (replay's keep)
}

// tickHead is what a journal entry says of its tick besides the columns.
type tickHead struct {
	idx        uint64
	t          int64
	defs       int // new series
	changes    int
	nEvents    int
	events     []byte // encoded records
	minT, maxT int64  // over the tick's time and its events'
}

// walkTick decodes a journal entry (see Store.writeTick) and checks its shape. ncols columns
// come before it, and kind gives their kinds. Unless nil, def is called with each new series'
// column, catalogue entry and value in full, and change with each change's column and bytes,
// in order; both are given the tick's index. When change returns false, walkTick stops there.
func walkTick(p []byte, ncols int, kind func(col int) byte, def func(tick int32, col int, key, v []byte), change func(tick int32, col int, ch []byte) bool) (tickHead, error) {
	d := dec{b: p}
	var h tickHead
	h.idx = d.uvarint()
	h.t = d.varint()
	if d.err == nil && h.idx > math.MaxInt32 {
		d.fail("tick index out of range")
	}
	tick := int32(h.idx)
	h.defs = d.count(3)
	for i := range h.defs {
		key := d.entry()
		start := d.b
		if d.err != nil {
			break
		}
		d.skipAbs(key[0])
		if def != nil && d.err == nil {
			def(tick, ncols+i, key, start[:len(start)-len(d.b)])
		}
	}
	prev := -1
	h.changes = d.count(2)
	for range h.changes {
		id := prev + 1 + int(d.uvarint())
		if d.err == nil && (id < 0 || id >= ncols) {
			d.fail("change of an unknown series")
		}
		if d.err != nil {
			break
		}
		prev = id
		start := d.b
		d.skipChange(kind(id))
		if change != nil && d.err == nil && !change(tick, id, start[:len(start)-len(d.b)]) {
			return h, nil
		}
	}
	h.minT, h.maxT = h.t, h.t
	h.nEvents = d.count(10)
	evStart := d.b
	for range h.nEvents {
		rt := clampNanos(d.skipRecord())
		h.minT, h.maxT = min(h.minT, rt), max(h.maxT, rt)
	}
	h.events = evStart[:len(evStart)-len(d.b)]
	if d.err == nil && len(d.b) != 0 {
		d.fail("trailing bytes")
	}
	return h, d.err
}

// apply adds one journal entry to g; last says it ends its tick. It checks the entry before
// changing anything, so that an entry that does not decode leaves g as it was.
//
// The series keep leaves out (nil: none) keep their place, their kind and nothing else: a read
// of a few cgroups' series then copies what it keeps of the journal, not all of it.
func (g *segment) apply(p []byte, last bool, keep Keep) error {
	kind := func(col int) byte { return g.cols[col].kind }
	h, err := walkTick(p, len(g.cols), kind, nil, nil)
	switch {
	case err != nil:
		return err
	case h.idx != uint64(len(g.ticks)):
		return fmt.Errorf("%w: tick out of sequence", errCorrupt)
	case g.inPart && h.t != g.partT:
		return fmt.Errorf("%w: a tick's entries disagree on its time", errCorrupt)
	case !g.inPart && len(g.ticks) > 0 && h.t <= g.ticks[len(g.ticks)-1]:
		return fmt.Errorf("%w: tick not after the previous one", errCorrupt)
	case !last && h.changes+h.nEvents > 0:
		return fmt.Errorf("%w: changes or events before a tick's last entry", errCorrupt)
	}
	if !g.inPart {
		g.partCols = len(g.cols)
	}
	walkTick(p, len(g.cols), kind, func(tick int32, _ int, key, v []byte) {
		c := column{kind: key[0], first: tick, last: tick}
		if keeps(keep, key) {
			c.key, c.data = string(key), append([]byte(nil), v...)
		}
		g.cols = append(g.cols, c)
	}, func(tick int32, col int, ch []byte) bool {
		c := &g.cols[col]
		if c.data == nil {
			return true
		}
		c.data = binary.AppendUvarint(c.data, uint64(tick-c.last))
		c.data = append(c.data, ch...)
		c.last = tick
		return true
	})
	g.inPart, g.partT = !last, h.t
	if !last {
		return nil
	}
	if len(g.ticks) == 0 {
		g.minT, g.maxT = h.minT, h.maxT
	}
	g.minT, g.maxT = min(g.minT, h.minT), max(g.maxT, h.maxT)
	g.ticks = append(g.ticks, h.t)
	g.events = append(g.events, h.events...)
	g.nEvents += h.nEvents
	g.samples += int64(len(g.cols))
	return nil
}

// dropPart undoes the entries applied of a tick whose last entry is missing.
func (g *segment) dropPart() {
	if g.inPart {
		clear(g.cols[g.partCols:])
		g.cols = g.cols[:g.partCols]
		g.inPart = false
	}
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
	tmpSuffix  = ".tmp" // half-written files of agents before internal/atomicfile
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

// frame reads and checks one of the file's frames, into *zbuf (grown when short, for the next
// frame), and decompresses it into buf.
func (f *segFile) frame(off, n, raw uint64, sum uint32, buf []byte, zbuf *[]byte) ([]byte, error) {
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
	if uint64(cap(*zbuf)) < n {
		*zbuf = make([]byte, n, grown(n))
	}
	src := (*zbuf)[:n]
	if _, err := file.ReadAt(src, int64(off)); err != nil {
		return nil, fmt.Errorf("%w: %v", errCorrupt, err)
	}
	if crc32.Checksum(src, castagnoli) != sum {
		return nil, fmt.Errorf("%w: checksum", errCorrupt)
	}
	return decompress(src, raw, buf)
}

// loadEvents returns the segment's encoded events without decoding its columns, decompressed
// into buf, the compressed bytes read into *zbuf (a read reuses both from segment to segment).
func (f *segFile) loadEvents(buf []byte, zbuf *[]byte) ([]byte, error) {
	return f.frame(headerSize+f.h.colsLen, f.h.evLen, f.h.evRaw, f.h.evCRC, buf, zbuf)
}

var decoder = sync.OnceValues(func() (*zstd.Decoder, error) {
	return zstd.NewReader(nil, zstd.WithDecoderConcurrency(2), zstd.WithDecoderMaxWindow(64<<20),
		zstd.WithDecodeAllCapLimit(true), zstd.WithDecoderMaxMemory(maxRaw))
})

// grown is a buffer's capacity for n bytes: a little more, for the next frame.
func grown(n uint64) uint64 { return (n + 64<<10 - 1) &^ (64<<10 - 1) }

// implausible: a frame of n bytes cannot decompress to raw, or raw is more than a read holds.
func implausible(n, raw uint64) bool { return raw > maxRaw || raw > n*maxRatio+64<<10 }

// decompress decodes one zstd frame of raw bytes, no more, into buf when it has room.
func decompress(src []byte, raw uint64, buf []byte) ([]byte, error) {
	if implausible(uint64(len(src)), raw) {
		return nil, fmt.Errorf("%w: %d bytes would decompress to %d", errCorrupt, len(src), raw)
	}
	d, err := decoder()
	if err != nil {
		return nil, err
	}
	if uint64(cap(buf)) < raw {
		buf = make([]byte, 0, grown(raw))
	}
	out, err := d.DecodeAll(src, buf[:0:raw])
	if err != nil || uint64(len(out)) != raw {
		return nil, fmt.Errorf("%w: frame does not decompress", errCorrupt)
	}
	return buf[:raw], nil
}
