// Package swap is the tuner's swap backend: a swap file nodectl may create, or a block device
// already formatted as swap, turned on at a priority or off; and a check-only "any swap" area
// for a GKE node pool's swapConfig.
package swap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/nodectl/nodectl/host"
	"github.com/nodectl/nodectl/internal/procpath"

	"github.com/nodectl/nodectl/host/swapfile"
	"github.com/nodectl/nodectl/tuner"
)

// Backend is the backend's name, in setting IDs and state files.
const Backend = "swap"

// MaxPriority is the highest swap priority the kernel accepts.
const MaxPriority = 32767

// Area is one swap setting. With neither File nor Device it means any swap at all, which is
// only checked, never changed: Enabled says at least one area is on, !Enabled that none is.
type Area struct {
	// File is the node path of a swap file, created with Size bytes when missing.
	File string `json:"file,omitempty"`
	// Device is the node path of a block device already formatted as swap (mkswap); nodectl
	// never formats it.
	Device string `json:"device,omitempty"`
	Size   int64  `json:"size,omitempty"` // bytes; used only to create File
	// Priority is 0 to MaxPriority, higher used first, or -1 for the kernel's default.
	Priority int  `json:"priority"`
	Enabled  bool `json:"enabled"`
}

// Validate says what is wrong with a, naming the field and what is allowed.
func (a Area) Validate() error {
	if a.File != "" && a.Device != "" {
		return fmt.Errorf("swap: file %q and device %q both set: give one", a.File, a.Device)
	}
	for _, p := range []struct{ key, path string }{{"file", a.File}, {"device", a.Device}} {
		if p.path != "" && (!filepath.IsAbs(p.path) || filepath.Clean(p.path) != p.path) {
			return fmt.Errorf("swap: %s %q: want a clean absolute path on the node", p.key, p.path)
		}
	}
	if a.Priority < -1 || a.Priority > MaxPriority {
		return fmt.Errorf("swap %s: priority %d: want 0 to %d, or -1 for the kernel's default", a.name(), a.Priority, MaxPriority)
	}
	if a.File != "" && a.Enabled && a.Size < 1<<20 {
		return fmt.Errorf("swap file %s: size %d bytes: want at least 1 MiB, to create the file when it is missing", a.File, a.Size)
	}
	if a.File == "" && a.Size != 0 {
		return fmt.Errorf("swap %s: size %d: size is only for a swap file nodectl creates", a.name(), a.Size)
	}
	if a.File == "" && a.Device == "" && a.Priority != -1 {
		return fmt.Errorf("swap any: priority %d: an area that is only checked takes no priority (-1)", a.Priority)
	}
	return nil
}

func (a Area) name() string {
	switch {
	case a.File != "":
		return a.File
	case a.Device != "":
		return a.Device
	}
	return "any"
}

// New is the setting that makes a hold. Apply checks a (Validate) before changing anything.
func New(h host.FS, a Area) tuner.Setting { return &setting{h: h, a: a} }

