package flightrec

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

// writerEnv makes the test binary the writer TestKill9 kills: it appends killTick(i) to the
// directory it names, from the tick after its newest, and prints i after each Append.
const writerEnv = "FLIGHTREC_TEST_WRITER"

const killSeries = 8

// killTick is tick i of the killed writer: series j holds i/(j+1) (s0 changes every tick), a
// histogram holds i events, and every fifth tick has an event.
func killTick(i int) []rundir.Record {
	var recs []rundir.Record
	for j := range killSeries {
		recs = append(recs, rundir.Record{Type: rundir.TypeSample, Metric: fmt.Sprintf("s%d", j), Cgroup: "/c", Value: fp(float64(i / (j + 1)))})
	}
	h := &hist.Log2{Buckets: []uint64{uint64(i), uint64(i / 2)}, Count: uint64(i + i/2), SumNs: uint64(i) * 1000}
	recs = append(recs, rundir.Record{Type: rundir.TypeSample, Metric: "h", Cgroup: "/c", Hist: h})
	if i%5 == 0 {
		recs = append(recs, rundir.Record{Type: rundir.TypeEvent, Time: killAt(i), Name: "tick", Message: strconv.Itoa(i)})
	}
	return recs
}

func killAt(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }

func runWriter(dir string) {
	var now time.Time
	// Fake tick times, as fast as it goes, so that segments are sealed often and the kill
	// may come in the middle of one.
	s, err := Open(Options{Dir: dir, SegmentSpan: 5 * time.Second, Now: func() time.Time { return now }})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	next := 0
	if st := s.Status(); !st.Newest.IsZero() {
		next = int(st.Newest.Sub(t0)/time.Second) + 1
	}
	for i := next; ; i++ {
		now = killAt(i)
		if err := s.Append(now, killTick(i)); err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println(i)
	}
}

// A writer killed with SIGKILL at any moment loses no tick Append returned for; the next
// writer picks up where it stopped.
func TestKill9(t *testing.T) {
	if dir := os.Getenv(writerEnv); dir != "" {
		runWriter(dir)
		return
	}
	dir := t.TempDir()
	acked := -1
	for round := range 4 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestKill9$")
		cmd.Env = append(os.Environ(), writerEnv+"="+dir)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		for n := 0; n < 40+round*60 && sc.Scan(); n++ {
			i, err := strconv.Atoi(sc.Text())
			if err != nil {
				cmd.Process.Kill()
				t.Fatalf("writer: %s", sc.Text())
			}
			if i != acked+1 {
				cmd.Process.Kill()
				t.Fatalf("writer went on at tick %d after %d", i, acked)
			}
			acked = i
		}
		// Let it run on a little, then SIGKILL it.
		time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		cmd.Wait()
		acked = checkKilled(t, dir, acked)
	}
}

