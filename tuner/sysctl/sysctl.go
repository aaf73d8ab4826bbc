// Package sysctl is the tuner's sysctl backend: one kernel parameter below /proc/sys, written
// and read back in a canonical form, and, when it drifts, the sysctl.d files and tuning daemons
// that may have changed it.
package sysctl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nodectl/nodectl/host"

	"github.com/prometheus/procfs"

	"github.com/nodectl/nodectl/tuner"
)

// Backend is the backend's name in state files.
const Backend = "sysctl"

// Spec is a sysctl's parameters, as recorded in the state file.
type Spec struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

type setting struct {
	h     host.FS
	key   string // dotted, as the ID shows it
	value string // canonical
}

// New is the sysctl key (dotted, vm.swappiness, or slashed, vm/swappiness, as sysctl.d(5)
// allows) set to value. The value is kept in canonical form: fields separated by single spaces.
func New(h host.FS, key, value string) tuner.Setting {
	return &setting{h: h, key: dotted(key), value: Canonical(value)}
}

// Decode rebuilds a sysctl from its recorded Spec.
func Decode(h host.FS, raw json.RawMessage) (tuner.Setting, error) {
	var s Spec
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, fmt.Errorf("decoding sysctl spec: %w", err)
	}
	if err := checkKey(s.Key); err != nil {
		return nil, fmt.Errorf("decoding sysctl spec %s: %w", raw, err)
	}
	if Canonical(s.Value) == "" {
		return nil, fmt.Errorf("decoding sysctl spec %s: empty value", raw)
	}
	return New(h, s.Key, s.Value), nil
}

// Exists reports whether key is a sysctl of h's kernel: a file below <Procfs>/sys.
func Exists(h host.FS, key string) bool {
	if checkKey(key) != nil {
		return false
	}
	fi, err := os.Stat(file(h, key))
	return err == nil && fi.Mode().IsRegular()
}

// Canonical is v with its fields separated by single spaces: the kernel prints tabs between
// the fields of multi-value sysctls (net.ipv4.tcp_rmem) and accepts any whitespace.
func Canonical(v string) string { return strings.Join(strings.Fields(v), " ") }

// Path is key as a path below /proc/sys, e.g. vm/swappiness. As in sysctl.d(5): when the
// first separator is a dot, dots separate and a slash stands for a dot inside a name (an
// interface eth0.1 is net.ipv4.conf.eth0/1.rp_filter); when it is a slash, the key is a path
// already.
func Path(key string) string {
	key = strings.Trim(key, "/")
	if i := strings.IndexAny(key, "./"); i < 0 || key[i] == '/' {
		return key
	}
	return swapDots(key)
}

// dotted is key in the dotted form.
func dotted(key string) string { return swapDots(Path(key)) }

func swapDots(s string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case '.':
			return '/'
		case '/':
			return '.'
		}
		return r
	}, s)
}

// checkKey refuses keys that are not a path below /proc/sys.
func checkKey(key string) error {
	p := Path(key)
	if p == "" {
		return errors.New("empty sysctl key")
	}
	for _, c := range strings.Split(p, "/") {
		if c == "" || c == "." || c == ".." {
			return fmt.Errorf("sysctl key %q: want names separated by dots, such as vm.swappiness", key)
		}
	}
	return nil
}

func file(h host.FS, key string) string {
	return filepath.Join(h.Procfs, "sys", filepath.FromSlash(Path(key)))
}

func (s *setting) ID() string      { return Backend + ":" + s.key }
func (s *setting) Backend() string { return Backend }
func (s *setting) Desired() string { return s.value }
func (s *setting) Spec() any       { return Spec{Key: s.key, Value: s.value} }
func (s *setting) path() string    { return file(s.h, s.key) }

func (s *setting) errf(format string, args ...any) error {
	return fmt.Errorf("%s (%s): %s", s.ID(), s.path(), fmt.Sprintf(format, args...))
}

func (s *setting) Read(context.Context) (tuner.Value, error) {
	if err := checkKey(s.key); err != nil {
		return tuner.Value{}, fmt.Errorf("%s: %w", s.ID(), err)
	}
	b, err := os.ReadFile(s.path())
	if errors.Is(err, fs.ErrNotExist) {
		return tuner.Value{}, s.errf("no such sysctl on this kernel")
	}
	if err != nil {
		return tuner.Value{}, s.errf("reading: %v", err)
	}
	return tuner.Value{Present: true, Text: Canonical(string(b))}, nil
}

func (s *setting) Apply(ctx context.Context) error {
	if s.value == "" {
		return fmt.Errorf("%s: empty value", s.ID())
	}
	return s.write(ctx, s.value)
}

func (s *setting) Restore(ctx context.Context, prev tuner.Value) error {
	if !prev.Present {
		return fmt.Errorf("%s: the recorded value is absent, and a sysctl cannot be removed", s.ID())
	}
	return s.write(ctx, prev.Text)
}

