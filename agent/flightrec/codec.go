package flightrec

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
	"unsafe"

	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

// errCorrupt marks bytes that do not decode: a torn journal tail, a damaged segment.
var errCorrupt = errors.New("corrupt data")

// Series kinds, the first byte of a catalogue entry.
const (
	kindFloat byte = 1
	kindHist  byte = 2
)

// maxBuckets bounds a histogram's buckets (hist.Slots is 40), so that a damaged length cannot
// make a decoder allocate much.
const maxBuckets = 64

// Float encodings (a value's mode): most values are integers or decimal fractions a sampler
// made by dividing or multiplying an integer (usec/1e6, ns*1e-9), so they are stored as that
// integer m, whose deltas are small. Modes 0-9 are value = m / 10^mode, modes 10-18 value =
// m * 10^-(mode-9); modeRaw stores the IEEE bits of anything else.
const (
	modeMul1 = 10
	modeLast = 18
	modeRaw  = 0xff
	maxExact = 1 << 53 // beyond this, float64(m) is not exact
)

var (
	pow10    = [10]float64{1, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9}
	negPow10 = [10]float64{1, 1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8, 1e-9}
)

// floatOf returns the value m stands for in mode (not modeRaw).
func floatOf(mode uint8, m int64) float64 {
	if mode < modeMul1 {
		return float64(m) / pow10[mode]
	}
	return float64(m) * negPow10[mode-modeMul1+1]
}

// fits returns the integer standing for v in mode, if mode reproduces v's bits exactly.
func fits(v float64, mode uint8) (int64, bool) {
	var x float64
	if mode < modeMul1 {
		x = v * pow10[mode]
	} else {
		x = v / negPow10[mode-modeMul1+1]
	}
	if !(math.Abs(x) <= maxExact) { // also NaN
		return 0, false
	}
	m := int64(math.Round(x))
	return m, math.Float64bits(floatOf(mode, m)) == math.Float64bits(v)
}

// represent picks v's encoding: prefer if it fits, else the first mode that does, else raw.
func represent(v float64, prefer uint8) (uint8, int64) {
	if prefer != modeRaw {
		if m, ok := fits(v, prefer); ok {
			return prefer, m
		}
	}
	for mode := uint8(0); mode <= modeLast; mode++ {
		if m, ok := fits(v, mode); ok {
			return mode, m
		}
	}
	return modeRaw, 0
}

// val is a series' value: a float (bits, with its encoding mode and m) or a histogram.
type val struct {
	bits  uint64
	mode  uint8
	m     int64
	count uint64
	sum   uint64
	bkt   []uint64
}

func (v *val) equal(kind byte, o *val) bool {
	if kind == kindFloat {
		return v.bits == o.bits
	}
	return v.count == o.count && v.sum == o.sum && slices.Equal(v.bkt, o.bkt)
}

// setHist copies h into v, reusing v's buckets.
func (v *val) setHist(h *hist.Log2) {
	v.count, v.sum = h.Count, h.SumNs
	v.bkt = append(v.bkt[:0], h.Buckets...)
}

func zigzag(d int64) uint64   { return uint64(d<<1) ^ uint64(d>>63) }
func unzigzag(u uint64) int64 { return int64(u>>1) ^ -int64(u&1) }

// appendAbs appends v in full: a series' first value in a segment.
func appendAbs(b []byte, kind byte, v *val) []byte {
	if kind == kindFloat {
		b = append(b, v.mode)
		if v.mode == modeRaw {
			return binary.LittleEndian.AppendUint64(b, v.bits)
		}
		return binary.AppendVarint(b, v.m)
	}
	b = binary.AppendUvarint(b, v.count)
	b = binary.AppendUvarint(b, v.sum)
	b = binary.AppendUvarint(b, uint64(len(v.bkt)))
	for _, c := range v.bkt {
		b = binary.AppendUvarint(b, c)
	}
	return b
}