// Decode rebuilds a swap setting from its Spec.
func Decode(h host.FS, spec json.RawMessage) (tuner.Setting, error) {
	var a Area
	dec := json.NewDecoder(strings.NewReader(string(spec)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		return nil, fmt.Errorf("decoding swap setting: %w", err)
	}
	if err := a.Validate(); err != nil {
		return nil, err
	}
	return New(h, a), nil
}

type setting struct {
	h host.FS
	a Area
}

// data is what Restore needs beyond the text.
type data struct {
	// Exists says the file or device was there; Restore deletes a file that was not.
	Exists bool `json:"exists"`
	On     bool `json:"on"`
	// Priority is the kernel's, negative for a default one; meaningful when On.
	Priority int `json:"priority"`
	// Missing are the file's parent directories (node paths) that did not exist: Apply
	// makes them and Restore removes them with the file.
	Missing []string `json:"missing_dirs,omitempty"`
}

func (s *setting) ID() string      { return Backend + ":" + s.a.name() }
func (s *setting) Backend() string { return Backend }
func (s *setting) Spec() any       { return s.a }
func (s *setting) Desired() string {
	if !s.a.Enabled {
		return "off"
	}
	return text(true, s.a.Priority)
}

// Note says that an "any swap" area is only checked.
func (s *setting) Note() string {
	if s.checkOnly() {
		return "check only: nodectl does not turn swap on or off without a file or device"
	}
	return ""
}

func (s *setting) checkOnly() bool { return s.a.File == "" && s.a.Device == "" }

// path is the area's node path as this process reaches it.
func (s *setting) path() string { return s.h.Path(s.a.name()) }

// text is how an area reads: "off", "on" at a default priority, or "on, priority N".
func text(on bool, prio int) string {
	switch {
	case !on:
		return "off"
	case prio < 0:
		return "on"
	}
	return "on, priority " + strconv.Itoa(prio)
}

// Read says whether the area is on and at which priority. An area whose file is missing reads
// as off: it is not on, and Data records that the file did not exist.
func (s *setting) Read(ctx context.Context) (tuner.Value, error) {
	areas, err := swapfile.Areas(s.h.Procfs)
	if err != nil {
		return tuner.Value{}, fmt.Errorf("reading %s: %w", s.ID(), err)
	}
	if s.checkOnly() {
		return tuner.Value{Present: true, Text: text(len(areas) > 0, -1)}, nil
	}
	d := data{}
	if _, err := os.Lstat(s.path()); err == nil {
		d.Exists = true
	} else if !errors.Is(err, os.ErrNotExist) {
		return tuner.Value{}, fmt.Errorf("reading %s: %w", s.ID(), err)
	} else if s.a.File != "" {
		d.Missing = s.h.MissingDirs(path.Dir(s.a.File))
	}
	if a, ok := find(s.h, s.a.name(), areas); ok {
		d.On, d.Priority = true, a.Priority
	}
	raw, err := json.Marshal(d)
	if err != nil {
		return tuner.Value{}, fmt.Errorf("reading %s: %w", s.ID(), err)
	}
	return tuner.Value{Present: true, Text: text(d.On, d.Priority), Data: raw}, nil
}

// Find returns the entry in <h.Procfs>/swaps of the swap file or device at path (a node path);
// ok is false when it is not on.
func Find(h host.FS, path string) (a swapfile.Area, ok bool, err error) {
	areas, err := swapfile.Areas(h.Procfs)
	if err != nil {
		return swapfile.Area{}, false, err
	}
	a, ok = find(h, path, areas)
	return a, ok, nil
}

// find returns the entry of path (a node path) in areas. The kernel prints the path it
// resolved, relative to the reader's root: the full path for a process that shares the node's
// root (the host, or a test whose scratch root is a directory), the node path for a DaemonSet
// reading the host's /proc, the target of a symlink (a /dev/disk/by-id name). The first is
// matched by name; the others as the same file found below the host's root, so an area of the
// same name on the machine itself is never taken for a scratch root's.
func find(h host.FS, path string, areas []swapfile.Area) (swapfile.Area, bool) {
	want := procpath.Escape(h.Path(path))
	for _, a := range areas {
		if a.Path == want {
			return a, true
		}
	}
	fi, err := os.Stat(h.Path(path))
	if err != nil {
		return swapfile.Area{}, false
	}
	for _, a := range areas {
		p := procpath.Unescape(a.Path)
		if !filepath.IsAbs(p) {
			continue
		}
		if other, err := os.Stat(h.Path(p)); err == nil && os.SameFile(fi, other) {
			return a, true
		}
	}
	return swapfile.Area{}, false
}

func (s *setting) refuse(what string) error {
	return fmt.Errorf("%s: cannot %s: this area only checks that some swap is %s (a node pool's swapConfig); nodectl does not know which swap file or device to use: name a file or a device to change swap",
		s.ID(), what, s.Desired())
}

// Suspects names what turns swap on or off on the node: swap entries in /etc/fstab (those
// naming this area, or all for "any") and systemd swap units, which swapon -a and boot use.
func (s *setting) Suspects(ctx context.Context, got tuner.Value) []string {
	var out []string
	if b, err := os.ReadFile(s.h.Path("/etc/fstab")); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) >= 3 && !strings.HasPrefix(f[0], "#") && f[2] == "swap" && (s.checkOnly() || f[0] == s.a.name()) {
				out = append(out, "/etc/fstab: "+strings.Join(f, " "))
			}
		}
	}
	for _, dir := range []string{"/etc/systemd/system", "/run/systemd/system", "/run/systemd/generator"} {
		units, _ := filepath.Glob(filepath.Join(s.h.Path(dir), "*.swap"))
		for _, u := range units {
			out = append(out, "systemd unit "+filepath.Join(dir, filepath.Base(u)))
		}
	}
	return out
}

// current reads the area's state for Apply and Restore.
func (s *setting) current(ctx context.Context) (tuner.Value, data, error) {
	v, err := s.Read(ctx)
	if err != nil {
		return v, data{}, err
	}
	var d data
	if err := json.Unmarshal(v.Data, &d); err != nil {
		return v, d, fmt.Errorf("reading %s: %w", s.ID(), err)
	}
	return v, d, nil
}

