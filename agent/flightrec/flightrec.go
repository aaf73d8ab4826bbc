// Package flightrec is the agent's flight recorder: a persistent, bounded, crash-safe store of
// the records the agent collects every interval, readable while the agent writes and after it
// died. docs/flight-recorder.md says why it is our own columnar format and
// docs/flight-recorder-format.md describes the files.
//
// A Store appends one tick of records at a time to a journal, the open segment, which a crash
// loses no completed tick of; every SegmentSpan the journal is sealed into a compressed,
// columnar segment file. Retention drops whole segments, oldest first, by size and age, except
// those a pin (an incident's window) keeps. A Reader reads a directory without writing to it.
package flightrec

import (
	"errors"
	"log/slog"
	"time"
)

// Options configure a Store. The zero value of a field takes its default.
type Options struct {
	Dir         string        // created 0700 if missing
	SegmentSpan time.Duration // time covered by a segment; default 5m
	MaxBytes    int64         // bytes on disk; default 1 GiB
	MaxAge      time.Duration // age of the newest tick of the oldest segment kept; default 7 days
	// SyncEvery is how often the journal is fsynced: a kill -9 loses no tick Append returned
	// for, a power cut up to this much. Default 10s.
	SyncEvery time.Duration
	// SeriesIdle: a series with no sample for this long is left out of the next segments (its
	// cgroup is gone) until it has one again. Default 1h: a series that only sends changes is
	// still read as alive for an hour after its last one.
	SeriesIdle time.Duration
	Now        func() time.Time // for tests; nil = time.Now
	Log        *slog.Logger     // nil = discard
}

// Defaults. At 1,000 cgroups × 34 series at 1 s the store writes about 0.5 bytes a sample,
// 63 MB an hour (docs/flight-recorder-format.md): 1 GiB is 17 hours of such a node and a week
// of one with 100 cgroups, and small next to a node's images and logs. A week lets an incident
// from before a weekend be looked at on Monday. Five-minute segments take 5% more bytes than
// ten-minute ones, and halve what a read decodes at a time and what a seal reads back.
const (
	DefaultSegmentSpan = 5 * time.Minute
	DefaultMaxBytes    = 1 << 30
	DefaultMaxAge      = 7 * 24 * time.Hour
	DefaultSyncEvery   = 10 * time.Second
	DefaultSeriesIdle  = time.Hour
)

func (o Options) withDefaults() Options {
	if o.SegmentSpan <= 0 {
		o.SegmentSpan = DefaultSegmentSpan
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.MaxAge <= 0 {
		o.MaxAge = DefaultMaxAge
	}
	if o.SyncEvery <= 0 {
		o.SyncEvery = DefaultSyncEvery
	}
	if o.SeriesIdle <= 0 {
		o.SeriesIdle = DefaultSeriesIdle
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return o
}

// Pin keeps the segments overlapping [From, To] from retention.
type Pin struct {
	ID   string    `json:"id"`
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
}

// Status is what a Store holds and how its writing goes.
type Status struct {
	Dir            string
	Bytes          int64     // on disk: segments, journal and pins
	PinnedBytes    int64     // of which segments that pins keep
	JournalBytes   int64     // of which the journal
	Segments       int       // sealed segments
	Oldest, Newest time.Time // first and last tick stored; zero when empty
	Series         int       // series the writer follows
	StoredSamples  int64     // logical samples stored (each series at each tick): Bytes/StoredSamples is the cost of one

	Ticks      int64 // ticks written since Open
	Samples    int64 // sample records appended since Open, written or lost
	LostTicks  int64 // ticks not written (disk full, read-only): their values went with the next tick written
	LostEvents int64 // events and phases dropped while writing failed, beyond what memory holds

	Writable      bool  // the last write succeeded
	WriteFailures int64 // failed writes (journal, segment, fsync, pins)
	LastError     string
	LastErrorTime time.Time

	TornBytes int64    // cut from the journal's tail at Open: a tick a crash interrupted
	Corrupt   []string // segments set aside as damaged (renamed *.corrupt)
	Evicted   int64    // segments retention removed since Open
	Pins      []Pin
}

// Span is what a Reader found in a directory.
type Span struct {
	Oldest, Newest time.Time // first and last tick; zero when empty
	Segments       int
	Bytes          int64
	TornBytes      int64    // the journal's unreadable tail (a crash, or a tick being written)
	Corrupt        []string // damaged segments, skipped
	Series         int      // the most series one segment (or the journal) holds: what a tick can read
}

// ErrClosed is returned by a closed Store.
var ErrClosed = errors.New("flightrec: store closed")