// appendFloatChange appends the change of a float series from cur to next.bits and sets
// next's mode and m. The common case is one varint, zigzag(m delta)+1; 0 escapes to a value
// in full (a new mode). cur is left alone: it changes only once the change is written.
func appendFloatChange(b []byte, cur, next *val) []byte {
	v := math.Float64frombits(next.bits)
	if cur.mode != modeRaw {
		if m, ok := fits(v, cur.mode); ok {
			next.mode, next.m = cur.mode, m
			return binary.AppendUvarint(b, zigzag(m-cur.m)+1)
		}
	}
	next.mode, next.m = represent(v, modeRaw)
	return appendAbs(append(b, 0), kindFloat, next)
}

// appendHistChange appends the change from cur to next, bucket by bucket.
func appendHistChange(b []byte, cur, next *val) []byte {
	b = binary.AppendUvarint(b, zigzag(int64(next.count-cur.count)))
	b = binary.AppendUvarint(b, zigzag(int64(next.sum-cur.sum)))
	b = binary.AppendUvarint(b, uint64(len(next.bkt)))
	for i, c := range next.bkt {
		var old uint64
		if i < len(cur.bkt) {
			old = cur.bkt[i]
		}
		b = binary.AppendUvarint(b, zigzag(int64(c-old)))
	}
	return b
}

// histEqual says whether h is the histogram b holds in full.
func histEqual(b []byte, h *hist.Log2) bool {
	d := dec{b: b}
	if d.uvarint() != h.Count || d.uvarint() != h.SumNs || d.uvarint() != uint64(len(h.Buckets)) {
		return false
	}
	for _, c := range h.Buckets {
		if d.uvarint() != c {
			return false
		}
	}
	return d.err == nil
}

// set makes v a copy of o, reusing v's buckets.
func (v *val) set(o *val) {
	bkt := append(v.bkt[:0], o.bkt...)
	*v = *o
	v.bkt = bkt
}

// dec reads the encodings; the first error sticks and every later read returns zeros, so that
// callers check once.
type dec struct {
	b   []byte
	err error
}

func (d *dec) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", errCorrupt, what)
	}
	d.b = nil
}

