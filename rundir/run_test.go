package rundir

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodectl/nodectl/rundir/hist"
)

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func f64(v float64) *float64 { return &v }

func at(sec float64) time.Time { return t0.Add(time.Duration(sec * float64(time.Second))) }

func TestWriteThenOpen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	w, err := Create(dir, Meta{ID: "r1", Scenario: "noisy", Start: t0, Interval: Duration(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	const writers, batches = 4, 50
	var wg sync.WaitGroup
	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range batches {
				h := hist.FromSlots([]uint64{0, 3, 1}, 4, 1000)
				err := w.Append(
					Record{Type: TypeSample, Time: at(float64(i)), Metric: MetricRunqLatency, Cgroup: "/a", Hist: &h},
					Record{Type: TypeSample, Time: at(float64(i)), Metric: MetricCPUUsage, Cgroup: "/a",
						Labels: map[string]string{"g": string(rune('0' + g))}, Value: f64(float64(i))},
				)
				if err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if err := w.UpdateMeta(func(m *Meta) {
		m.Workloads = append(m.Workloads, Workload{Name: "victim", Kind: "victim", Cgroup: "/a"})
	}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if err := w.Append(Record{Type: TypeEvent, Time: t0}); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("append after close: got %v, want os.ErrClosed", err)
	}

	run, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if run.Torn {
		t.Error("clean run reported torn")
	}
	if run.Meta.Format != FormatVersion || run.Meta.ID != "r1" || len(run.Meta.Workloads) != 1 {
		t.Errorf("meta = %+v", run.Meta)
	}
	if got, want := len(run.Records), writers*batches*2; got != want {
		t.Fatalf("read %d records, want %d", got, want)
	}
	// Each batch is one write: its two records stay adjacent.
	for i := 0; i < len(run.Records); i += 2 {
		a, b := run.Records[i], run.Records[i+1]
		if a.Metric != MetricRunqLatency || b.Metric != MetricCPUUsage || !a.Time.Equal(b.Time) {
			t.Fatalf("records %d and %d are not one batch: %+v %+v", i, i+1, a, b)
		}
	}
	if h := run.Records[0].Hist; h == nil || h.Count != 4 || h.SumNs != 1000 {
		t.Errorf("histogram did not round-trip: %+v", h)
	}
	leftovers, _ := filepath.Glob(filepath.Join(dir, "*.tmp-*"))
	if len(leftovers) > 0 {
		t.Errorf("temporary files left: %v", leftovers)
	}
}

func TestCreateRefusesNonEmptyDirectory(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "x"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Create(dir, Meta{}); err == nil {
		t.Fatal("Create accepted a non-empty directory")
	}
	// An existing empty directory is fine.
	w, err := Create(t.TempDir(), Meta{})
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
}

// writeRun makes a run directory with the given meta.json and records.jsonl contents.
func writeRun(t *testing.T, meta, records string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, MetaFile), []byte(meta), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, RecordsFile), []byte(records), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

const (
	goodMeta = `{"format":"nodectl-run/1","id":"r"}`
	line1    = `{"type":"phase","t":"2025-01-02T03:04:05Z","name":"baseline","event":"start"}` + "\n"
	line2    = `{"type":"sample","t":"2025-01-02T03:04:06Z","metric":"cpu_usage_seconds_total","cgroup":"/a","value":1.5}` + "\n"
)

func TestOpenTornLastRecord(t *testing.T) {
	for name, tail := range map[string]string{
		"no_newline":              `{"type":"sample","t":"2025-01-02T03:04:07Z","metric":"x","val`,
		"complete_but_no_newline": strings.TrimSuffix(line2, "\n"),
		"garbage_with_newline":    "{\"type\":\"sam\n",
		"zero_filled":             "\x00\x00\x00\x00\x00\x00",
	} {
		t.Run(name, func(t *testing.T) {
			run, err := Open(writeRun(t, goodMeta, line1+line2+tail))
			if err != nil {
				t.Fatal(err)
			}
			if !run.Torn {
				t.Error("torn last record not reported")
			}
			if len(run.Records) != 2 || run.Records[1].Value == nil || *run.Records[1].Value != 1.5 {
				t.Errorf("records = %+v, want the two complete ones", run.Records)
			}
		})
	}
}

func TestOpenCorruptRecordIsAnError(t *testing.T) {
	_, err := Open(writeRun(t, goodMeta, line1+"{not json}\n"+line2))
	if err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("got %v, want an error naming line 2", err)
	}
}

// A line far longer than any record (a crafted or damaged file) is refused at the bound, not
// read whole into memory.
func TestOpenRefusesAHugeLine(t *testing.T) {
	huge := `{"type":"event","t":"2025-01-02T03:04:06Z","message":"` + strings.Repeat("x", 8<<20) + `"}` + "\n"
	dir := writeRun(t, goodMeta, line1+huge+line2)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := Open(dir)
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "line 2: a line longer than") {
		t.Fatalf("got %v, want line 2 refused for its length", err)
	}
	if grown := after.TotalAlloc - before.TotalAlloc; grown >= 8<<20 {
		t.Errorf("reading allocated %d MiB for an 8 MiB line, want less than the line: a few times the 1 MiB bound", grown>>20)
	}
}