// checkKilled checks that the directory holds ticks 0 to at least acked, each whole, and
// returns the newest.
func checkKilled(t *testing.T, dir string, acked int) int {
	t.Helper()
	rd, err := OpenReader(dir)
	if err != nil {
		t.Fatal(err)
	}
	sp, err := rd.Span()
	if err != nil {
		t.Fatal(err)
	}
	newest := int(sp.Newest.Sub(t0) / time.Second)
	if newest < acked || len(sp.Corrupt) > 0 {
		t.Fatalf("after the kill: newest tick %d, acknowledged %d; %+v", newest, acked, sp)
	}
	var want []rundir.Record
	for i := 0; i <= newest; i++ {
		for _, r := range killTick(i) {
			if r.Type == rundir.TypeSample {
				if i > 0 && sameValue(r, killTick(i - 1)[slices.IndexFunc(killTick(i-1), func(o rundir.Record) bool { return o.Metric == r.Metric })]) {
					continue
				}
				r.Time = killAt(i)
			}
			want = append(want, r)
		}
	}
	same(t, "reader after kill", readAll(t, rd, t0, killAt(newest+10), 0), want)
	s, err := Open(Options{Dir: dir, SegmentSpan: 5 * time.Second, Now: func() time.Time { return killAt(newest) }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	st := s.Status()
	t.Logf("killed after tick %d, newest %d: %d segments, journal %d bytes, torn tail %d bytes", acked, newest, st.Segments, st.JournalBytes, st.TornBytes)
	same(t, "writer after kill", readAll(t, s, t0, killAt(newest+10), 0), want)
	return newest
}

// entryEnds returns where each tick of a journal ends.
func entryEnds(t *testing.T, j []byte) []int {
	t.Helper()
	var ends []int
	for off := journalHeader; off < len(j); {
		off += entryHeader + int(binary.LittleEndian.Uint32(j[off:]))
		ends = append(ends, off)
	}
	if len(ends) == 0 || ends[len(ends)-1] != len(j) {
		t.Fatalf("journal of %d bytes ends at %v", len(j), ends)
	}
	return ends
}

// A journal cut or damaged at any byte reads up to the last whole tick before the damage; the
// rest is reported torn and, by a writer, cut, and writing goes on after it.
func TestTornJournal(t *testing.T) {
	ticks := randomTicks(5, 12, 6)
	src := t.TempDir()
	o := Options{Dir: src, SegmentSpan: time.Hour, Now: func() time.Time { return t0 }}
	s := open(t, o)
	appendAll(t, s, ticks)
	s.Close()
	j, err := os.ReadFile(filepath.Join(src, journalName))
	if err != nil {
		t.Fatal(err)
	}
	ends := entryEnds(t, j)
	if len(ends) != len(ticks) {
		t.Fatalf("%d entries for %d ticks", len(ends), len(ticks))
	}
	from, to := t0.Add(-2*time.Hour), t0.Add(time.Hour)
	dir := t.TempDir()
	rd, err := OpenReader(dir)
	if err != nil {
		t.Fatal(err)
	}
	// whole is how many ticks end at or before n bytes.
	whole := func(n int) int {
		return len(ends) - len(slices.DeleteFunc(slices.Clone(ends), func(e int) bool { return e <= n }))
	}
	check := func(what string, b []byte, k int, torn int) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, journalName), b, 0o600); err != nil {
			t.Fatal(err)
		}
		sp, err := rd.Span()
		if err != nil {
			t.Fatal(err)
		}
		if torn >= 0 && sp.TornBytes != int64(torn) {
			t.Fatalf("%s: torn %d bytes, want %d", what, sp.TornBytes, torn)
		}
		same(t, what, readAll(t, rd, from, to, 0), expect(ticks[:k], from, to, 0))
	}
	// good is the valid length of the journal cut at n.
	good := func(n int) int {
		switch k := whole(n); {
		case k > 0:
			return ends[k-1]
		case n >= journalHeader:
			return journalHeader
		}
		return 0
	}
	for n := 0; n <= len(j); n++ {
		check(fmt.Sprintf("cut at %d", n), j[:n], whole(n), n-good(n))
	}
	for p := range j {
		b := slices.Clone(j)
		b[p] ^= 0x5a
		k := whole(p)
		if p < journalHeader {
			k = 0
		}
		check(fmt.Sprintf("byte %d damaged", p), b, k, -1)
	}

	// A writer cuts the tail and goes on.
	for _, n := range []int{3, journalHeader + 1, ends[0] - 1, ends[3] + 5, len(j) - 1} {
		wdir := t.TempDir()
		if err := os.WriteFile(filepath.Join(wdir, journalName), j[:n], 0o600); err != nil {
			t.Fatal(err)
		}
		o.Dir = wdir
		s, err := Open(o)
		if err != nil {
			t.Fatal(err)
		}
		k := whole(n)
		if st := s.Status(); st.TornBytes != int64(n-good(n)) {
			t.Errorf("cut at %d: torn %d bytes, want %d", n, st.TornBytes, n-good(n))
		}
		next := tick{t: ticks[len(ticks)-1].t.Add(time.Second), recs: ticks[len(ticks)-1].recs}
		if err := s.Append(next.t, next.recs); err != nil {
			t.Fatal(err)
		}
		s.Close()
		s = open(t, o)
		if st := s.Status(); st.TornBytes != 0 {
			t.Errorf("cut at %d: torn again after the writer cut it: %+v", n, st)
		}
		want := append(slices.Clone(ticks[:k]), next)
		same(t, fmt.Sprintf("cut at %d, then a tick", n), readAll(t, s, from, to, 0), expect(want, from, to, 0))
		s.Close()
	}
}

