package rundir

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/nodectl/nodectl/internal/atomicfile"
)

// Files of a run directory.
const (
	MetaFile     = "meta.json"
	RecordsFile  = "records.jsonl"
	FindingsFile = "findings.json"
)

// Known major versions: 1 keeps every record in records.jsonl; 2 may continue them in
// segments (FormatVersionSegmented). Readers refuse any other.
const (
	formatMajor          = 1
	formatMajorSegmented = 2
)

// Writer appends records to a run directory. Its methods are safe for concurrent use.
type Writer struct {
	dir          string
	segmentBytes int64 // 0: one file

	mu      sync.Mutex
	meta    Meta
	records *os.File // the segment being written; nil once closed
	segment int      // its number: 0 is records.jsonl
	written int64    // bytes in it
}

// Create makes the run directory dir (it must not exist or be empty), writes meta.json with
// Format set to FormatVersion, and opens records.jsonl for appending.
func Create(dir string, meta Meta) (*Writer, error) { return create(dir, meta, 0) }

// CreateSegmented is Create for a long-running writer: once a segment holds segmentBytes or
// more, the next append goes to a new one (records-000001.jsonl, ...), so that whoever keeps
// the run can drop or ship whole files. Its format is FormatVersionSegmented.
func CreateSegmented(dir string, meta Meta, segmentBytes int64) (*Writer, error) {
	if segmentBytes <= 0 {
		return nil, fmt.Errorf("creating run directory: segment size %d, want a positive number of bytes", segmentBytes)
	}
	return create(dir, meta, segmentBytes)
}

func create(dir string, meta Meta, segmentBytes int64) (*Writer, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating run directory: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("reading run directory: %w", err)
	}
	if len(entries) > 0 {
		return nil, fmt.Errorf("creating run directory: %s is not empty", dir)
	}
	w := &Writer{dir: dir, segmentBytes: segmentBytes}
	meta.Format = w.format()
	if err := writeJSONAtomic(dir, MetaFile, meta); err != nil {
		return nil, err
	}
	f, err := openSegment(dir, 0)
	if err != nil {
		return nil, err
	}
	w.meta, w.records = meta, f
	return w, nil
}

// Write writes a run directory whole, its records in time order, and returns the run as Open
// reads it back, without reading it: the caller that made the records analyzes them in
// memory. Times lose their monotonic clock readings, as a file's do.
func Write(dir string, meta Meta, recs []Record) (*Run, error) {
	for i := range recs {
		recs[i].Time = recs[i].Time.Round(0)
	}
	slices.SortStableFunc(recs, func(a, b Record) int { return a.Time.Compare(b.Time) })
	w, err := Create(dir, meta)
	if err != nil {
		return nil, err
	}
	if err := w.Append(recs...); err != nil {
		w.Close()
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return &Run{Dir: dir, Meta: w.meta, Records: recs}, nil
}

func (w *Writer) format() string {
	if w.segmentBytes > 0 {
		return FormatVersionSegmented
	}
	return FormatVersion
}

// segmentName is the file of segment n: records.jsonl, then records-000001.jsonl, ...
func segmentName(n int) string {
	if n == 0 {
		return RecordsFile
	}
	return fmt.Sprintf("records-%06d.jsonl", n)
}

func openSegment(dir string, n int) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, segmentName(n)), os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("creating records file: %w", err)
	}
	return f, nil
}

// rotate closes a full segment, synced, and opens the next. A crash in between leaves the
// full segment complete and the next one empty or missing: nothing is torn but the last line
// of the last segment, ever.
func (w *Writer) rotate() error {
	if err := w.records.Sync(); err != nil {
		return fmt.Errorf("syncing records file: %w", err)
	}
	if err := w.records.Close(); err != nil {
		return fmt.Errorf("closing records file: %w", err)
	}
	f, err := openSegment(w.dir, w.segment+1)
	if err != nil {
		w.records = nil
		return err
	}
	w.records, w.segment, w.written = f, w.segment+1, 0
	return nil
}

