package flightrec

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"sync"
	"unsafe"

	"github.com/klauspost/compress/zstd"
)

// A sealed segment's columns frame is decoded as a stream: only the columns a read keeps are
// held, not the whole frame. Decompressed whole, an hour of 1,000 cgroups had a read hold 15 MB
// for each 5-minute segment while it kept a tenth of it, and the agent's analysis of that hour
// ran the collector hundreds of times near its memory limit (BenchmarkPostmortem1h). The frame
// was written with a 1 MiB zstd window (segWindow), which bounds what the stream's decoder holds.

// streamDecoders are the streaming zstd decoders, one per read at a time.
var streamDecoders sync.Pool

func streamDecoder(r io.Reader) (*zstd.Decoder, error) {
	if d, _ := streamDecoders.Get().(*zstd.Decoder); d != nil {
		return d, d.Reset(r)
	}
	return zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
		zstd.WithDecoderMaxWindow(64<<20), zstd.WithDecoderMaxMemory(maxRaw))
}

func putStreamDecoder(d *zstd.Decoder) {
	if d.Reset(nil) == nil {
		streamDecoders.Put(d)
	}
}

// crcReader checksums what is read through it.
type crcReader struct {
	r   io.Reader
	crc uint32
}

func (c *crcReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.crc = crc32.Update(c.crc, castagnoli, p[:n])
	return n, err
}

// colScratch is what decoding a segment's columns needs, reused from segment to segment by a
// read: the segment it returns holds its cols and buf until the next.
type colScratch struct {
	buf        []byte // the kept columns' catalogue entries and data
	cols       []column
	lens       []uint64 // every column's data length
	kept       []bool
	keys, data []span // in buf, of the kept columns
}

// span is a stretch of colScratch.buf.
type span struct{ off, len uint64 }

// load decodes the segment's columns that keep admits (nil: all), into s.
func (f *segFile) load(s *colScratch, keep Keep) (*segment, error) {
	n, raw := f.h.colsLen, f.h.colsRaw
	if n == 0 || implausible(n, raw) {
		return nil, fmt.Errorf("%w: %d bytes would decompress to %d", errCorrupt, n, raw)
	}
	file, err := os.Open(f.path)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	sum := &crcReader{r: io.NewSectionReader(file, headerSize, int64(n))}
	zr, err := streamDecoder(bufio.NewReaderSize(sum, 64<<10))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errCorrupt, err)
	}
	defer putStreamDecoder(zr)
	g, err := decodeCols(bufio.NewReaderSize(zr, 64<<10), raw, keep, s)
	if err == nil { // the frame ends where the columns do
		if extra, cerr := io.Copy(io.Discard, zr); cerr != nil || extra != 0 {
			err = fmt.Errorf("%w: frame does not decompress to its length", errCorrupt)
		}
	}
	// The checksum covers every compressed byte, whatever the decoder read of them; a damaged
	// frame is named as such rather than by what its decoding tripped on.
	if _, cerr := io.Copy(io.Discard, sum); cerr != nil || sum.crc != f.h.colsCRC {
		return nil, fmt.Errorf("%w: checksum", errCorrupt)
	}
	if err != nil {
		if !errors.Is(err, errCorrupt) {
			err = fmt.Errorf("%w: %v", errCorrupt, err)
		}
		return nil, err
	}
	if len(g.ticks) != int(f.h.ticks) || g.series != int(f.h.series) || g.ticks[0] != f.h.first || g.ticks[len(g.ticks)-1] != f.h.last {
		return nil, fmt.Errorf("%w: body does not match the header", errCorrupt)
	}
	return g, nil
}