// Apply creates the swap file when missing, then turns the area on at the priority (off and
// on again when it is on at another one), or turns it off.
func (s *setting) Apply(ctx context.Context) error {
	if err := s.a.Validate(); err != nil {
		return err
	}
	if s.checkOnly() {
		v, err := s.Read(ctx)
		if err != nil {
			return err
		}
		if v.Text == s.Desired() {
			return nil
		}
		return s.refuse("apply")
	}
	v, cur, err := s.current(ctx)
	if err != nil {
		return err
	}
	if v.Text == s.Desired() {
		return nil
	}
	if !s.a.Enabled {
		return s.off(cur)
	}
	created := false
	if !cur.Exists {
		if s.a.Device != "" {
			return fmt.Errorf("%s: swap device %s does not exist", s.ID(), s.path())
		}
		if err := os.MkdirAll(filepath.Dir(s.path()), 0o755); err != nil {
			return fmt.Errorf("%s: %w", s.ID(), err)
		}
		if _, err := swapfile.Create(s.path(), s.a.Size); err != nil {
			return fmt.Errorf("%s: %w", s.ID(), err)
		}
		created = true
	}
	f, err := s.open(cur.On)
	if err == nil {
		err = f.Disable() // a no-op when off; else on at another priority
	}
	if err == nil {
		err = f.Enable(s.a.Priority)
	}
	if err != nil && created {
		os.Remove(s.path()) // leave nothing behind a failed apply
		_ = s.h.RemoveDirs(cur.Missing)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", s.ID(), err)
	}
	return nil
}

// open takes the existing area, refusing a file that holds something other than swap.
func (s *setting) open(on bool) (*swapfile.File, error) {
	f, err := swapfile.Open(s.path(), on)
	if errors.Is(err, swapfile.ErrNotSwap) {
		if s.a.Device != "" {
			return nil, fmt.Errorf("device %s: %w; format it with mkswap first (nodectl never formats a device: it would destroy what it holds)", s.path(), swapfile.ErrNotSwap)
		}
		return nil, fmt.Errorf("%s exists and is not a swap file (%w); nodectl will not overwrite it: remove it or choose another file", s.path(), swapfile.ErrNotSwap)
	}
	return f, err
}

// off turns the area off when it is on.
func (s *setting) off(cur data) error {
	if !cur.On {
		return nil
	}
	f, err := s.open(true)
	if err == nil {
		err = f.Disable()
	}
	if err != nil {
		return fmt.Errorf("%s: %w", s.ID(), err)
	}
	return nil
}

// Restore puts back what prev recorded: on at its priority, or off, and a swap file that did
// not exist removed.
func (s *setting) Restore(ctx context.Context, prev tuner.Value) error {
	if s.checkOnly() {
		v, err := s.Read(ctx)
		if err != nil {
			return err
		}
		if v.Present == prev.Present && v.Text == prev.Text {
			return nil // nothing was changed, nothing to put back
		}
		return s.refuse("restore " + fmt.Sprintf("%q", prev.Text))
	}
	var want data
	if err := json.Unmarshal(prev.Data, &want); err != nil {
		return fmt.Errorf("restoring %s: the recorded value has no swap state: %w", s.ID(), err)
	}
	_, cur, err := s.current(ctx)
	if err != nil {
		return err
	}
	if !want.On {
		if err := s.off(cur); err != nil {
			return err
		}
		if want.Exists || !cur.Exists || s.a.Device != "" {
			return nil
		}
		// Apply created the file. One without a swap signature is someone else's: kept.
		f, err := s.open(false)
		if errors.Is(err, swapfile.ErrNotSwap) {
			return nil
		}
		if err == nil {
			err = f.Remove()
		}
		if err == nil {
			err = s.h.RemoveDirs(want.Missing)
		}
		if err != nil {
			return fmt.Errorf("restoring %s: %w", s.ID(), err)
		}
		return nil
	}
	if cur.On && text(true, cur.Priority) == text(true, want.Priority) {
		return nil
	}
	if !cur.Exists {
		return fmt.Errorf("restoring %s: it was on, but %s is gone", s.ID(), s.path())
	}
	f, err := s.open(cur.On)
	if err == nil {
		err = f.Disable()
	}
	if err == nil {
		err = f.Enable(max(want.Priority, -1))
	}
	if err != nil {
		return fmt.Errorf("restoring %s: %w", s.ID(), err)
	}
	return nil
}