// Append writes recs as one line each, in a single write so that concurrent batches never
// interleave and a crash tears at most the last line.
func (w *Writer) Append(recs ...Record) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf) // Encode ends each record with the newline that commits it
	enc.SetEscapeHTML(false)     // keep "<idle>" readable
	for i := range recs {
		if recs[i].Type == "" {
			return fmt.Errorf("appending record %d: no type", i)
		}
		if err := enc.Encode(&recs[i]); err != nil {
			return fmt.Errorf("encoding record %d: %w", i, err)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.records == nil {
		return fmt.Errorf("appending records: %w", os.ErrClosed)
	}
	if w.segmentBytes > 0 && w.written >= w.segmentBytes {
		if err := w.rotate(); err != nil {
			return fmt.Errorf("appending records: %w", err)
		}
	}
	n, err := w.records.Write(buf.Bytes())
	w.written += int64(n)
	if err != nil {
		return fmt.Errorf("appending records: %w", err)
	}
	return nil
}

// UpdateMeta applies fn to a copy of the run's metadata and replaces meta.json atomically; the
// copy is kept only if the write succeeds. Format stays FormatVersion.
func (w *Writer) UpdateMeta(fn func(*Meta)) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.meta
	m.Args = slices.Clone(m.Args)
	m.Workloads = slices.Clone(m.Workloads)
	m.Tracer = maps.Clone(m.Tracer)
	fn(&m)
	m.Format = w.format()
	if err := writeJSONAtomic(w.dir, MetaFile, m); err != nil {
		return err
	}
	w.meta = m
	return nil
}

// Close flushes records.jsonl to disk and closes it. Calling it again does nothing.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.records == nil {
		return nil
	}
	f := w.records
	w.records = nil
	syncErr := f.Sync()
	if err := f.Close(); err != nil {
		return fmt.Errorf("closing records file: %w", err)
	}
	if syncErr != nil {
		return fmt.Errorf("syncing records file: %w", syncErr)
	}
	return nil
}

// WriteFindings writes f as findings.json in the run directory, atomically.
func WriteFindings(dir string, f any) error {
	return writeJSONAtomic(dir, FindingsFile, f)
}

// writeJSONAtomic replaces dir/name with v's JSON whole (internal/atomicfile).
func writeJSONAtomic(dir, name string, v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("encoding %s: %w", name, err)
	}
	if err := atomicfile.Write(filepath.Join(dir, name), buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", name, err)
	}
	return nil
}

// Run is a run directory read back. It is not safe for concurrent use: Series indexes the
// records on first use.
type Run struct {
	Dir     string
	Meta    Meta
	Records []Record // in file order, segment after segment
	Torn    bool     // a torn last record was skipped

	series map[string]SeriesSet // by metric, built on first use
}

// Open reads a run directory. A torn last line (no newline, or not valid JSON) is skipped and
// reported in Torn; a corrupt earlier line is an error naming it.
func Open(dir string) (*Run, error) {
	rd, err := NewReader(dir)
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	r := &Run{Dir: dir, Meta: rd.Meta}
	for {
		rec, err := rd.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		r.Records = append(r.Records, rec)
	}
	r.Torn = rd.Torn()
	return r, nil
}

// Reader streams a run's records, segment after segment, without holding them: for a run too
// long to load, or a consumer that needs each record once.
type Reader struct {
	Meta Meta

	dir     string
	segment int           // the segment being read
	file    *os.File      // nil before the first and after the last
	br      *bufio.Reader // over file
	line    int           // of the segment, the last one read
	torn    bool
}

// NewReader opens a run directory for streaming: its metadata is read and checked now, the
// records by Next.
func NewReader(dir string) (*Reader, error) {
	b, err := os.ReadFile(filepath.Join(dir, MetaFile))
	if err != nil {
		return nil, fmt.Errorf("reading run metadata: %w", err)
	}
	rd := &Reader{dir: dir, segment: -1}
	if err := json.Unmarshal(b, &rd.Meta); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", filepath.Join(dir, MetaFile), err)
	}
	if err := checkFormat(rd.Meta.Format); err != nil {
		return nil, fmt.Errorf("opening run %s: %w", dir, err)
	}
	return rd, nil
}

