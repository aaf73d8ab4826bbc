package flightrec

import "encoding/binary"

// compactFloor: a table is compacted only when this many of its slots are free, and more of
// them than are used.
const compactFloor = 1024

// sparse says whether a table of n slots with free of them free is worth compacting.
func sparse(n, free int) bool { return free >= compactFloor && 2*free > n }

// compact renumbers the series, histograms, cgroups and shapes into as few slots as they need
// when a churn left most slots free: free slots are reused but never given back, so a node
// that once ran ten thousand pods would keep their room until the agent restarts. It runs at a
// segment's start, once carry dropped the idle series (commit), and costs a pass over what is
// kept.
func (c *catalogue) compact() {
	if sparse(int(c.nws), len(c.freeWs)) {
		c.compactSeries()
	}
	if sparse(len(c.cgs), len(c.freeCgs)) {
		c.compactCgroups()
	}
	if sparse(len(c.shapes), len(c.freeShapes)) {
		c.compactShapes()
	}
}

// compactSeries moves the hot series to the first slots, cgroup by cgroup, and their
// histograms to the first of hists.
func (c *catalogue) compactSeries() {
	moved := make([]int32, c.nws)
	var ws [][]wseries
	var hists [][]byte
	n := int32(0)
	for cg := range c.cgs {
		g := &c.cgs[cg]
		for j, r := range g.series {
			if n%wsPage == 0 {
				ws = append(ws, make([]wseries, wsPage))
			}
			s := &ws[n/wsPage][n%wsPage]
			*s = *c.series(r.id)
			if s.known && c.kind(s) == kindHist {
				hists = append(hists, c.hists[s.m])
				s.m = int64(len(hists) - 1)
			}
			moved[r.id], g.series[j].id = n, n
			n++
		}
	}
	for i, id := range c.cols {
		if id >= 0 {
			c.cols[i] = moved[id]
		}
	}
	c.ws, c.nws, c.freeWs, c.hists, c.freeHists = ws, n, nil, hists, nil
}

// compactCgroups moves the cgroups to the first slots.
func (c *catalogue) compactCgroups() {
	moved := make([]int32, len(c.cgs))
	cgs := make([]wcgroup, 0, len(c.cgs)-len(c.freeCgs))
	idx := make(map[string]int32, cap(cgs))
	for cg := range c.cgs {
		if g := &c.cgs[cg]; g.n > 0 {
			moved[cg] = int32(len(cgs))
			idx[g.key] = int32(len(cgs))
			for _, r := range g.series {
				c.series(r.id).cg = int32(len(cgs))
			}
			cgs = append(cgs, *g)
		}
	}
	for i, id := range c.cols {
		if id < 0 {
			c.cols[i] = ^moved[^id]
		}
	}
	if c.lastCg >= 0 {
		c.lastCg = moved[c.lastCg]
	}
	c.cgs, c.cgIdx, c.freeCgs = cgs, idx, nil
}

// compactShapes moves the shapes to the first slots; cold cgroups' packs are written again
// with the new numbers.
func (c *catalogue) compactShapes() {
	moved := make([]int32, len(c.shapes))
	shapes := make([]shape, 0, len(c.shapes)-len(c.freeShapes))
	idx := make(map[string]int32, cap(shapes))
	for sh := range c.shapes {
		if s := &c.shapes[sh]; s.refs > 0 {
			moved[sh] = int32(len(shapes))
			idx[s.key] = int32(len(shapes))
			shapes = append(shapes, *s)
		}
	}
	var b []byte
	for cg := range c.cgs {
		g := &c.cgs[cg]
		for j := range g.series {
			g.series[j].shape = moved[g.series[j].shape]
			c.series(g.series[j].id).shape = g.series[j].shape
		}
		if g.cold != nil {
			b = c.renumberCold(b[:0], g.cold, moved)
			g.cold = append(g.cold[:0], b...)
		}
	}
	c.shapes, c.shIdx, c.freeShapes = shapes, idx, nil
}

// renumberCold appends to b the cold pack cold with its shapes renumbered by moved (read with
// the shapes before they move); see coldSeries for the format.
func (c *catalogue) renumberCold(b, cold []byte, moved []int32) []byte {
	d := dec{b: cold}
	for len(d.b) > 0 && d.err == nil {
		sh := d.uvarint()
		b = binary.AppendUvarint(b, uint64(moved[sh]))
		rest := d.b
		d.uvarint() // seen
		d.uvarint() // column
		if d.uvarint() != 0 {
			d.uvarint() // the column's length, after its last tick
		}
		d.skipAbs(c.shapes[sh].key[0])
		b = append(b, rest[:len(rest)-len(d.b)]...)
	}
	if d.err != nil {
		panic("flightrec: a cold cgroup does not decode (a bug): " + d.err.Error())
	}
	return b
}
