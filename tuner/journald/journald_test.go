package journald

import (
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodectl/nodectl/host"

	"github.com/nodectl/nodectl/tuner"
	"github.com/nodectl/nodectl/tuner/internal/tunertest"
)

// documented is the drop-in as docs/tuning.md shows it, byte for byte.
const documented = "# Written by nodectl tune. `nodectl tune rollback` removes it.\n" +
	"[Journal]\n" +
	"SystemMaxUse=500M\n" +
	"RateLimitIntervalSec=30s\n" +
	"RateLimitBurst=1000\n"

func scratch(t *testing.T) host.FS {
	return tunertest.Scratch(t, "files owned by others, bind mounts")
}

var (
	tree = tunertest.Tree
	read = tunertest.Read
)

var entries = []Entry{{"SystemMaxUse", "500M"}, {"RateLimitIntervalSec", "30s"}, {"RateLimitBurst", "1000"}}

// On a mounted root (a tuner pod's /host) the node's own systemctl runs chrooted by the
// kernel: nodectl's image has no chroot binary.
func TestRestartCommand(t *testing.T) {
	for name, tc := range map[string]struct {
		root, chroot string
	}{
		"host_root":    {"/", ""},
		"empty_root":   {"", ""},
		"mounted_root": {"/host", "/host"},
		"unclean_root": {"/host/", "/host"},
	} {
		t.Run(name, func(t *testing.T) {
			c := restartCommand(t.Context(), host.FS{Root: tc.root})
			if got := strings.Join(c.Args, " "); !strings.HasSuffix(got, "systemctl restart systemd-journald") {
				t.Errorf("args %q, want systemctl restart systemd-journald", got)
			}
			chroot := ""
			if c.SysProcAttr != nil {
				chroot = c.SysProcAttr.Chroot
			}
			if chroot != tc.chroot || (tc.chroot != "" && (c.Dir != "/" || !strings.HasPrefix(c.Path, "/"))) {
				t.Errorf("chroot %q dir %q path %q, want chroot %q, dir / and a path inside it", chroot, c.Dir, c.Path, tc.chroot)
			}
		})
	}
}

