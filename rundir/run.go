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
)

// Files of a run directory.
const (
	MetaFile     = "meta.json"
	RecordsFile  = "records.jsonl"
	FindingsFile = "findings.json"
)

// formatMajor is the major version of FormatVersion: readers refuse any other.
const formatMajor = 1

// Writer appends records to a run directory. Its methods are safe for concurrent use.
type Writer struct {
	dir string

	mu      sync.Mutex
	meta    Meta
	records *os.File // nil once closed
}

// Create makes the run directory dir (it must not exist or be empty), writes meta.json with
// Format set to FormatVersion, and opens records.jsonl for appending.
func Create(dir string, meta Meta) (*Writer, error) {
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
	meta.Format = FormatVersion
	if err := writeJSONAtomic(dir, MetaFile, meta); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, RecordsFile), os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("creating records file: %w", err)
	}
	return &Writer{dir: dir, meta: meta, records: f}, nil
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
	if _, err := w.records.Write(buf.Bytes()); err != nil {
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
	m.Format = FormatVersion
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

// writeJSONAtomic writes v to dir/name through a synced temporary file and a rename, so a
// reader sees the old file or the new one, never a part.
func writeJSONAtomic(dir, name string, v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("encoding %s: %w", name, err)
	}
	tmp, err := os.CreateTemp(dir, name+".tmp-*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", name, err)
	}
	defer os.Remove(tmp.Name()) // fails harmlessly once renamed
	if _, err := tmp.Write(buf.Bytes()); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", name, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("syncing %s: %w", name, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", name, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", name, err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, name)); err != nil {
		return fmt.Errorf("replacing %s: %w", name, err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("syncing run directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("syncing run directory: %w", err)
	}
	return nil
}

// Run is a run directory read back. It is not safe for concurrent use: Series indexes the
// records on first use.
type Run struct {
	Dir     string
	Meta    Meta
	Records []Record // in file order
	Torn    bool     // a torn last record was skipped

	series map[string]SeriesSet // by metric, built on first use
}

// Open reads a run directory. A torn last line of records.jsonl (no newline, or not valid
// JSON) is skipped and reported in Torn; a corrupt earlier line is an error naming it.
func Open(dir string) (*Run, error) {
	b, err := os.ReadFile(filepath.Join(dir, MetaFile))
	if err != nil {
		return nil, fmt.Errorf("reading run metadata: %w", err)
	}
	r := &Run{Dir: dir}
	if err := json.Unmarshal(b, &r.Meta); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", filepath.Join(dir, MetaFile), err)
	}
	if err := checkFormat(r.Meta.Format); err != nil {
		return nil, fmt.Errorf("opening run %s: %w", dir, err)
	}
	f, err := os.Open(filepath.Join(dir, RecordsFile))
	if err != nil {
		return nil, fmt.Errorf("reading run records: %w", err)
	}
	defer f.Close()
	r.Records, r.Torn, err = readRecords(f)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", filepath.Join(dir, RecordsFile), err)
	}
	return r, nil
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
	if major != formatMajor {
		return fmt.Errorf("run format %q has major version %d; this nodectl reads version %d only", format, major, formatMajor)
	}
	return nil
}

// readRecords decodes one record per line. Only the last line may be torn: a writer that
// crashed mid-append leaves a line without its newline or with garbage (a filesystem may
// zero-fill a tail it never wrote).
func readRecords(rd io.Reader) (recs []Record, torn bool, err error) {
	br := bufio.NewReader(rd)
	for n := 1; ; n++ {
		line, err := br.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			if len(line) > 0 {
				return recs, true, nil // no newline: the append never completed
			}
			return recs, false, nil
		}
		if err != nil {
			return nil, false, fmt.Errorf("line %d: %w", n, err)
		}
		var rec Record
		if jerr := json.Unmarshal(line, &rec); jerr != nil {
			if _, perr := br.Peek(1); errors.Is(perr, io.EOF) {
				return recs, true, nil
			}
			return nil, false, fmt.Errorf("line %d: %w", n, jerr)
		}
		recs = append(recs, rec)
	}
}
