package flightrec

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodectl/nodectl/rundir"
)

// mount mounts for the test and unmounts after it; it skips the test when not root.
func mount(t *testing.T, source, target, fstype string, flags uintptr, data string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a filesystem of its own")
	}
	if err := syscall.Mount(source, target, fstype, flags, data); err != nil {
		t.Skipf("cannot mount %s on %s: %v", source, target, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(target, 0); err != nil {
			syscall.Unmount(target, syscall.MNT_DETACH)
		}
	})
}

// fill writes a file until the filesystem is full.
func fill(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			return
		}
	}
}

// On a full disk Append fails and says so, the Store keeps working, pinned data stays
// readable, and writing resumes once there is room, the lost ticks' values going with the
// first tick written. Then retention frees room itself: a write that finds the disk full
// evicts old unpinned segments and is tried again.
func TestDiskFull(t *testing.T) {
	mnt := filepath.Join(t.TempDir(), "tmpfs")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	mount(t, "tmpfs", mnt, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "size=1m,mode=0700")
	c := &clock{now: t0}
	s := open(t, Options{Dir: filepath.Join(mnt, "rec"), SegmentSpan: 10 * time.Second, Now: c.Now})
	rng := rand.New(rand.NewPCG(8, 8))
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
	mk := func(i int) []rundir.Record { // random values take room
		var recs []rundir.Record
		for j := range 60 {
			recs = append(recs, rundir.Record{Type: rundir.TypeSample, Metric: fmt.Sprintf("m%d", j), Value: fp(float64(rng.Uint64N(1 << 50)))})
		}
		return append(recs, rundir.Record{Type: rundir.TypeEvent, Time: at(i), Message: fmt.Sprint(i)})
	}
	var written []tick // what the store holds, as the model sees it
	var lost []rundir.Record
	add := func(i int, recs []rundir.Record) error {
		c.set(at(i))
		err := s.Append(at(i), recs)
		if err == nil {
			written = append(written, tick{t: at(i), recs: append(lost, recs...)})
			lost = nil
		} else {
			lost = append(lost, recs...)
		}
		return err
	}
	for i := range 40 {
		if err := add(i, mk(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Pin("incident", t0, at(39)); err != nil {
		t.Fatal(err)
	}
	fill(t, filepath.Join(mnt, "filler"))

	var failures int
	i := 40
	for ; i < 60; i++ {
		recs := mk(i)
		if i == 45 { // a series that changes only while writing fails
			recs = append(recs, rundir.Record{Type: rundir.TypeSample, Metric: "only-lost", Value: fp(42)})
		}
		err := add(i, recs)
		if err == nil {
			if failures > 0 {
				t.Fatalf("tick %d written on a full disk", i)
			}
			continue
		}
		failures++
		if !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("tick %d: %v, want ENOSPC", i, err)
		}
	}
	st := s.Status()
	if failures < 10 || st.Writable || st.WriteFailures == 0 || st.LostTicks != int64(failures) ||
		!strings.Contains(st.LastError, "no space") || st.LastErrorTime.IsZero() {
		t.Fatalf("%d ticks failed; status %+v", failures, st)
	}
	from, to := t0.Add(-time.Hour), at(1000)
	same(t, "pinned data on a full disk", readAll(t, s, t0, at(39), 0), expect(written, t0, at(39), 0))

	if err := os.Remove(filepath.Join(mnt, "filler")); err != nil {
		t.Fatal(err)
	}
	if err := add(70, mk(70)); err != nil {
		t.Fatalf("once there is room: %v", err)
	}
	if st := s.Status(); !st.Writable || st.LostTicks != int64(failures) {
		t.Fatalf("after writing again: %+v", st)
	}
	got := readAll(t, s, from, to, 0)
	same(t, "after writing again", got, expect(written, from, to, 0))
	if !slices.ContainsFunc(got, func(r rundir.Record) bool { return r.Metric == "only-lost" && r.Time.Equal(at(70)) && *r.Value == 42 }) {
		t.Error("a value appended while writing failed is not at the next tick written")
	}

	// Full again, with unpinned segments to spare: the write evicts them and succeeds.
	if err := s.Unpin("incident"); err != nil {
		t.Fatal(err)
	}
	fill(t, filepath.Join(mnt, "filler"))
	evicted := s.Status().Evicted
	for i = 71; i < 80; i++ { // enough to need more pages than the journal has
		if err := add(i, mk(i)); err != nil {
			t.Fatalf("tick %d with old segments to evict: %v", i, err)
		}
	}
	if st := s.Status(); st.Evicted == evicted || !st.Writable {
		t.Fatalf("nothing evicted: %+v", st)
	}
}

// A reader of a read-only copy of a crashed store reads it whole and changes nothing; a
// writer refuses it.
func TestReaderReadOnly(t *testing.T) {
	src := t.TempDir()
	ticks := randomTicks(9, 50, 10)
	o := Options{Dir: src, SegmentSpan: 10 * time.Second, Now: func() time.Time { return t0 }}
	s := open(t, o)
	appendAll(t, s, ticks)
	s.Close()
	// What a crash leaves: a torn tick and a half-written segment.
	jf, err := os.OpenFile(filepath.Join(src, journalName), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	jf.Write([]byte{40, 0, 0, 0, 1, 2, 3})
	jf.Close()
	if err := os.WriteFile(filepath.Join(src, segName(time.Now().UnixNano())+tmpSuffix), []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	before := dirState(t, src)

	ro := filepath.Join(t.TempDir(), "ro")
	if err := os.Mkdir(ro, 0o700); err != nil {
		t.Fatal(err)
	}
	mount(t, src, ro, "", syscall.MS_BIND, "")
	mount(t, "", ro, "", syscall.MS_REMOUNT|syscall.MS_BIND|syscall.MS_RDONLY, "")
	rd, err := OpenReader(ro)
	if err != nil {
		t.Fatal(err)
	}
	sp, err := rd.Span()
	if err != nil {
		t.Fatal(err)
	}
	if sp.TornBytes != 7 || !sp.Oldest.Equal(ticks[0].t) || !sp.Newest.Equal(ticks[len(ticks)-1].t) || sp.Segments < 4 {
		t.Fatalf("span %+v", sp)
	}
	from, to := t0.Add(-2*time.Hour), t0.Add(time.Hour)
	same(t, "read-only copy", readAll(t, rd, from, to, 5*time.Second), expect(ticks, from, to, 5*time.Second))
	if s, err := Open(Options{Dir: ro}); err == nil {
		s.Close()
		t.Error("a writer opened a read-only directory")
	}
	if after := dirState(t, src); !slices.Equal(before, after) {
		t.Errorf("reading changed the directory:\n%v\n%v", before, after)
	}
}

// dirState lists a directory's files with their size, mode, time and content.
func dirState(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		sum := ""
		if !d.IsDir() {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			sum = fmt.Sprintf("%x", sha256.Sum256(b))
		}
		out = append(out, fmt.Sprintf("%s %d %v %v %s", path, fi.Size(), fi.Mode(), fi.ModTime().UnixNano(), sum))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