func TestOpenKeepsUnknownRecordTypesAndFields(t *testing.T) {
	run, err := Open(writeRun(t, `{"format":"nodectl-run/1.4","id":"r","future":true}`,
		line1+`{"type":"future-thing","t":"2025-01-02T03:04:06Z","shiny":[1,2]}`+"\n"+line2))
	if err != nil {
		t.Fatal(err)
	}
	if len(run.Records) != 3 || run.Records[1].Type != "future-thing" {
		t.Errorf("records = %+v", run.Records)
	}
}

func TestOpenChecksFormat(t *testing.T) {
	for name, tc := range map[string]struct {
		format string
		want   string // substring of the error, "" for success
	}{
		"current":       {format: FormatVersion},
		"newer_minor":   {format: "nodectl-run/1.7"},
		"segmented":     {format: FormatVersionSegmented},
		"newer_major":   {format: "nodectl-run/3", want: "major version 3"},
		"missing":       {format: "", want: "unknown run format"},
		"other_format":  {format: "something/1", want: "unknown run format"},
		"garbled_major": {format: "nodectl-run/x", want: "unknown run format"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Open(writeRun(t, `{"format":"`+tc.format+`"}`, line1))
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused %q: %v", tc.format, err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("format %q: got %v, want an error containing %q", tc.format, err, tc.want)
			}
		})
	}
}

func TestWriteFindings(t *testing.T) {
	dir := t.TempDir()
	for _, v := range []string{"first", "second"} {
		if err := WriteFindings(dir, map[string]string{"id": v}); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, FindingsFile))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), "{\n  \"id\": \"second\"\n}\n"; got != want {
		t.Errorf("findings.json = %q, want %q", got, want)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d files, want only findings.json", len(entries))
	}
}

