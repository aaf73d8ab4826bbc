package watch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/nodectl/nodectl/tuner"
)

const interval = 20 * time.Millisecond

// fake is a setting whose value the test changes behind the engine's back.
type fake struct {
	id, want string
	suspects []string

	mu       sync.Mutex
	val      string
	readErr  error
	applyErr error
}

func (f *fake) ID() string      { return f.id }
func (f *fake) Backend() string { return "fake" }
func (f *fake) Desired() string { return f.want }
func (f *fake) Spec() any       { return f.id }
func (f *fake) Read(context.Context) (tuner.Value, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return tuner.Value{Present: true, Text: f.val}, f.readErr
}
func (f *fake) Apply(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.applyErr != nil {
		return f.applyErr
	}
	f.val = f.want
	return nil
}
func (f *fake) Restore(_ context.Context, prev tuner.Value) error {
	f.set(prev.Text)
	return nil
}
func (f *fake) Suspects(context.Context, tuner.Value) []string { return f.suspects }

func (f *fake) set(v string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.val = v
}

func (f *fake) failReads(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.readErr = err
}

// restarter is a fake that waits for a daemon restart.
type restarter struct {
	*fake
	pending bool
}

func (r *restarter) Restart() string                       { return "kubelet" }
func (r *restarter) Pending(context.Context) (bool, error) { return r.pending, nil }

// logs is a slog JSON handler's output, safe to read while Run writes.
type logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// count is the number of records with message msg about setting id.
func (l *logs) count(msg, id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range strings.Split(l.buf.String(), "\n") {
		var r map[string]any
		if json.Unmarshal([]byte(line), &r) == nil && r["msg"] == msg && r["setting"] == id {
			n++
		}
	}
	return n
}

func (l *logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// watch runs Run in the background until the test ends, and returns the registry its
// metrics are in.
func watch(t *testing.T, e *tuner.Engine, applyOnStart bool, l *logs) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	m := NewMetrics(reg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{Engine: e, Interval: interval, ApplyOnStart: applyOnStart, Log: slog.New(slog.NewJSONHandler(l, nil))}, m)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("run did not return after its context was cancelled")
		}
	})
	return reg
}

func engine(t *testing.T, settings ...tuner.Setting) *tuner.Engine {
	return &tuner.Engine{Profile: "test", Settings: settings, State: filepath.Join(t.TempDir(), "state.json")}
}

// metric is the value of the series name{labels}, from a gather of reg.
func metric(t *testing.T, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue series
				}
			}
			switch {
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			}
		}
	}
	return -1 // no such series
}

