package flightrec

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/klauspost/compress/zstd"
)

// The journal holds the open segment: a header, then one entry per tick, or several for a tick
// defining many series (a segment's first). An entry is its payload's length (4 bytes), a
// CRC-32C of that length and the payload (4 bytes), and the payload: a flag byte, 0 for a plain
// tick or 1 for a zstd-compressed one preceded by its plain length, plus entryMore when the tick
// goes on in the next entry. A tick that was not written whole fails its checksum or lacks its
// last entry: the tail is cut there.
const (
	journalName   = "journal"
	journalHeader = 8
	entryHeader   = 8
	maxEntry      = 256 << 20

	entryPlain byte = 0
	entryZstd  byte = 1
	entryMore  byte = 2

	// compressAbove: smaller ticks do not gain from a zstd frame's overhead.
	compressAbove = 128
	// partBytes is about the most a tick's entry holds before the tick goes on in another:
	// what the writer, a seal and a replay hold of the journal at a time.
	partBytes = 128 << 10
)

var journalMagic = [journalHeader]byte{'N', 'F', 'R', 'J', 1, 0, 0, 0}

// frameEntry appends the journal entry of a plain tick payload to b; more says the tick goes on
// in the next entry.
func frameEntry(b, payload []byte, enc *zstd.Encoder, more bool) []byte {
	var flag byte
	if more {
		flag = entryMore
	}
	start := len(b)
	b = append(b, make([]byte, entryHeader)...)
	if len(payload) > compressAbove {
		b = append(b, flag|entryZstd)
		b = binary.AppendUvarint(b, uint64(len(payload)))
		b = enc.EncodeAll(payload, b)
	}
	if len(payload) <= compressAbove || len(b)-start-entryHeader > len(payload)+1 {
		b = append(b[:start+entryHeader], flag|entryPlain)
		b = append(b, payload...)
	}
	n := len(b) - start - entryHeader
	binary.LittleEndian.PutUint32(b[start:], uint32(n))
	crc := crc32.Update(crc32.Checksum(b[start:start+4], castagnoli), castagnoli, b[start+entryHeader:])
	binary.LittleEndian.PutUint32(b[start+4:], crc)
	return b
}

// journalReader reads a journal's entries one at a time.
type journalReader struct {
	r         *bufio.Reader
	off, size int64 // the next entry's offset; the journal's length
	body, raw []byte
}

// reset makes j read the journal of size bytes in ra, after its header.
func (j *journalReader) reset(ra io.ReaderAt, size int64) {
	src := io.NewSectionReader(ra, journalHeader, size-journalHeader)
	if j.r == nil {
		j.r = bufio.NewReaderSize(src, 64<<10)
	} else {
		j.r.Reset(src)
	}
	j.off, j.size = journalHeader, size
}

// next returns the next entry's tick payload, valid until the next call, and whether the tick
// goes on in the next entry. It returns io.EOF after the last entry, an errCorrupt error for
// an entry that is damaged or cut short, and any error reading.
func (j *journalReader) next() (payload []byte, more bool, err error) {
	var h [entryHeader]byte
	n, err := j.head(h[:])
	if err != nil {
		return nil, false, err
	}
	if cap(j.body) < int(n) {
		j.body = make([]byte, n)
	}
	body := j.body[:n]
	if _, err := io.ReadFull(j.r, body); err != nil {
		return nil, false, err
	}
	if crc32.Update(crc32.Checksum(h[:4], castagnoli), castagnoli, body) != binary.LittleEndian.Uint32(h[4:]) {
		return nil, false, fmt.Errorf("%w: entry checksum", errCorrupt)
	}
	more = body[0]&entryMore != 0
	switch body[0] &^ entryMore {
	case entryPlain:
		payload = body[1:]
	case entryZstd:
		d := dec{b: body[1:]}
		raw := d.uvarint()
		if d.err != nil {
			return nil, false, d.err
		}
		if j.raw, err = decompress(d.b, raw, j.raw); err != nil {
			return nil, false, err
		}
		payload = j.raw
	default:
		return nil, false, fmt.Errorf("%w: entry flag %d", errCorrupt, body[0])
	}
	j.off += entryHeader + int64(n)
	return payload, more, nil
}

// skip steps over the next entry, which an earlier read checked.
func (j *journalReader) skip() error {
	var h [entryHeader]byte
	n, err := j.head(h[:])
	if err == nil {
		_, err = j.r.Discard(int(n))
		j.off += entryHeader + int64(n)
	}
	return err
}

// head reads the next entry's header into h and returns its payload's length.
func (j *journalReader) head(h []byte) (uint32, error) {
	rest := j.size - j.off
	if rest == 0 {
		return 0, io.EOF
	}
	if rest < entryHeader {
		return 0, fmt.Errorf("%w: partial entry header", errCorrupt)
	}
	if _, err := io.ReadFull(j.r, h); err != nil {
		return 0, err
	}
	n := binary.LittleEndian.Uint32(h)
	if n == 0 || n > maxEntry || int64(n) > rest-entryHeader {
		return 0, fmt.Errorf("%w: entry of %d bytes", errCorrupt, n)
	}
	return n, nil
}

// replay applies the journal's ticks to g and returns the length of its valid prefix, which
// ends with a whole tick; cut says why the rest, if any, was not read.
func replay(b []byte, g *segment, keep Keep) (good int, cut error) {
	if len(b) < journalHeader || [journalHeader]byte(b[:journalHeader]) != journalMagic {
		if len(b) == 0 {
			return 0, nil
		}
		return 0, fmt.Errorf("%w: no journal header", errCorrupt)
	}
	var j journalReader
	j.reset(bytes.NewReader(b), int64(len(b)))
	good = journalHeader
	for {
		payload, more, err := j.next()
		if err == io.EOF && g.inPart {
			err = fmt.Errorf("%w: tick cut short", errCorrupt)
		}
		if err == nil {
			err = g.apply(payload, !more, keep)
		}
		if err == io.EOF {
			return good, nil
		}
		if err != nil {
			g.dropPart()
			return good, err
		}
		if !more {
			good = int(j.off)
		}
	}
}