func TestNote(t *testing.T) {
	root := t.TempDir()
	h := host.FS{Root: root, Procfs: "/proc"}
	want := "systemd is not running under " + root + ": journald is not restarted; the drop-in applies when journald next starts"
	if got := NewDropIn(h, DefaultDropIn, entries).(tuner.Noter).Note(); got != want {
		t.Errorf("Note = %q, want %q", got, want)
	}
	if got := NewStorage(h, "/ssd/journal", "/var/log/journal").(tuner.Noter).Note(); !strings.Contains(got, "systemd is not running under "+root) {
		t.Errorf("storage Note = %q", got)
	}
	if err := os.MkdirAll(filepath.Join(root, "run/systemd/system"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := NewDropIn(h, DefaultDropIn, entries).(tuner.Noter).Note(); got != "" {
		t.Errorf("with systemd, Note = %q, want none", got)
	}
}

func TestDropInWritten(t *testing.T) {
	h := scratch(t)
	ctx := context.Background()
	if string(Render(entries)) != documented {
		t.Fatalf("Render = %q, want %q", Render(entries), documented)
	}
	if doc, err := os.ReadFile("../../docs/tuning.md"); err != nil || !strings.Contains(string(doc), "```\n"+documented+"```\n") {
		t.Errorf("docs/tuning.md does not show the drop-in byte for byte (%v)", err)
	}
	empty := tree(t, h.Root)
	s := NewDropIn(h, DefaultDropIn, entries)
	if s.ID() != "journald:"+DefaultDropIn || s.Backend() != "journald" {
		t.Errorf("ID %s, backend %s", s.ID(), s.Backend())
	}
	if want := "SystemMaxUse=500M RateLimitIntervalSec=30s RateLimitBurst=1000"; s.Desired() != want {
		t.Errorf("Desired = %q, want %q", s.Desired(), want)
	}
	prev := read(t, s)
	if prev.Present {
		t.Fatalf("reads %+v before apply", prev)
	}
	if err := s.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	p := h.Path(DefaultDropIn)
	b, err := os.ReadFile(p)
	if err != nil || string(b) != documented {
		t.Fatalf("drop-in is %q, %v; want %q", b, err, documented)
	}
	if fi, _ := os.Stat(p); fi.Mode() != 0o644 {
		t.Errorf("drop-in mode %v, want 0644", fi.Mode())
	}
	if v := read(t, s); !v.Present || v.Text != s.Desired() {
		t.Errorf("reads %+v after apply", v)
	}

	// A second apply changes nothing: an old mtime stays.
	old := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := os.Chtimes(p, old, old); err != nil {
		t.Fatal(err)
	}
	applied := tree(t, h.Root)
	if err := s.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	if got := tree(t, h.Root); !slices.Equal(got, applied) {
		t.Errorf("second apply changed the tree:\n%s\nwas\n%s", strings.Join(got, "\n"), strings.Join(applied, "\n"))
	}
	if fi, _ := os.Stat(p); !fi.ModTime().Equal(old) {
		t.Errorf("second apply rewrote the drop-in: mtime %v", fi.ModTime())
	}

	spec, _ := json.Marshal(s.Spec())
	d, err := DecodeDropIn(h, spec)
	if err != nil {
		t.Fatal(err)
	}
	if d.ID() != s.ID() || d.Desired() != s.Desired() {
		t.Errorf("DecodeDropIn(%s) = %s %q", spec, d.ID(), d.Desired())
	}
	// Restore of the absent value removes the file and every directory Apply made.
	if err := d.Restore(ctx, prev); err != nil {
		t.Fatal(err)
	}
	if got := tree(t, h.Root); !slices.Equal(got, empty) {
		t.Errorf("after restore the root holds:\n%s", strings.Join(got, "\n"))
	}
	if v := read(t, s); v.Present != prev.Present || v.Text != prev.Text {
		t.Errorf("reads %+v after restore, want %+v", v, prev)
	}
}

func TestDropInKeepsExistingDirectory(t *testing.T) {
	h := scratch(t)
	ctx := context.Background()
	dir := h.Path("/etc/systemd/journald.conf.d")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	before := tree(t, h.Root)
	s := NewDropIn(h, DefaultDropIn, entries)
	prev := read(t, s)
	if err := s.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Restore(ctx, prev); err != nil {
		t.Fatal(err)
	}
	if got := tree(t, h.Root); !slices.Equal(got, before) {
		t.Errorf("after restore:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(before, "\n"))
	}
}

func TestDropInRestoresUserFile(t *testing.T) {
	for name, make := range map[string]func(p string) error{
		"file": func(p string) error {
			if err := os.WriteFile(p, []byte("[Journal]\nSystemMaxUse=1G\n# mine\n"), 0o600); err != nil {
				return err
			}
			if err := os.Chmod(p, 0o600); err != nil {
				return err
			}
			return os.Chown(p, 1234, 5678)
		},
		"our_bytes_other_mode": func(p string) error {
			if err := os.WriteFile(p, []byte(documented), 0o640); err != nil {
				return err
			}
			return os.Chmod(p, 0o640)
		},
		"link": func(p string) error { return os.Symlink("/dev/null", p) },
	} {
		t.Run(name, func(t *testing.T) {
			h := scratch(t)
			ctx := context.Background()
			p := h.Path(DefaultDropIn)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := make(p); err != nil {
				t.Fatal(err)
			}
			before := tree(t, h.Root)
			s := NewDropIn(h, DefaultDropIn, entries)
			prev := read(t, s)
			if !prev.Present || prev.Text == s.Desired() {
				t.Fatalf("a user's file reads %+v", prev)
			}
			t.Logf("user's file reads %q", prev.Text)
			if err := s.Apply(ctx); err != nil {
				t.Fatal(err)
			}
			if b, _ := os.ReadFile(p); string(b) != documented {
				t.Errorf("after apply the drop-in is %q", b)
			}
			if v := read(t, s); v.Text != s.Desired() {
				t.Errorf("reads %q after apply", v.Text)
			}
			if err := s.Restore(ctx, prev); err != nil {
				t.Fatal(err)
			}
			if after := tree(t, h.Root); !slices.Equal(after, before) {
				t.Errorf("after restore:\n%s\nwant\n%s", strings.Join(after, "\n"), strings.Join(before, "\n"))
			}
			if v := read(t, s); v.Present != prev.Present || v.Text != prev.Text {
				t.Errorf("reads %+v after restore, want %+v", v, prev)
			}
		})
	}
}

func TestDropInText(t *testing.T) {
	s := NewDropIn(host.FS{Root: "/nonexistent"}, DefaultDropIn, entries).(*dropIn)
	for name, tc := range map[string]struct {
		b    string
		mode fs.FileMode
		want string
	}{
		"ours":        {documented, 0o644, s.Desired()},
		"ours_0600":   {documented, 0o600, s.Desired() + " (mode 0600, not 0644)"},
		"other":       {"[Journal]\nSystemMaxUse=1G\n[Upload]\nURL=x\n", 0o644, "other content (41 bytes): SystemMaxUse=1G"},
		"same_values": {"[Journal]\nSystemMaxUse=500M\nRateLimitIntervalSec=30s\nRateLimitBurst=1000\n", 0o644, "other content (73 bytes): SystemMaxUse=500M RateLimitIntervalSec=30s RateLimitBurst=1000"},
		"nothing":     {"# empty\n", 0o644, "other content (8 bytes), no [Journal] settings"},
	} {
		t.Run(name, func(t *testing.T) {
			if got := s.describe([]byte(tc.b), tc.mode); got != tc.want {
				t.Errorf("describe = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestDropInDecodeErrors(t *testing.T) {
	for name, spec := range map[string]string{
		"relative":     `{"file":"etc/x.conf","entries":[{"key":"A","value":"1"}]}`,
		"not_conf":     `{"file":"/etc/systemd/journald.conf.d/x","entries":[{"key":"A","value":"1"}]}`,
		"no_entries":   `{"file":"/etc/systemd/journald.conf.d/x.conf","entries":[]}`,
		"bad_key":      `{"file":"/etc/systemd/journald.conf.d/x.conf","entries":[{"key":"A=B","value":"1"}]}`,
		"newline":      `{"file":"/etc/systemd/journald.conf.d/x.conf","entries":[{"key":"A","value":"1\n[Unit]"}]}`,
		"unclean_path": `{"file":"/etc/systemd/../x.conf","entries":[{"key":"A","value":"1"}]}`,
		"not_json":     `{`,
	} {
		if _, err := DecodeDropIn(host.FS{}, json.RawMessage(spec)); err == nil {
			t.Errorf("%s: DecodeDropIn(%s) succeeded", name, spec)
		}
	}
	err := NewDropIn(host.FS{Root: t.TempDir()}, "/x.conf", []Entry{{"Bad Key", "1"}}).Apply(context.Background())
	if err == nil || !strings.Contains(err.Error(), `key "Bad Key"`) {
		t.Errorf("Apply with a bad key: %v", err)
	}
}

func TestDropInSuspects(t *testing.T) {
	root := t.TempDir()
	h := host.FS{Root: root, Procfs: "/proc"}
	files := map[string]string{
		DefaultDropIn: documented,
		"/etc/systemd/journald.conf.d/10-early.conf":     "[Journal]\nSystemMaxUse=1G\n",
		"/etc/systemd/journald.conf.d/99-late.conf":      "[Journal]\nSystemMaxUse=2G\nStorage=persistent\n",
		"/run/systemd/journald.conf.d/95-rate.conf":      "[Journal]\nRateLimitBurst=10000\n",
		"/usr/lib/systemd/journald.conf.d/99-late.conf":  "[Journal]\nRateLimitBurst=1\n", // masked by /etc's
		"/usr/lib/systemd/journald.conf.d/97-other.conf": "[Journal]\nCompress=yes\n",
		"/etc/systemd/journald.conf":                     "[Journal]\n#SystemMaxUse=\nRateLimitIntervalSec=1s\n",
	}
	for p, c := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mtime := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	if err := os.Chtimes(h.Path(DefaultDropIn), mtime, mtime); err != nil {
		t.Fatal(err)
	}
	s := NewDropIn(h, DefaultDropIn, entries)
	got := s.(tuner.Suspecter).Suspects(context.Background(), tuner.Value{})
	want := []string{
		"/run/systemd/journald.conf.d/95-rate.conf sorts after 90-nodectl.conf and sets RateLimitBurst=10000, overriding the drop-in",
		"/etc/systemd/journald.conf.d/99-late.conf sorts after 90-nodectl.conf and sets SystemMaxUse=2G, overriding the drop-in",
		"/etc/systemd/journald.conf sets RateLimitIntervalSec=1s (in effect where no drop-in sets it)",
		DefaultDropIn + " was last modified at 2026-11-30T09:00:00Z",
	}
	if !slices.Equal(got, want) {
		t.Errorf("suspects:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// Removed: the directory's mtime says when.
	if err := os.Remove(h.Path(DefaultDropIn)); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(h.Path("/etc/systemd/journald.conf.d"), mtime, mtime); err != nil {
		t.Fatal(err)
	}
	got = s.(tuner.Suspecter).Suspects(context.Background(), tuner.Value{})
	if w := DefaultDropIn + " is missing; /etc/systemd/journald.conf.d was last modified at 2026-11-30T09:00:00Z"; len(got) == 0 || got[len(got)-1] != w {
		t.Errorf("suspects of a removed drop-in: %q, want last %q", got, w)
	}

	// A drop-in of the same name read first masks ours.
	run := NewDropIn(h, "/run/systemd/journald.conf.d/99-late.conf", entries)
	got = run.(tuner.Suspecter).Suspects(context.Background(), tuner.Value{})
	if len(got) == 0 || got[0] != "/etc/systemd/journald.conf.d/99-late.conf has the drop-in's name in a directory read first, so journald reads it instead" {
		t.Errorf("suspects of a masked drop-in: %q", got)
	}
}
