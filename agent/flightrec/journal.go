package flightrec

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"

	"github.com/klauspost/compress/zstd"
)

// The journal holds the open segment: a header, then one entry per tick. An entry is its
// payload's length (4 bytes), a CRC-32C of that length and the payload (4 bytes), and the
// payload: a flag byte, 0 for a plain tick or 1 for a zstd-compressed one preceded by its
// plain length. A tick that was not written whole fails its checksum: the tail is cut there.
const (
	journalName   = "journal"
	journalHeader = 8
	entryHeader   = 8
	maxEntry      = 256 << 20

	entryPlain byte = 0
	entryZstd  byte = 1

	// compressAbove: smaller ticks do not gain from a zstd frame's overhead.
	compressAbove = 128
)

var journalMagic = [journalHeader]byte{'N', 'F', 'R', 'J', 1, 0, 0, 0}

// frameEntry appends the journal entry of a plain tick payload to b.
func frameEntry(b, payload []byte, enc *zstd.Encoder) []byte {
	start := len(b)
	b = append(b, make([]byte, entryHeader)...)
	if len(payload) > compressAbove {
		b = append(b, entryZstd)
		b = binary.AppendUvarint(b, uint64(len(payload)))
		b = enc.EncodeAll(payload, b)
	}
	if len(payload) <= compressAbove || len(b)-start-entryHeader > len(payload)+1 {
		b = append(b[:start+entryHeader], entryPlain)
		b = append(b, payload...)
	}
	n := len(b) - start - entryHeader
	binary.LittleEndian.PutUint32(b[start:], uint32(n))
	crc := crc32.Update(crc32.Checksum(b[start:start+4], castagnoli), castagnoli, b[start+entryHeader:])
	binary.LittleEndian.PutUint32(b[start+4:], crc)
	return b
}

// replay applies the journal's ticks to g and returns the length of its valid prefix; cut says
// why the rest, if any, was not read.
func replay(b []byte, g *segment) (good int, cut error) {
	if len(b) < journalHeader || [journalHeader]byte(b[:journalHeader]) != journalMagic {
		if len(b) == 0 {
			return 0, nil
		}
		return 0, fmt.Errorf("%w: no journal header", errCorrupt)
	}
	off := journalHeader
	var buf []byte
	for off < len(b) {
		rest := b[off:]
		if len(rest) < entryHeader {
			return off, fmt.Errorf("%w: partial entry header", errCorrupt)
		}
		n := binary.LittleEndian.Uint32(rest)
		if n == 0 || n > maxEntry || uint64(n) > uint64(len(rest)-entryHeader) {
			return off, fmt.Errorf("%w: entry of %d bytes", errCorrupt, n)
		}
		body := rest[entryHeader : entryHeader+n]
		if crc32.Update(crc32.Checksum(rest[:4], castagnoli), castagnoli, body) != binary.LittleEndian.Uint32(rest[4:]) {
			return off, fmt.Errorf("%w: entry checksum", errCorrupt)
		}
		var payload []byte
		switch body[0] {
		case entryPlain:
			payload = body[1:]
		case entryZstd:
			d := dec{b: body[1:]}
			raw := d.uvarint()
			if d.err != nil {
				return off, d.err
			}
			var err error
			if buf, err = decompress(d.b, raw, buf); err != nil {
				return off, err
			}
			payload = buf
		default:
			return off, fmt.Errorf("%w: entry flag %d", errCorrupt, body[0])
		}
		if err := g.apply(payload); err != nil {
			return off, err
		}
		off += entryHeader + int(n)
	}
	return off, nil
}
