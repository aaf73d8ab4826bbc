//go:build linux

package watch

import (
	"context"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/nodectl/nodectl/tuner"
)

// gcThresh1 is a test-local sysctl setting on the real kernel (the sysctl backend is another
// package's).
const gcThresh1 = "/proc/sys/net/ipv4/neigh/default/gc_thresh1"

type sysctlFile struct{ Path, Want string }

func (s *sysctlFile) ID() string      { return "test-sysctl:" + s.Path }
func (s *sysctlFile) Backend() string { return "test-sysctl" }
func (s *sysctlFile) Desired() string { return s.Want }
func (s *sysctlFile) Spec() any       { return s }
func (s *sysctlFile) Read(context.Context) (tuner.Value, error) {
	b, err := os.ReadFile(s.Path)
	return tuner.Value{Present: true, Text: strings.TrimSpace(string(b))}, err
}
func (s *sysctlFile) Apply(context.Context) error { return write(s.Path, s.Want) }
func (s *sysctlFile) Restore(_ context.Context, prev tuner.Value) error {
	return write(s.Path, prev.Text)
}

func write(path, v string) error { return os.WriteFile(path, []byte(v), 0o644) }

// A real sysctl applied at start, changed behind the watcher's back, is reported as drift, and
// holding again clears it; rollback then restores the machine's value.
func TestRealSysctlDrift(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to write sysctls")
	}
	b, err := os.ReadFile(gcThresh1)
	if err != nil {
		t.Fatal(err)
	}
	orig := strings.TrimSpace(string(b))
	t.Cleanup(func() {
		if err := write(gcThresh1, orig); err != nil {
			t.Errorf("restoring %s to %s: %v", gcThresh1, orig, err)
		}
	})
	n, err := strconv.Atoi(orig)
	if err != nil {
		t.Fatal(err)
	}
	want, other := strconv.Itoa(n+64), strconv.Itoa(n+128)
	s := &sysctlFile{Path: gcThresh1, Want: want}
	e := engine(t, s)
	e.Decode = func(_ string, spec json.RawMessage) (tuner.Setting, error) {
		var d sysctlFile
		return &d, json.Unmarshal(spec, &d)
	}
	l := &logs{}
	reg := watch(t, e, true, l)
	drifted := func() float64 {
		return metric(t, reg, "nodectl_tune_setting_drifted", "setting", s.ID(), "backend", "test-sysctl")
	}

	eventually(t, "apply and a clean verify", func() bool {
		return metric(t, reg, "nodectl_tune_apply_total", "result", "ok") == 1 && drifted() == 0
	})
	if v, _ := s.Read(context.Background()); v.Text != want {
		t.Fatalf("%s is %s after apply, want %s", gcThresh1, v.Text, want)
	}
	if err := write(gcThresh1, other); err != nil {
		t.Fatal(err)
	}
	eventually(t, "drift reported", func() bool {
		return drifted() == 1 && metric(t, reg, "nodectl_tune_drifted_settings") == 1
	})
	if l.count("setting drifted", s.ID()) != 1 {
		t.Fatalf("want one drift log:\n%s", l)
	}
	if err := write(gcThresh1, want); err != nil {
		t.Fatal(err)
	}
	eventually(t, "drift cleared", func() bool {
		return drifted() == 0 && metric(t, reg, "nodectl_tune_drifted_settings") == 0
	})
	if _, err := e.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	if v, _ := s.Read(context.Background()); v.Text != orig {
		t.Fatalf("%s is %s after rollback, want %s", gcThresh1, v.Text, orig)
	}
}