func TestUpdateMetaKeepsOldCopyOnFailure(t *testing.T) {
	dir := t.TempDir()
	w, err := Create(dir, Meta{ID: "r", Tracer: map[string]string{"runq": "attached"}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.UpdateMeta(func(m *Meta) { m.Tracer["fsync"] = "attached" }); err != nil {
		t.Fatal(err)
	}
	// With the directory moved away, the rewrite fails and must leave the writer's copy alone.
	moved := dir + ".moved"
	if err := os.Rename(dir, moved); err != nil {
		t.Fatal(err)
	}
	err = w.UpdateMeta(func(m *Meta) { m.Tracer["blk"] = "attached"; m.ID = "changed" })
	if err := os.Rename(moved, dir); err != nil {
		t.Fatal(err)
	}
	if err == nil {
		t.Fatal("update of a missing directory succeeded")
	}
	if err := w.UpdateMeta(func(*Meta) {}); err != nil {
		t.Fatal(err)
	}
	run, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"runq": "attached", "fsync": "attached"}
	if run.Meta.ID != "r" || !reflect.DeepEqual(run.Meta.Tracer, want) {
		t.Errorf("meta = %+v, want id r and tracer %v", run.Meta, want)
	}
}

// A segmented writer starts a new file once a segment is full; the reader streams them in
// order, and Open sees one run.
func TestSegmentedRunReadsBackInOrder(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	w, err := CreateSegmented(dir, Meta{ID: "r1", Scenario: ScenarioRecord, Start: t0}, 300)
	if err != nil {
		t.Fatal(err)
	}
	const n = 40
	for i := range n {
		if err := w.Append(Record{Type: TypeSample, Time: at(float64(i)), Metric: MetricCPUUsage, Cgroup: "/a", Value: f64(float64(i))}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	segments, _ := filepath.Glob(filepath.Join(dir, "records*.jsonl"))
	if len(segments) < 5 {
		t.Fatalf("%d segment files for %d records of ~110 bytes at 300 bytes a segment: %v", len(segments), n, segments)
	}
	for _, seg := range segments {
		if fi, err := os.Stat(seg); err != nil || fi.Size() > 300+200 {
			t.Errorf("segment %s: %v bytes (%v), want about 300 at most", seg, fi.Size(), err)
		}
	}
	rd, err := NewReader(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	if rd.Meta.Format != FormatVersionSegmented {
		t.Errorf("format %q, want %q", rd.Meta.Format, FormatVersionSegmented)
	}
	for i := 0; ; i++ {
		rec, err := rd.Next()
		if errors.Is(err, io.EOF) {
			if i != n {
				t.Errorf("streamed %d records, want %d", i, n)
			}
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if *rec.Value != float64(i) {
			t.Fatalf("record %d has value %v: out of order", i, *rec.Value)
		}
	}
	run, err := Open(dir)
	if err != nil || len(run.Records) != n || run.Torn {
		t.Fatalf("Open: %d records, torn %v, err %v; want %d", len(run.Records), run.Torn, err, n)
	}
}

// Only the last line of the last segment can be torn: the writer syncs a segment before it
// starts the next.
func TestSegmentedTornOnlyAtTheVeryEnd(t *testing.T) {
	segMeta := `{"format":"` + FormatVersionSegmented + `","id":"r"}`
	withSegment := func(t *testing.T, first, second string) string {
		dir := writeRun(t, segMeta, first)
		if err := os.WriteFile(filepath.Join(dir, "records-000001.jsonl"), []byte(second), 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	run, err := Open(withSegment(t, line1, line2+`{"type":"sam`))
	if err != nil || !run.Torn || len(run.Records) != 2 {
		t.Errorf("torn last segment: %d records, torn %v, err %v; want 2, torn", len(run.Records), run.Torn, err)
	}
	_, err = Open(withSegment(t, line1+`{"type":"sam`, line2))
	if err == nil || !strings.Contains(err.Error(), "records.jsonl: line 2") {
		t.Errorf("a torn earlier segment: got %v, want an error naming records.jsonl line 2", err)
	}
}

// Write hands back the run Open reads from what it wrote: the records in time order, times
// without monotonic readings, the meta with its format.
func TestWriteReturnsWhatOpenReads(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	h := hist.FromSlots([]uint64{0, 3, 1}, 4, 1000)
	now := time.Now() // carries a monotonic reading
	recs := []Record{
		{Type: TypeSample, Time: now.Add(time.Second), Metric: MetricCPUUsage, Cgroup: "/a", Value: f64(2), Labels: map[string]string{"k": "v"}},
		{Type: TypePhase, Time: now, Name: PhaseBaseline, Event: EventStart},
		{Type: TypeSample, Time: now.Add(time.Second), Metric: MetricRunqLatency, Cgroup: "/a", Hist: &h},
	}
	got, err := Write(dir, Meta{ID: "r1", Scenario: "noisy", Start: t0, Interval: Duration(time.Second)}, recs)
	if err != nil {
		t.Fatal(err)
	}
	read, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Meta, read.Meta) || got.Dir != read.Dir {
		t.Errorf("meta:\n got %+v\nread %+v", got.Meta, read.Meta)
	}
	if len(got.Records) != len(read.Records) || got.Records[0].Type != TypePhase {
		t.Fatalf("records: got %+v, read %+v", got.Records, read.Records)
	}
	for i := range got.Records {
		g, r := got.Records[i], read.Records[i]
		if !g.Time.Equal(r.Time) || g.Time != g.Time.Round(0) || !reflect.DeepEqual(g.Labels, r.Labels) || !reflect.DeepEqual(g.Hist, r.Hist) || g.Metric != r.Metric {
			t.Errorf("record %d: got %+v, read %+v", i, g, r)
		}
	}
	if _, err := Write(dir, Meta{}, nil); err == nil {
		t.Error("Write over a run: no error")
	}
}