// write sets the sysctl to v unless it reads as v already: some writes have effects beyond
// the value (flushing a cache, resizing a table), so an unchanged value is not rewritten.
func (s *setting) write(ctx context.Context, v string) error {
	cur, err := s.Read(ctx)
	if err != nil {
		return err
	}
	if cur.Text == v {
		return nil
	}
	// One write of the whole value: the kernel parses each write(2) on its own.
	f, err := os.OpenFile(s.path(), os.O_WRONLY, 0)
	if err != nil {
		return s.errf("writing %q: %v", v, err)
	}
	_, err = f.Write([]byte(v + "\n"))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return s.errf("writing %q: %v", v, err)
	}
	return nil
}

// confDirs are where systemd-sysctl reads sysctl.d files, highest priority first: a file
// masks a file of the same name in a later directory.
var confDirs = []string{"/etc/sysctl.d", "/run/sysctl.d", "/usr/local/lib/sysctl.d", "/usr/lib/sysctl.d", "/lib/sysctl.d"}

// confFile is read after the sysctl.d files by `sysctl --system`.
const confFile = "/etc/sysctl.conf"

// tuners are the command names (comm) of processes known to write sysctls.
var tuners = []string{"tuned", "tuned-adm", "systemd-sysctl", "sysctl", "node-tuner"}

// Suspects names who may have set the sysctl to got: the sysctl.d files that set it (in the
// order they apply at boot, so the last one wins) and the tuning processes running now.
func (s *setting) Suspects(_ context.Context, got tuner.Value) []string {
	var out []string
	by := "sysctl --system"
	if s.h.Systemd() {
		by = "systemd-sysctl"
	}
	for _, f := range s.confFiles() {
		b, err := os.ReadFile(s.h.Path(f.path))
		if err != nil {
			continue
		}
		for _, v := range setsKey(b, Path(s.key)) {
			now := "not the value now"
			if got.Present && v == got.Text {
				now = "the value now"
			}
			out = append(out, fmt.Sprintf("%s sets %s = %s (%s), applied at boot by %s", f.shown, s.key, v, now, by))
		}
	}
	return append(out, processes(s.h)...)
}

// conf is a sysctl.d file: its node path, and how suspects name it.
type conf struct{ path, shown string }

// confFiles are the node's sysctl.d files in the order they apply: by file name across the
// directories, each name taken from the first directory having it, then /etc/sysctl.conf.
func (s *setting) confFiles() []conf {
	byName := map[string]string{}
	var names []string
	for _, dir := range confDirs {
		ents, err := os.ReadDir(s.h.Path(dir))
		if err != nil {
			continue
		}
		for _, e := range ents {
			if e.IsDir() || !strings.HasSuffix(e.Name(), ".conf") {
				continue
			}
			if _, masked := byName[e.Name()]; !masked {
				byName[e.Name()] = path.Join(dir, e.Name())
				names = append(names, e.Name())
			}
		}
	}
	slices.Sort(names)
	files := make([]string, 0, len(names)+1)
	for _, n := range names {
		files = append(files, byName[n])
	}
	var out []conf
	var seen []fs.FileInfo // Debian links /etc/sysctl.d/99-sysctl.conf to ../sysctl.conf
	for _, f := range append(files, confFile) {
		fi, err := os.Stat(s.h.Path(f))
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		dup := false
		for _, o := range seen {
			dup = dup || os.SameFile(o, fi)
		}
		if dup {
			continue
		}
		seen = append(seen, fi)
		c := conf{path: f, shown: f}
		if l, err := os.Readlink(s.h.Path(f)); err == nil {
			if !path.IsAbs(l) {
				l = path.Join(path.Dir(f), l)
			}
			c.shown = fmt.Sprintf("%s (a link to %s)", f, l)
		}
		out = append(out, c)
	}
	return out
}

// setsKey returns, in file order, the canonical values a sysctl.d file assigns to the
// sysctl at path p (slashed). Keys may be dotted or slashed, carry a leading '-' (ignore
// failure) and be globs (net.ipv4.conf.*.rp_filter).
func setsKey(b []byte, p string) []string {
	var out []string
	for line := range bytes.Lines(b) {
		l := strings.TrimSpace(string(line))
		if l == "" || l[0] == '#' || l[0] == ';' {
			continue
		}
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			continue
		}
		k = strings.TrimPrefix(strings.TrimSpace(k), "-")
		if k == "" || k[0] == '!' {
			continue // a '!' pattern only excludes keys from globs
		}
		if m, err := path.Match(Path(k), p); err == nil && m {
			out = append(out, Canonical(v))
		}
	}
	return out
}

// processes describes the running processes known to write sysctls.
func processes(h host.FS) []string {
	pfs, err := procfs.NewFS(h.Procfs)
	if err != nil {
		return nil
	}
	procs, err := pfs.AllProcs()
	if err != nil {
		return nil
	}
	var out []string
	for _, p := range procs {
		comm, err := p.Comm()
		if err != nil || !slices.Contains(tuners, comm) {
			continue
		}
		s := fmt.Sprintf("process %s (pid %d) is running and writes sysctls", comm, p.PID)
		if args, err := p.CmdLine(); err == nil && len(args) > 0 {
			cmd := strings.Join(args, " ")
			if len(cmd) > 120 {
				cmd = cmd[:117] + "..."
			}
			s = fmt.Sprintf("process %s (pid %d: %s) is running and writes sysctls", comm, p.PID, cmd)
		}
		out = append(out, s)
	}
	return out
}
