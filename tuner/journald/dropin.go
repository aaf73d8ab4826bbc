package journald

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/nodectl/nodectl/host"

	"github.com/nodectl/nodectl/tuner"
	"github.com/nodectl/nodectl/tuner/nodefile"
)

// Backend is the drop-in backend's name in state files.
const Backend = "journald"

// DefaultDropIn is where profiles put the drop-in.
const DefaultDropIn = "/etc/systemd/journald.conf.d/90-nodectl.conf"

const header = "# Written by nodectl tune. `nodectl tune rollback` removes it.\n[Journal]\n"

// dropInMode is the mode of the file nodectl writes.
const dropInMode fs.FileMode = 0o644

// Entry is one journald.conf(5) setting of the [Journal] section.
type Entry struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// DropInSpec is the drop-in's parameters, as recorded in the state file.
type DropInSpec struct {
	File    string  `json:"file"`
	Entries []Entry `json:"entries"`
}

// Render is the drop-in's content, byte for byte: a comment, [Journal], and one Key=Value line
// per entry in the given order.
func Render(entries []Entry) []byte {
	var b bytes.Buffer
	b.WriteString(header)
	for _, e := range entries {
		fmt.Fprintf(&b, "%s=%s\n", e.Key, e.Value)
	}
	return b.Bytes()
}

type dropIn struct {
	h       host.FS
	spec    DropInSpec
	restart restartFunc
}

// NewDropIn is the drop-in at file (a path on the node, e.g. DefaultDropIn) setting entries.
func NewDropIn(h host.FS, file string, entries []Entry) tuner.Setting {
	return &dropIn{h: h, spec: DropInSpec{File: file, Entries: slices.Clone(entries)}, restart: systemctl}
}

// DecodeDropIn rebuilds a drop-in from its recorded DropInSpec.
func DecodeDropIn(h host.FS, raw json.RawMessage) (tuner.Setting, error) {
	var s DropInSpec
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, fmt.Errorf("decoding journald drop-in spec: %w", err)
	}
	if err := s.check(); err != nil {
		return nil, fmt.Errorf("decoding journald drop-in spec %s: %w", raw, err)
	}
	return NewDropIn(h, s.File, s.Entries), nil
}

var keyRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9]*$`)

// check refuses a spec whose file would not be read by journald or whose entries would not
// be one line each.
func (s DropInSpec) check() error {
	if !path.IsAbs(s.File) || path.Clean(s.File) != s.File || !strings.HasSuffix(s.File, ".conf") {
		return fmt.Errorf("file %q: want a clean absolute path ending in .conf, such as %s", s.File, DefaultDropIn)
	}
	if len(s.Entries) == 0 {
		return errors.New("no entries: want at least one Key=Value")
	}
	for _, e := range s.Entries {
		if !keyRE.MatchString(e.Key) {
			return fmt.Errorf("key %q: want a journald.conf key such as SystemMaxUse", e.Key)
		}
		if strings.ContainsFunc(e.Value, func(r rune) bool { return r < ' ' || r == 0x7f }) {
			return fmt.Errorf("%s value %q: control characters and newlines are not allowed", e.Key, e.Value)
		}
	}
	return nil
}

func (d *dropIn) ID() string      { return Backend + ":" + d.spec.File }
func (d *dropIn) Restart() string { return Daemon }
func (d *dropIn) Backend() string { return Backend }
func (d *dropIn) Spec() any       { return d.spec }
func (d *dropIn) path() string    { return d.h.Path(d.spec.File) }

// Desired is the entries as Key=Value, separated by single spaces.
func (d *dropIn) Desired() string {
	kv := make([]string, len(d.spec.Entries))
	for i, e := range d.spec.Entries {
		kv[i] = e.Key + "=" + e.Value
	}
	return strings.Join(kv, " ")
}

func (d *dropIn) errf(format string, args ...any) error {
	return fmt.Errorf("%s (%s): %s", d.ID(), d.path(), fmt.Sprintf(format, args...))
}

func (d *dropIn) file() nodefile.File { return nodefile.New(d.h, d.spec.File) }

func (d *dropIn) Read(context.Context) (tuner.Value, error) {
	if err := d.spec.check(); err != nil {
		return tuner.Value{}, fmt.Errorf("%s: %w", d.ID(), err)
	}
	v, err := d.file().Read(d.describe)
	if err != nil {
		return tuner.Value{}, d.errf("%v", err)
	}
	return v, nil
}

// describe is the Text of a file with content b and mode m: Desired when it is exactly what
// nodectl writes, else what it sets.
func (d *dropIn) describe(b []byte, m fs.FileMode) string {
	if bytes.Equal(b, Render(d.spec.Entries)) {
		if m == dropInMode {
			return d.Desired()
		}
		return fmt.Sprintf("%s (mode %04o, not %04o)", d.Desired(), m, dropInMode)
	}
	var kv []string
	for _, e := range journalEntries(b) {
		kv = append(kv, e.Key+"="+e.Value)
	}
	if len(kv) == 0 {
		return fmt.Sprintf("other content (%d bytes), no [Journal] settings", len(b))
	}
	return fmt.Sprintf("other content (%d bytes): %s", len(b), strings.Join(kv, " "))
}

// Apply writes the drop-in unless it is ours already, and restarts journald (where systemd
// runs) after writing it or when none has started since it was written.
func (d *dropIn) Apply(ctx context.Context) error {
	cur, err := d.Read(ctx)
	if err != nil {
		return err
	}
	// Written already: same bytes and mtime, restarted only if an earlier restart was missed.
	changed := !cur.Present || cur.Text != d.Desired()
	if changed {
		if err := d.file().Write(Render(d.spec.Entries), dropInMode); err != nil {
			return d.errf("%v", err)
		}
	}
	return d.settle(ctx, changed)
}

// Restore puts the previous file back and restarts journald as Apply does: after changing the
// file, or when none has started since its last change, which a rollback that could not
// restart journald leaves behind.
func (d *dropIn) Restore(ctx context.Context, prev tuner.Value) error {
	if err := d.spec.check(); err != nil {
		return fmt.Errorf("%s: %w", d.ID(), err)
	}
	changed, err := d.file().Restore(prev)
	if err != nil {
		return d.errf("%v", err)
	}
	return d.settle(ctx, changed)
}

func (d *dropIn) settle(ctx context.Context, changed bool) error {
	if err := settle(ctx, d.h, changed, d.Pending, d.restart); err != nil {
		return d.errf("%v", err)
	}
	return nil
}

// Pending reports whether no journald has started since the drop-in was last written or
// removed (its modification time, or its directory's when it is gone): journald reads its
// configuration only when it starts.
func (d *dropIn) Pending(context.Context) (bool, error) {
	changed, err := d.file().Changed()
	if err != nil {
		return false, d.errf("%v", err)
	}
	p, err := pendingSince(d.h, changed)
	if err != nil {
		return false, d.errf("%v", err)
	}
	return p, nil
}

// Note says when journald reads the drop-in where systemd does not run.
func (d *dropIn) Note() string {
	return note(d.h, "the drop-in applies when journald next starts")
}

// dropInDirs are where journald reads drop-ins, highest priority first: a file masks a file of
// the same name in a later directory, and all are applied in the order of their names.
var dropInDirs = []string{"/etc/systemd/journald.conf.d", "/run/systemd/journald.conf.d",
	"/usr/local/lib/systemd/journald.conf.d", "/usr/lib/systemd/journald.conf.d", "/lib/systemd/journald.conf.d"}

// mainConf is journald's main configuration file; drop-ins override it.
const mainConf = "/etc/systemd/journald.conf"

// Suspects names who may have changed the drop-in or overridden it: drop-ins that mask it or
// sort after it and set the same keys, the main journald.conf setting them, and when the file
// (or, when it is gone, its directory) was last changed.
func (d *dropIn) Suspects(context.Context, tuner.Value) []string {
	var out []string
	ours := path.Base(d.spec.File)
	ourDir := path.Dir(d.spec.File)
	keys := map[string]bool{}
	for _, e := range d.spec.Entries {
		keys[e.Key] = true
	}
	sets := func(f string) []string {
		b, err := os.ReadFile(d.h.Path(f))
		if err != nil {
			return nil
		}
		var kv []string
		for _, e := range journalEntries(b) {
			if keys[e.Key] {
				kv = append(kv, e.Key+"="+e.Value)
			}
		}
		return kv
	}
	dirs := dropInDirs
	if !slices.Contains(dirs, ourDir) {
		dirs = append([]string{ourDir}, dirs...)
	}
	// Drop-ins apply in the order of their names across the directories, each name taken
	// from the first directory having it.
	byName := map[string]string{}
	var names []string
	for _, dir := range dirs {
		ents, err := os.ReadDir(d.h.Path(dir))
		if err != nil {
			continue
		}
		for _, e := range ents {
			if _, ok := byName[e.Name()]; !ok && strings.HasSuffix(e.Name(), ".conf") {
				byName[e.Name()] = path.Join(dir, e.Name())
				names = append(names, e.Name())
			}
		}
	}
	slices.Sort(names)
	if f, ok := byName[ours]; ok && f != d.spec.File {
		out = append(out, fmt.Sprintf("%s has the drop-in's name in a directory read first, so journald reads it instead", f))
	}
	for _, n := range names {
		if n <= ours {
			continue
		}
		if kv := sets(byName[n]); len(kv) > 0 {
			out = append(out, fmt.Sprintf("%s sorts after %s and sets %s, overriding the drop-in", byName[n], ours, strings.Join(kv, " ")))
		}
	}
	if kv := sets(mainConf); len(kv) > 0 {
		out = append(out, fmt.Sprintf("%s sets %s (in effect where no drop-in sets it)", mainConf, strings.Join(kv, " ")))
	}
	if fi, err := os.Lstat(d.path()); err == nil {
		out = append(out, fmt.Sprintf("%s was last modified at %s", d.spec.File, fi.ModTime().UTC().Format(time.RFC3339)))
	} else if fi, err := os.Stat(d.h.Path(ourDir)); err == nil {
		out = append(out, fmt.Sprintf("%s is missing; %s was last modified at %s", d.spec.File, ourDir, fi.ModTime().UTC().Format(time.RFC3339)))
	}
	return out
}

// journalEntries are the Key=Value settings of b's [Journal] section, in file order.
func journalEntries(b []byte) []Entry {
	var out []Entry
	in := false
	for line := range bytes.Lines(b) {
		l := strings.TrimSpace(string(line))
		switch {
		case l == "" || l[0] == '#' || l[0] == ';':
		case l[0] == '[':
			in = l == "[Journal]"
		case in:
			if k, v, ok := strings.Cut(l, "="); ok {
				out = append(out, Entry{Key: strings.TrimSpace(k), Value: strings.TrimSpace(v)})
			}
		}
	}
	return out
}

// Unfinished reports whether a restart of journald is owed: systemd runs and none has
// started since the setting last changed (tuner.Finisher), so a re-apply restarts it.
func (d *dropIn) Unfinished(ctx context.Context) (bool, error) {
	return needRestart(d.h.Systemd(), false, func() (bool, error) { return d.Pending(ctx) })
}