// The columns frame: the tick count, the first tick and the later ones as varint
// delta-of-deltas; the series count, then each series' catalogue entry, first tick and data
// length; then the data of every series, back to back.
//
// decodeCols reads a frame of raw bytes from r, keeping the catalogue entries and data of the
// columns keep admits (nil: all) in s.buf: the segment's cols, s.cols, point into it.
func decodeCols(r *bufio.Reader, raw uint64, keep Keep, s *colScratch) (*segment, error) {
	d := &streamDec{r: r, left: raw}
	g := &segment{}
	n := d.count(1)
	if n == 0 {
		d.fail("no ticks")
	}
	g.ticks = make([]int64, 0, n)
	var t, delta int64
	for i := range n {
		if d.err != nil {
			break
		}
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
	g.series = ns
	lens, kept, keys, data, buf := s.lens[:0], s.kept[:0], s.keys[:0], s.data[:0], s.buf[:0]
	g.cols = s.cols[:0]
	defer func() { s.lens, s.kept, s.keys, s.data, s.buf, s.cols = lens, kept, keys, data, buf, g.cols }()
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
		lens = append(lens, l)
		g.samples += int64(len(g.ticks)) - int64(first)
		kept = append(kept, keeps(keep, key))
		if !kept[len(kept)-1] {
			continue
		}
		keys = append(keys, span{uint64(len(buf)), uint64(len(key))})
		buf = append(buf, key...)
		g.cols = append(g.cols, column{kind: key[0], first: int32(first)})
	}
	for i, l := range lens {
		if d.err == nil && l == 0 {
			d.fail("empty column")
		}
		if d.err != nil {
			break
		}
		if !kept[i] {
			d.skip(l)
			continue
		}
		data = append(data, span{uint64(len(buf)), l})
		buf = d.appendBytes(buf, l)
	}
	if d.err == nil && d.left != 0 {
		d.fail("trailing bytes")
	}
	if d.err != nil {
		return nil, d.err
	}
	// buf no longer grows: the columns point into it.
	for j := range g.cols {
		k, v := keys[j], data[j]
		g.cols[j].key = unsafe.String(&buf[k.off], k.len)
		g.cols[j].data = buf[v.off : v.off+v.len : v.off+v.len]
	}
	g.minT, g.maxT = g.ticks[0], g.ticks[len(g.ticks)-1]
	return g, nil
}

// streamDec decodes what dec does from a stream of left bytes. A catalogue entry it reads is in
// its key until the next.
type streamDec struct {
	r    *bufio.Reader
	left uint64
	err  error
	key  []byte // the entry being read
}

func (d *streamDec) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", errCorrupt, what)
	}
	d.left = 0
}

// ReadByte makes it an io.ByteReader for the varints.
func (d *streamDec) ReadByte() (byte, error) {
	if d.err != nil {
		return 0, d.err
	}
	if d.left == 0 {
		d.fail("short")
		return 0, d.err
	}
	b, err := d.r.ReadByte()
	if err != nil {
		d.fail("short")
		return 0, d.err
	}
	d.left--
	return b, nil
}

func (d *streamDec) uvarint() uint64 {
	v, err := binary.ReadUvarint(d)
	if err != nil {
		d.fail("bad varint")
	}
	return v
}

func (d *streamDec) varint() int64 {
	v, err := binary.ReadVarint(d)
	if err != nil {
		d.fail("bad varint")
	}
	return v
}

// count reads a number of items each taking at least size bytes, so that a damaged count
// cannot make the caller allocate more than the stream could hold.
func (d *streamDec) count(size int) int {
	n := d.uvarint()
	if n > d.left/uint64(size) {
		d.fail("count beyond the data")
		return 0
	}
	return int(n)
}

// appendBytes appends the next n bytes to b.
func (d *streamDec) appendBytes(b []byte, n uint64) []byte {
	if d.err != nil {
		return b
	}
	if n > d.left {
		d.fail("short")
		return b
	}
	at := len(b)
	b = append(b, make([]byte, n)...)
	if _, err := io.ReadFull(d.r, b[at:]); err != nil {
		d.fail("short")
		return b[:at]
	}
	d.left -= n
	return b
}

// skip steps over the next n bytes.
func (d *streamDec) skip(n uint64) {
	if d.err != nil {
		return
	}
	if n > d.left {
		d.fail("short")
		return
	}
	if _, err := d.r.Discard(int(n)); err != nil {
		d.fail("short")
		return
	}
	d.left -= n
}

// str appends a string, its length first, to the entry being read.
func (d *streamDec) str() {
	n := d.uvarint()
	d.key = binary.AppendUvarint(d.key, n)
	d.key = d.appendBytes(d.key, n)
}

// entry reads a catalogue entry (codec.go's dec.entry) and returns its bytes, valid until the
// next entry.
func (d *streamDec) entry() []byte {
	d.key = d.key[:0]
	k, err := d.ReadByte()
	if err == nil && k != kindFloat && k != kindHist {
		d.fail("bad series kind")
	}
	d.key = append(d.key, k)
	d.str()
	d.str()
	d.str()
	pairs := d.count(2)
	d.key = binary.AppendUvarint(d.key, uint64(pairs))
	for range pairs {
		d.str()
		d.str()
	}
	return d.key
}
