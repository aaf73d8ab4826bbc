package flightrec

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"path/filepath"

	"github.com/klauspost/compress/zstd"

	"github.com/nodectl/nodectl/internal/atomicfile"
)

const (
	// sealWindow bounds what a seal holds of the columns: it reads the journal once for each
	// run of columns taking this many bytes (and 12 a column).
	sealWindow = 2 << 20
	// segWindow is the segments' zstd window: alike columns are side by side, a metric's
	// columns of 1,000 cgroups within a few hundred KB.
	segWindow = 1 << 20
)

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

// writeSegment seals the open segment into its file, replaced whole (internal/atomicfile), so
// that a segment file is always whole.
func (s *Store) writeSegment() (sf segFile, err error) {
	o := &s.open
	path := filepath.Join(s.o.Dir, segName(o.ticks[0]))
	f, err := atomicfile.Create(path, 0o600)
	if err != nil {
		return segFile{}, err
	}
	defer f.Abort()
	// A seal a few minutes apart: the encoder's memory goes back to the collector meanwhile.
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderConcurrency(1),
		zstd.WithEncoderCRC(false), zstd.WithWindowSize(segWindow), zstd.WithLowerEncoderMem(true))
	if err != nil {
		return segFile{}, err
	}
	bw := bufio.NewWriterSize(f, 64<<10)
	if _, err := bw.Write(make([]byte, headerSize)); err != nil {
		return segFile{}, err
	}
	h := header{first: o.ticks[0], last: o.ticks[len(o.ticks)-1], minT: o.minT, maxT: o.maxT,
		ticks: uint32(len(o.ticks)), series: uint32(len(s.c.cols)), events: uint32(o.nEvents), samples: uint64(o.samples)}
	cw := &countWriter{w: bw}
	enc.Reset(cw)
	raw, err := s.writeColumns(enc)
	if err != nil {
		return segFile{}, err
	}
	if err := enc.Close(); err != nil {
		return segFile{}, err
	}
	h.colsLen, h.colsRaw, h.colsCRC = cw.n, raw, cw.crc
	if len(o.events) > 0 {
		cw = &countWriter{w: bw}
		enc.Reset(cw)
		if _, err := enc.Write(o.events); err != nil {
			return segFile{}, err
		}
		if err := enc.Close(); err != nil {
			return segFile{}, err
		}
		h.evLen, h.evRaw, h.evCRC = cw.n, uint64(len(o.events)), cw.crc
	}
	if err := bw.Flush(); err != nil {
		return segFile{}, err
	}
	if _, err := f.WriteAt(h.marshal(), 0); err != nil {
		return segFile{}, err
	}
	if err := f.Commit(); err != nil {
		return segFile{}, err
	}
	return segFile{path: path, size: int64(headerSize + h.colsLen + h.evLen), h: h}, nil
}