// A damaged segment is skipped by readers and set aside by the writer; what is before and
// after it reads as before.
func TestDamagedSegment(t *testing.T) {
	ticks := randomTicks(6, 45, 8)
	for i := range ticks { // late events would put the damaged segment's in every window
		ticks[i].recs = slices.DeleteFunc(ticks[i].recs, func(r rundir.Record) bool { return r.Type != rundir.TypeSample && r.Time.Before(t0) })
	}
	dir := t.TempDir()
	o := Options{Dir: dir, SegmentSpan: 10 * time.Second, Now: func() time.Time { return t0 }}
	s := open(t, o)
	appendAll(t, s, ticks)
	s.Close()
	names := segNames(t, dir)
	if len(names) < 3 {
		t.Fatalf("segments %v", names)
	}
	name := names[1]
	path := filepath.Join(dir, name)
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := openSegFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// The windows before and after the damaged segment.
	var before, after [2]time.Time
	for _, tk := range ticks {
		if tk.t.UnixNano() < f.h.first {
			before = [2]time.Time{t0.Add(-time.Hour), tk.t}
		}
		if tk.t.UnixNano() > f.h.last && after[0].IsZero() {
			after = [2]time.Time{tk.t, t0.Add(time.Hour)}
		}
	}
	wantBefore := expect(ticks, before[0], before[1], 0)
	wantAfter := expect(ticks, after[0], after[1], 0)
	rd, err := OpenReader(dir)
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, r reader, corrupt func() []string) {
		t.Helper()
		same(t, what+": before", readAll(t, r, before[0], before[1], 0), wantBefore)
		same(t, what+": after", readAll(t, r, after[0], after[1], 0), wantAfter)
		readAll(t, r, before[0], after[1], 0)
		if c := corrupt(); !slices.ContainsFunc(c, func(s string) bool { return strings.HasPrefix(s, name) }) {
			t.Fatalf("%s: not reported: %v", what, c)
		}
	}
	var damaged [][]byte
	var whats []string
	for p := 0; p < len(orig); p++ {
		if p < headerSize || p%13 == 0 || p == len(orig)-1 {
			b := slices.Clone(orig)
			b[p] ^= 0x5a
			damaged, whats = append(damaged, b), append(whats, fmt.Sprintf("byte %d damaged", p))
		}
	}
	for _, n := range []int{0, 50, headerSize, headerSize + 1, len(orig) / 2, len(orig) - 1} {
		damaged, whats = append(damaged, orig[:n]), append(whats, fmt.Sprintf("cut at %d", n))
	}
	damaged, whats = append(damaged, append(slices.Clone(orig), 0)), append(whats, "a byte too many")
	for i, b := range damaged {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		rd.bad = map[string]string{}
		check(whats[i], rd, func() []string { sp, _ := rd.Span(); return sp.Corrupt })
		if i%20 != 0 && i < len(damaged)-7 {
			continue
		}
		// The writer sets it aside, at Open for a damaged header, at the first Read else.
		s := open(t, o)
		check(whats[i]+" (writer)", s, func() []string { return s.Status().Corrupt })
		s.Close()
		if _, err := os.Stat(path + badSuffix); err != nil {
			t.Fatalf("%s: not set aside: %v", whats[i], err)
		}
		os.Remove(path + badSuffix)
	}
}

// A crash between sealing a segment and emptying the journal leaves a journal holding the
// segment's ticks: readers and the writer ignore it.
func TestStaleJournal(t *testing.T) {
	ticks := randomTicks(7, 30, 6)
	k := slices.IndexFunc(ticks, func(tk tick) bool { return tk.t.Sub(t0) >= 20*time.Second }) // starts a segment
	dir := t.TempDir()
	o := Options{Dir: dir, SegmentSpan: 20 * time.Second, Now: func() time.Time { return t0 }}
	s := open(t, o)
	appendAll(t, s, ticks[:k])
	s.Close()
	journal := filepath.Join(dir, journalName)
	stale, err := os.ReadFile(journal)
	if err != nil {
		t.Fatal(err)
	}
	s = open(t, o)
	appendAll(t, s, ticks[k:k+1])
	s.Close()
	if err := os.WriteFile(journal, stale, 0o600); err != nil {
		t.Fatal(err)
	}
	from, to := t0.Add(-2*time.Hour), t0.Add(time.Hour)
	want := expect(ticks[:k], from, to, 0)
	rd, err := OpenReader(dir)
	if err != nil {
		t.Fatal(err)
	}
	same(t, "reader", readAll(t, rd, from, to, 0), want)
	s = open(t, o)
	same(t, "writer", readAll(t, s, from, to, 0), want)
	appendAll(t, s, ticks[k:])
	same(t, "writer, going on", readAll(t, s, from, to, 0), expect(ticks, from, to, 0))
}