// Next returns the next record, or io.EOF after the last. Only the last line of the last
// segment may be torn (a crash mid-append): it is skipped and Torn says so; any other line that
// is not a record is an error naming its file and line.
func (rd *Reader) Next() (Record, error) {
	for {
		if rd.file == nil {
			ok, err := rd.openNext()
			if err != nil || !ok {
				return Record{}, err
			}
		}
		raw, err := readLine(rd.br, maxRecordBytes)
		if err != nil && !errors.Is(err, io.EOF) {
			rd.line++
			return Record{}, rd.lineError(err)
		}
		if len(raw) == 0 { // the segment's clean end
			rd.closeSegment()
			continue
		}
		rd.line++
		complete := err == nil // its newline committed the append
		var rec Record
		jerr := json.Unmarshal(raw, &rec)
		if complete && jerr == nil {
			return rec, nil
		}
		if complete {
			if _, perr := rd.br.Peek(1); !errors.Is(perr, io.EOF) {
				return Record{}, rd.lineError(jerr) // corruption amid the records, not a crash
			}
		}
		// The segment's last line lacks its newline or is garbage (a filesystem may zero-fill a
		// tail it never wrote): the tear of the run's very last append, if no segment follows.
		if rd.hasLaterSegment() {
			if jerr == nil {
				jerr = errors.New("a segment that is not the last ends without a newline")
			}
			return Record{}, rd.lineError(jerr)
		}
		rd.torn = true
		rd.closeSegment()
	}
}

// maxRecordBytes bounds a line of records.jsonl: a record is a few KiB at most (a histogram
// of 64 buckets, a pod's message), and a reader must not allocate a crafted or damaged file's
// size for one line.
const maxRecordBytes = 1 << 20

// readLine reads up to and including the next newline, as bufio's ReadBytes does, but fails
// past limit bytes.
func readLine(br *bufio.Reader, limit int) ([]byte, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		if len(line)+len(frag) > limit {
			return nil, fmt.Errorf("a line longer than %d bytes: not a record", limit)
		}
		line = append(line, frag...)
		if !errors.Is(err, bufio.ErrBufferFull) {
			return line, err
		}
	}
}

// Torn says whether Next skipped a torn last record.
func (rd *Reader) Torn() bool { return rd.torn }

// Close releases the segment being read.
func (rd *Reader) Close() error {
	rd.closeSegment()
	return nil
}

// openNext opens the next segment; ok is false after the last.
func (rd *Reader) openNext() (bool, error) {
	if rd.segment >= 0 && !rd.hasLaterSegment() {
		return false, io.EOF
	}
	rd.segment++
	f, err := os.Open(filepath.Join(rd.dir, segmentName(rd.segment)))
	if err != nil {
		return false, fmt.Errorf("reading run records: %w", err)
	}
	rd.file, rd.br, rd.line = f, bufio.NewReader(f), 0
	return true, nil
}

func (rd *Reader) closeSegment() {
	if rd.file != nil {
		rd.file.Close()
		rd.file = nil
	}
}

// hasLaterSegment says whether a segment follows the one being read.
func (rd *Reader) hasLaterSegment() bool {
	_, err := os.Stat(filepath.Join(rd.dir, segmentName(rd.segment+1)))
	return err == nil
}

func (rd *Reader) lineError(err error) error {
	return fmt.Errorf("reading %s: line %d: %w", filepath.Join(rd.dir, segmentName(rd.segment)), rd.line, err)
}

// checkFormat accepts "nodectl-run/<major>[.<minor>]" with the major version this reader knows.
func checkFormat(format string) error {
	name, version, ok := strings.Cut(format, "/")
	prefix, _, _ := strings.Cut(FormatVersion, "/")
	if !ok || name != prefix {
		return fmt.Errorf("unknown run format %q, want %s", format, FormatVersion)
	}
	majorText, _, _ := strings.Cut(version, ".")
	major, err := strconv.Atoi(majorText)
	if err != nil {
		return fmt.Errorf("unknown run format %q, want %s", format, FormatVersion)
	}
	if major != formatMajor && major != formatMajorSegmented {
		return fmt.Errorf("run format %q has major version %d; this nodectl reads versions %d and %d only", format, major, formatMajor, formatMajorSegmented)
	}
	return nil
}