// writeColumns writes the columns frame's content to w and returns its length: the tick count,
// the first tick and the later ones as varint delta-of-deltas, the series count, each series'
// catalogue entry, first tick and data length, then the data of every series, back to back, in
// column order. The data comes from the journal, a run of columns at a time.
func (s *Store) writeColumns(w io.Writer) (uint64, error) {
	o, c := &s.open, &s.c
	var raw uint64
	b := make([]byte, 0, 64<<10)
	flush := func(full int) error {
		if len(b) < full {
			return nil
		}
		n, err := w.Write(b)
		raw += uint64(n)
		b = b[:0]
		return err
	}
	b = binary.AppendUvarint(b, uint64(len(o.ticks)))
	var prev, delta int64
	for i, t := range o.ticks {
		if i == 0 {
			b = binary.AppendVarint(b, t)
		} else {
			b = binary.AppendVarint(b, t-prev-delta)
			delta = t - prev
		}
		prev = t
		if err := flush(32 << 10); err != nil {
			return raw, err
		}
	}
	ncols := len(c.cols)
	b = binary.AppendUvarint(b, uint64(ncols))
	// The columns' lengths, as varints, and kinds, a bit each, for the runs of columns the
	// journal is read for: sealWindow bytes of data and 12 bytes a column at most.
	lens, hists := make([]byte, 0, ncols+ncols/2), make([]uint64, (ncols+63)/64)
	type run struct{ col, lens int }
	runs := []run{{}}
	var size, data, maxData, maxCols int
	// Where each cold cgroup's series are read up to: its columns come in the order of its series.
	type coldPos struct {
		off, col int32
		seen     int64
	}
	var cold []coldPos
	tick := 0
	for col, ref := range c.cols {
		for tick+1 < len(o.colStart) && int(o.colStart[tick+1]) <= col {
			tick++
		}
		var sh *shape
		var cg *wcgroup
		var clen uint32
		if ref >= 0 {
			ws := c.series(ref)
			sh, cg, clen = &c.shapes[ws.shape], &c.cgs[ws.cg], ws.clen
		} else {
			if cold == nil {
				cold = make([]coldPos, len(c.cgs))
			}
			it, pos := c.coldSeries(^ref), &cold[^ref]
			if pos.off > 0 {
				it.off, it.col, it.seen = int(pos.off), pos.col, pos.seen
			}
			if !it.next() || it.cur.col != int32(col) {
				cgroup, _ := it.g.names()
				return raw, fmt.Errorf("column %d of cold cgroup %q is not found (a bug)", col, cgroup)
			}
			*pos = coldPos{int32(it.off), it.col, it.seen}
			sh, cg, clen = &c.shapes[it.cur.shape], it.g, it.cur.clen
		}
		if r := &runs[len(runs)-1]; col > r.col && size+int(clen)+12 > sealWindow {
			maxCols = max(maxCols, col-r.col)
			runs = append(runs, run{col, len(lens)})
			size, data = 0, 0
		}
		size += int(clen) + 12
		data += int(clen)
		maxData = max(maxData, data)
		lens = binary.AppendUvarint(lens, uint64(clen))
		if sh.key[0] == kindHist {
			hists[col/64] |= 1 << (col % 64)
		}
		b = appendEntry(b, sh, cg)
		b = binary.AppendUvarint(b, uint64(tick))
		b = binary.AppendUvarint(b, uint64(clen))
		if err := flush(32 << 10); err != nil {
			return raw, err
		}
	}
	if err := flush(0); err != nil {
		return raw, err
	}
	cold = nil
	maxCols = max(maxCols, ncols-runs[len(runs)-1].col)
	runs = append(runs, run{ncols, len(lens)})
	kind := func(col int) byte {
		if hists[col/64]&(1<<(col%64)) != 0 {
			return kindHist
		}
		return kindFloat
	}

	var j journalReader
	type entry struct {
		before, defs int  // columns before the entry, and the new series it defines
		more         bool // not its tick's last entry: no changes
	}
	var ents []entry // as the first run read them
	buf := make([]byte, maxData)
	offs, ends, last := make([]uint32, maxCols), make([]uint32, maxCols), make([]int32, maxCols)
	for r := 1; r < len(runs); r++ {
		lo, hi := runs[r-1].col, runs[r].col
		d := dec{b: lens[runs[r-1].lens:runs[r].lens]}
		var n uint32
		for i := range hi - lo {
			l := uint32(d.uvarint())
			offs[i], ends[i], last[i] = n, n+l, 0
			n += l
		}
		data := buf[:n]
		var bad error
		fill := func(col int, tick int32, gap bool, v []byte) {
			if col < lo || col >= hi || bad != nil {
				return
			}
			i := col - lo
			o, g, need := offs[i], uint64(tick-last[i]), len(v)
			if gap {
				need += uvarintLen(g)
			}
			if int(o)+need > int(ends[i]) {
				bad = fmt.Errorf("column %d is longer than written (a bug)", col)
				return
			}
			if gap {
				o += uint32(binary.PutUvarint(data[o:], g))
			}
			offs[i] = o + uint32(copy(data[o:], v))
			last[i] = tick
		}
		j.reset(s.jf, s.jlen)
		before := 0 // columns before the entry
		for e := 0; ; e++ {
			// An entry of new series only, none of them the run's (a segment's first tick
			// is most of its entries), is not decoded again.
			if r > 1 && e < len(ents) && ents[e].more && (ents[e].before+ents[e].defs <= lo || ents[e].before >= hi) {
				if err := j.skip(); err != nil {
					return raw, fmt.Errorf("journal: %w", err)
				}
				before += ents[e].defs
				continue
			}
			p, more, err := j.next()
			if err == io.EOF {
				break
			}
			if err != nil {
				return raw, fmt.Errorf("journal: %w", err)
			}
			h, err := walkTick(p, before, kind,
				func(tick int32, col int, _, v []byte) { fill(col, tick, false, v) },
				func(tick int32, col int, ch []byte) bool { fill(col, tick, true, ch); return col < hi })
			if err == nil {
				err = bad
			}
			if err != nil {
				return raw, fmt.Errorf("journal: %w", err)
			}
			if r == 1 {
				ents = append(ents, entry{before, h.defs, more})
			}
			before += h.defs
		}
		for i := range hi - lo {
			if offs[i] != ends[i] {
				return raw, fmt.Errorf("column %d is shorter than written (a bug)", lo+i)
			}
		}
		if _, err := w.Write(data); err != nil {
			return raw, err
		}
		raw += uint64(len(data))
	}
	return raw, nil
}