// A tick defining more series than an entry holds takes several: cut or damaged in any of
// them, it is dropped whole and the ticks before it read as before; a writer cuts it off and
// goes on.
func TestTornLongTick(t *testing.T) {
	ticks := randomTicks(9, 6, 6)
	for j := range 5000 {
		ticks[3].recs = append(ticks[3].recs, rundir.Record{Type: rundir.TypeSample, Metric: fmt.Sprintf("wide_%d", j),
			Cgroup: "/kubepods/" + strings.Repeat("x", 60), Value: fp(float64(j))})
	}
	src := t.TempDir()
	o := Options{Dir: src, SegmentSpan: time.Hour, Now: func() time.Time { return t0 }}
	s := open(t, o)
	appendAll(t, s, ticks)
	s.Close()
	j, err := os.ReadFile(filepath.Join(src, journalName))
	if err != nil {
		t.Fatal(err)
	}
	ends := entryEnds(t, j)
	if len(ends) < len(ticks)+2 {
		t.Fatalf("%d entries for %d ticks: the long one is not in several", len(ends), len(ticks))
	}
	// whole is how many ticks end at or before n bytes; good is where the last of them ends.
	whole := func(n int) (k, good int) {
		good, start := journalHeader, journalHeader
		for _, e := range ends {
			if e > n {
				break
			}
			if j[start+entryHeader]&entryMore == 0 {
				k, good = k+1, e
			}
			start = e
		}
		return k, good
	}
	from, to := t0.Add(-2*time.Hour), t0.Add(time.Hour)
	dir := t.TempDir()
	rd, err := OpenReader(dir)
	if err != nil {
		t.Fatal(err)
	}
	var cuts []int
	for _, e := range ends {
		cuts = append(cuts, e, e-1, e-entryHeader-3)
	}
	for _, n := range cuts {
		b := j[:n]
		k, good := whole(n)
		for _, damaged := range []bool{false, true} {
			what := fmt.Sprintf("cut at %d", n)
			if damaged { // the byte before the cut instead, the rest kept
				b = slices.Clone(j)
				b[n-1] ^= 0x5a
				k, good = whole(n - 1)
				what = fmt.Sprintf("byte %d damaged", n-1)
			}
			if err := os.WriteFile(filepath.Join(dir, journalName), b, 0o600); err != nil {
				t.Fatal(err)
			}
			sp, err := rd.Span()
			if err != nil {
				t.Fatal(err)
			}
			if !damaged && sp.TornBytes != int64(n-good) {
				t.Fatalf("%s: torn %d bytes, want %d", what, sp.TornBytes, n-good)
			}
			same(t, what, readAll(t, rd, from, to, 0), expect(ticks[:k], from, to, 0))
		}
	}

	// A writer cuts the long tick's entries off and goes on.
	for _, n := range cuts {
		if k, _ := whole(n); k != 3 {
			continue
		}
		wdir := t.TempDir()
		if err := os.WriteFile(filepath.Join(wdir, journalName), j[:n], 0o600); err != nil {
			t.Fatal(err)
		}
		o.Dir = wdir
		s := open(t, o)
		next := tick{t: ticks[3].t, recs: ticks[2].recs}
		if err := s.Append(next.t, next.recs); err != nil {
			t.Fatal(err)
		}
		s.Close()
		s = open(t, o)
		same(t, fmt.Sprintf("cut at %d, then a tick", n), readAll(t, s, from, to, 0), expect(append(slices.Clone(ticks[:3]), next), from, to, 0))
		s.Close()
	}
}

// A crash in a seal or a pins save leaves a half-written replacement (internal/atomicfile's,
// or an older agent's ".tmp"): readers skip it, and the writer removes it and reads the same.
func TestHalfWrittenReplacementsRemoved(t *testing.T) {
	ticks := randomTicks(11, 30, 6)
	dir := t.TempDir()
	o := Options{Dir: dir, SegmentSpan: 10 * time.Second, Now: func() time.Time { return t0 }}
	s := open(t, o)
	appendAll(t, s, ticks)
	s.Close()
	seg := segName(t0.Add(time.Hour).UnixNano())
	half := []string{"." + seg + "8123456", seg + tmpSuffix, "." + pinsName + "42"}
	for _, name := range half {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("half"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	from, to := t0.Add(-2*time.Hour), t0.Add(2*time.Hour)
	want := expect(ticks, from, to, 0)
	rd, err := OpenReader(dir)
	if err != nil {
		t.Fatal(err)
	}
	same(t, "reader", readAll(t, rd, from, to, 0), want)
	s = open(t, o)
	defer s.Close()
	same(t, "writer", readAll(t, s, from, to, 0), want)
	for _, name := range half {
		if _, err := os.Stat(filepath.Join(dir, name)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s left after the writer opened: %v", name, err)
		}
	}
}