// eventually waits, polling, until cond holds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestDriftLoggedOnceAndExported(t *testing.T) {
	a := &fake{id: "fake:a", want: "2", val: "1", suspects: []string{"/etc/sysctl.d/99-other.conf"}}
	b := &fake{id: "fake:b", want: "x", val: "x"}
	l := &logs{}
	reg := watch(t, engine(t, a, b), true, l)

	eventually(t, "apply and a clean verify", func() bool {
		return metric(t, reg, "nodectl_tune_apply_total", "result", "ok") == 1 &&
			metric(t, reg, "nodectl_tune_verify_total", "result", "ok") >= 1
	})
	if got := metric(t, reg, "nodectl_tune_drifted_settings"); got != 0 {
		t.Fatalf("drifted settings %v after apply, want 0", got)
	}
	if metric(t, reg, "nodectl_tune_last_verify_timestamp_seconds") <= 0 {
		t.Fatal("no last verify time")
	}

	a.set("5")
	eventually(t, "drift of fake:a", func() bool {
		return metric(t, reg, "nodectl_tune_drifted_settings") == 1 &&
			metric(t, reg, "nodectl_tune_setting_drifted", "setting", "fake:a", "backend", "fake") == 1
	})
	drifts := metric(t, reg, "nodectl_tune_verify_total", "result", "drift")
	eventually(t, "three more verifications", func() bool {
		return metric(t, reg, "nodectl_tune_verify_total", "result", "drift") >= drifts+3
	})
	if n := l.count("setting drifted", "fake:a"); n != 1 {
		t.Fatalf("drift logged %d times over several verifications, want once:\n%s", n, l)
	}
	if !strings.Contains(l.String(), `"suspects":["/etc/sysctl.d/99-other.conf"]`) || !strings.Contains(l.String(), `"current":"5"`) {
		t.Fatalf("the drift log lacks the value or the suspects:\n%s", l)
	}
	a.set("6") // drifts elsewhere: logged again
	eventually(t, "the second drift logged", func() bool { return l.count("setting drifted", "fake:a") == 2 })

	a.set("2")
	eventually(t, "fake:a holding again", func() bool {
		return metric(t, reg, "nodectl_tune_drifted_settings") == 0 && l.count("setting holds again", "fake:a") == 1
	})
	want := `
# HELP nodectl_tune_setting_drifted 1 when the setting differs from the desired value at the last verification, else 0.
# TYPE nodectl_tune_setting_drifted gauge
nodectl_tune_setting_drifted{backend="fake",setting="fake:a"} 0
nodectl_tune_setting_drifted{backend="fake",setting="fake:b"} 0
# HELP nodectl_tune_pending_restarts Number of settings that take effect only when a daemon restarts and wait for it.
# TYPE nodectl_tune_pending_restarts gauge
nodectl_tune_pending_restarts 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "nodectl_tune_setting_drifted", "nodectl_tune_pending_restarts"); err != nil {
		t.Fatal(err)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Fatalf("metric lint: %v %+v", err, problems)
	}
}

func TestApplyFailureIsNotFatal(t *testing.T) {
	a := &fake{id: "fake:a", want: "2", val: "1", applyErr: errors.New("read-only file system")}
	l := &logs{}
	reg := watch(t, engine(t, a), true, l)
	eventually(t, "the failed apply counted and drift verified", func() bool {
		return metric(t, reg, "nodectl_tune_apply_total", "result", "error") == 1 &&
			metric(t, reg, "nodectl_tune_verify_total", "result", "drift") >= 2
	})
	if metric(t, reg, "nodectl_tune_apply_total", "result", "ok") != 0 || metric(t, reg, "nodectl_tune_drifted_settings") != 1 {
		t.Fatal("want no successful apply and one drifted setting")
	}
	if !strings.Contains(l.String(), "read-only file system") {
		t.Fatalf("the apply error is not logged:\n%s", l)
	}
}

func TestVerifyErrorCounted(t *testing.T) {
	a := &fake{id: "fake:a", want: "2", val: "2"}
	reg := watch(t, engine(t, a), false, &logs{})
	eventually(t, "a clean verify", func() bool { return metric(t, reg, "nodectl_tune_verify_total", "result", "ok") >= 1 })
	a.failReads(errors.New("permission denied"))
	eventually(t, "verify errors", func() bool { return metric(t, reg, "nodectl_tune_verify_total", "result", "error") >= 2 })
	if metric(t, reg, "nodectl_tune_apply_total", "result", "ok") != 0 {
		t.Fatal("applied without ApplyOnStart")
	}
}

func TestPendingRestarts(t *testing.T) {
	held := &restarter{fake: &fake{id: "kubelet:held", want: "a", val: "a"}, pending: true}
	drifted := &restarter{fake: &fake{id: "kubelet:drifted", want: "b", val: "c"}, pending: true}
	reg := watch(t, engine(t, held, drifted), false, &logs{})
	eventually(t, "a verify", func() bool { return metric(t, reg, "nodectl_tune_verify_total", "result", "drift") >= 1 })
	if p, d := metric(t, reg, "nodectl_tune_pending_restarts"), metric(t, reg, "nodectl_tune_drifted_settings"); p != 1 || d != 1 {
		t.Fatalf("pending %v drifted %v, want the held setting pending and the other drifted", p, d)
	}
}

func TestConfigRefused(t *testing.T) {
	e := engine(t, &fake{id: "fake:a", want: "1", val: "1"})
	for name, cfg := range map[string]Config{
		"no_engine":     {Interval: time.Second},
		"zero_interval": {Engine: e},
	} {
		if err := Run(context.Background(), cfg, nil); err == nil {
			t.Errorf("%s: accepted", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	// Without metrics it still runs, and returns nil when stopped.
	ctx, cancel := context.WithTimeout(context.Background(), 5*interval)
	defer cancel()
	if err := Run(ctx, Config{Engine: e, Interval: interval, ApplyOnStart: true}, nil); err != nil {
		t.Fatal(err)
	}
}

func TestNewMetricsTwicePanics(t *testing.T) {
	reg := prometheus.NewRegistry()
	NewMetrics(reg)
	defer func() {
		if recover() == nil {
			t.Fatal("registering the metrics twice did not panic")
		}
	}()
	NewMetrics(reg)
}