func (d *dec) uvarint() uint64 {
	if len(d.b) > 0 && d.b[0] < 0x80 { // most are one byte
		v := d.b[0]
		d.b = d.b[1:]
		return uint64(v)
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *dec) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *dec) byte() byte {
	if len(d.b) < 1 {
		d.fail("short")
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *dec) u64() uint64 {
	if len(d.b) < 8 {
		d.fail("short")
		return 0
	}
	v := binary.LittleEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

func (d *dec) bytes(n uint64) []byte {
	if n > uint64(len(d.b)) {
		d.fail("short")
		return nil
	}
	s := d.b[:n:n]
	d.b = d.b[n:]
	return s
}

func (d *dec) str() string { return string(d.bytes(d.uvarint())) }

// count reads a number of items each taking at least size bytes, so that a damaged count
// cannot make the caller allocate more than the input could hold.
func (d *dec) count(size int) int {
	n := d.uvarint()
	if n > uint64(len(d.b)/size) {
		d.fail("count beyond the data")
		return 0
	}
	return int(n)
}

// skipStr steps over a string.
func (d *dec) skipStr() { d.bytes(d.uvarint()) }

// abs reads a value in full into v.
func (d *dec) abs(kind byte, v *val) {
	if kind == kindFloat {
		v.mode = d.byte()
		switch {
		case v.mode == modeRaw:
			v.bits, v.m = d.u64(), 0
		case v.mode <= modeLast:
			v.m = d.varint()
			if v.m > maxExact || v.m < -maxExact {
				d.fail("float out of range")
			}
			v.bits = math.Float64bits(floatOf(v.mode, v.m))
		default:
			d.fail("bad float mode")
		}
		return
	}
	v.count, v.sum = d.uvarint(), d.uvarint()
	n := d.uvarint()
	if n > maxBuckets {
		d.fail("too many buckets")
		return
	}
	v.bkt = v.bkt[:0]
	for range n {
		v.bkt = append(v.bkt, d.uvarint())
	}
}

// change applies a change written by appendFloatChange or appendHistChange to v.
func (d *dec) change(kind byte, v *val) {
	if kind == kindHist {
		v.count += uint64(unzigzag(d.uvarint()))
		v.sum += uint64(unzigzag(d.uvarint()))
		n := d.uvarint()
		if n > maxBuckets {
			d.fail("too many buckets")
			return
		}
		for i := range int(n) {
			if i == len(v.bkt) {
				v.bkt = append(v.bkt, 0)
			}
			v.bkt[i] += uint64(unzigzag(d.uvarint()))
		}
		v.bkt = v.bkt[:n]
		return
	}
	u := d.uvarint()
	if u == 0 {
		d.abs(kindFloat, v)
		return
	}
	if v.mode == modeRaw {
		d.fail("delta of a raw float")
		return
	}
	m := v.m + unzigzag(u-1)
	if m > maxExact || m < -maxExact {
		d.fail("float out of range")
		return
	}
	v.m, v.bits = m, math.Float64bits(floatOf(v.mode, m))
}

// A catalogue entry names a series: kind, metric, cgroup, workload and the labels sorted by
// key. Its bytes are the series' identity. The writer keeps the cgroup and workload apart from
// the rest, its shape (see appendShape), and puts them together with appendEntry.
func appendEntry(b []byte, sh *shape, cg *wcgroup) []byte {
	b = append(b, sh.key[:sh.split]...)
	b = append(b, cg.key...)
	return append(b, sh.key[sh.split:]...)
}

// appendShape appends a sample's shape: its kind, metric and labels as its catalogue entry has
// them. It returns where the labels start.
func appendShape(b []byte, kind byte, r *rundir.Record) ([]byte, int) {
	b = appendStr(append(b, kind), r.Metric)
	n := len(b)
	return appendLabels(b, r.Labels), n
}

func appendStr(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

func appendLabels(b []byte, labels map[string]string) []byte {
	b = binary.AppendUvarint(b, uint64(len(labels)))
	if len(labels) == 1 { // the common case, without sorting
		for k, v := range labels {
			b = appendStr(appendStr(b, k), v)
		}
		return b
	}
	var scratch [8]string
	keys := scratch[:0]
	for k := range labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		b = appendStr(appendStr(b, k), labels[k])
	}
	return b
}

func (d *dec) labels() map[string]string {
	n := d.count(2)
	if n == 0 {
		return nil
	}
	m := make(map[string]string, n)
	for range n {
		k := d.str()
		m[k] = d.str()
	}
	return m
}

// entry steps over a catalogue entry and returns its bytes.
func (d *dec) entry() []byte {
	start := d.b
	if k := d.byte(); k != kindFloat && k != kindHist {
		d.fail("bad series kind")
	}
	d.skipStr()
	d.skipStr()
	d.skipStr()
	for range d.count(2) {
		d.skipStr()
		d.skipStr()
	}
	if d.err != nil {
		return nil
	}
	return start[:len(start)-len(d.b)]
}

// splitEntry splits a catalogue entry into its shape, appended to b with where its labels
// start, and its cgroup and workload.
func splitEntry(b []byte, e string) (shape []byte, split int, cgroup, workload string, err error) {
	d := dec{b: []byte(e)}
	d.byte()
	d.skipStr()
	split = len(e) - len(d.b)
	cgroup, workload = d.str(), d.str()
	if d.err != nil {
		return nil, 0, "", "", d.err
	}
	return append(append(b, e[:split]...), d.b...), split, cgroup, workload, nil
}

// seriesInfo is a decoded catalogue entry; records read share its labels map.
type seriesInfo struct {
	kind                     byte
	metric, cgroup, workload string
	labels                   map[string]string
}

func parseEntry(e string, in *interner) (seriesInfo, error) {
	// Read in place: the decoder only reads, and what it returns is copied out by the interner.
	d := dec{b: unsafe.Slice(unsafe.StringData(e), len(e))}
	s := seriesInfo{kind: d.byte(), metric: in.str(&d), cgroup: in.str(&d), workload: in.str(&d)}
	s.labels = in.labels(&d)
	return s, d.err
}

// interner hands out one copy of each string and label set a read decodes: a cgroup's path is
// in each of its tens of series, a label set such as kind=anon in a series of every cgroup.
// Decoding a copy of each was most of what reading a window of 1,000 cgroups allocated
// (BenchmarkIncidentAnalysis). Label sets are shared: never modify one.
type interner struct {
	strs map[string]string
	sets map[string]map[string]string // label sets by their encoding
}

func newInterner() *interner {
	return &interner{strs: map[string]string{}, sets: map[string]map[string]string{}}
}

func (in *interner) str(d *dec) string {
	b := d.bytes(d.uvarint())
	if s, ok := in.strs[string(b)]; ok {
		return s
	}
	s := string(b)
	in.strs[s] = s
	return s
}

func (in *interner) labels(d *dec) map[string]string {
	start := d.b
	for range d.count(2) {
		d.skipStr()
		d.skipStr()
	}
	raw := start[:len(start)-len(d.b)]
	if m, ok := in.sets[string(raw)]; ok || d.err != nil {
		return m
	}
	m := (&dec{b: raw}).labels()
	in.sets[string(raw)] = m
	return m
}

// Events and phases, and any record that is not a sample, are kept whole.
const (
	recValue byte = 1 << iota
	recHist
)

func appendRecord(b []byte, r *rundir.Record) []byte {
	b = binary.AppendVarint(b, r.Time.Unix())
	b = binary.AppendUvarint(b, uint64(r.Time.Nanosecond()))
	for _, s := range []string{r.Type, r.Metric, r.Cgroup, r.Workload, r.Name, r.Event, r.Message} {
		b = appendStr(b, s)
	}
	b = appendLabels(b, r.Labels)
	var flags byte
	if r.Value != nil {
		flags |= recValue
	}
	if r.Hist != nil {
		flags |= recHist
	}
	b = append(b, flags)
	if r.Value != nil {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(*r.Value))
	}
	if r.Hist != nil {
		var v val
		v.setHist(r.Hist)
		b = appendAbs(b, kindHist, &v)
	}
	return b
}

// recordTime reads only the time of an encoded record.
func (d *dec) recordTime() time.Time {
	sec, nsec := d.varint(), d.uvarint()
	if nsec >= 1e9 {
		d.fail("bad nanoseconds")
		return time.Time{}
	}
	return time.Unix(sec, int64(nsec)).UTC()
}

func (d *dec) record() rundir.Record {
	r := rundir.Record{Time: d.recordTime()}
	for _, s := range []*string{&r.Type, &r.Metric, &r.Cgroup, &r.Workload, &r.Name, &r.Event, &r.Message} {
		*s = d.str()
	}
	r.Labels = d.labels()
	flags := d.byte()
	if flags&^(recValue|recHist) != 0 {
		d.fail("bad record flags")
	}
	if flags&recValue != 0 {
		v := math.Float64frombits(d.u64())
		r.Value = &v
	}
	if flags&recHist != 0 {
		var v val
		d.abs(kindHist, &v)
		r.Hist = &hist.Log2{Buckets: v.bkt, Count: v.count, SumNs: v.sum}
	}
	return r
}

// skipRecord steps over an encoded record, checking it as record does without decoding it,
// and returns its time.
func (d *dec) skipRecord() time.Time {
	t := d.recordTime()
	for range 7 {
		d.skipStr()
	}
	for range d.count(2) {
		d.skipStr()
		d.skipStr()
	}
	flags := d.byte()
	if flags&^(recValue|recHist) != 0 {
		d.fail("bad record flags")
	}
	if flags&recValue != 0 {
		d.bytes(8)
	}
	if flags&recHist != 0 {
		d.skipAbs(kindHist)
	}
	return t
}

// skipAbs steps over a value in full, checking only its shape.
func (d *dec) skipAbs(kind byte) {
	if kind == kindHist {
		d.uvarint()
		d.uvarint()
		d.skipBuckets()
		return
	}
	switch mode := d.byte(); {
	case mode == modeRaw:
		d.bytes(8)
	case mode <= modeLast:
		d.varint()
	default:
		d.fail("bad float mode")
	}
}

// skipChange steps over a change, checking only its shape.
func (d *dec) skipChange(kind byte) {
	if kind == kindHist {
		d.uvarint()
		d.uvarint()
		d.skipBuckets()
		return
	}
	if d.uvarint() == 0 {
		d.skipAbs(kindFloat)
	}
}

func (d *dec) skipBuckets() {
	n := d.uvarint()
	if n > maxBuckets {
		d.fail("too many buckets")
		return
	}
	for range n {
		d.uvarint()
	}
}
