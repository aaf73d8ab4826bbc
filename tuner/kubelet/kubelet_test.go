package kubelet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodectl/nodectl/host"

	"github.com/nodectl/nodectl/tuner"
	"github.com/nodectl/nodectl/tuner/internal/tunertest"
)

// documented is the drop-in exactly as docs/tuning.md shows it.
const documented = "# Written by nodectl tune. `nodectl tune rollback` removes it.\n" +
	"apiVersion: kubelet.config.k8s.io/v1beta1\n" +
	"kind: KubeletConfiguration\n" +
	"reservedSystemCPUs: \"0,1\"\n"

func scratch(t *testing.T) host.FS { return tunertest.Scratch(t, "") }

var read = tunertest.Read

func TestDropInAppliesAndRestoresAbsent(t *testing.T) {
	ctx := context.Background()
	h := scratch(t)
	s := NewDropIn(h, DefaultDropIn, "0,1")
	if s.ID() != "kubelet:"+DefaultDropIn || s.Backend() != "kubelet" || s.Desired() != "0,1" {
		t.Fatalf("id %s backend %s desired %s", s.ID(), s.Backend(), s.Desired())
	}
	prev := read(t, s)
	if prev.Present {
		t.Fatalf("absent drop-in reads present: %+v", prev)
	}
	if err := s.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	file := h.Path(DefaultDropIn)
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != documented {
		t.Errorf("drop-in bytes:\n%q\nwant\n%q", b, documented)
	}
	if v := read(t, s); !v.Present || v.Text != "0,1" {
		t.Errorf("after apply reads %+v, want present 0,1", v)
	}
	fi1, _ := os.Stat(file)
	if err := s.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	fi2, _ := os.Stat(file)
	if b2, _ := os.ReadFile(file); string(b2) != string(b) || !fi1.ModTime().Equal(fi2.ModTime()) {
		t.Errorf("applying twice rewrote the drop-in")
	}
	if err := s.Restore(ctx, prev); err != nil {
		t.Fatal(err)
	}
	if v := read(t, s); v.Present || v.Text != prev.Text {
		t.Errorf("after restore reads %+v, want absent", v)
	}
	// Every directory Apply made is gone: the scratch root is empty again.
	if ents, _ := os.ReadDir(h.Root); len(ents) != 0 {
		t.Errorf("restore left %v in the scratch root", ents)
	}
}

// What was there before is put back exactly: another's file (bytes, mode, owner) or a link.
func TestDropInRestoresWhatWasThere(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a file owned by another user")
	}
	for name, tc := range map[string]struct {
		make func(p string) error
		text string // what it reads as before apply
	}{
		"foreign_file": {func(p string) error {
			if err := os.WriteFile(p, []byte("kind: KubeletConfiguration\nreservedSystemCPUs: \"0\"\n"), 0o600); err != nil {
				return err
			}
			return os.Chmod(p, 0o600)
		}, `not written by nodectl (51 bytes), reservedSystemCPUs "0"`},
		"ours_owned_by_another": {func(p string) error {
			if err := os.WriteFile(p, []byte(documented), 0o644); err != nil {
				return err
			}
			return os.Chown(p, 1234, 5678)
		}, "0,1"},
		"link": {func(p string) error { return os.Symlink("/etc/kubernetes/other.conf", p) }, "a link to /etc/kubernetes/other.conf"},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			h := scratch(t)
			file := h.Path(DefaultDropIn)
			if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := tc.make(file); err != nil {
				t.Fatal(err)
			}
			before := state(t, file)
			s := NewDropIn(h, DefaultDropIn, "0-7")
			prev := read(t, s)
			if !prev.Present || prev.Text != tc.text {
				t.Fatalf("before apply reads %+v, want present %q", prev, tc.text)
			}
			if err := s.Apply(ctx); err != nil {
				t.Fatal(err)
			}
			if v := read(t, s); v.Text != "0-7" {
				t.Errorf("after apply reads %q", v.Text)
			}
			if err := s.Restore(ctx, prev); err != nil {
				t.Fatal(err)
			}
			if after := state(t, file); after != before {
				t.Errorf("restored %s, want %s", after, before)
			}
			if v := read(t, s); v.Present != prev.Present || v.Text != prev.Text {
				t.Errorf("after restore reads %+v, want %+v", v, prev)
			}
		})
	}
}

// state is a file's type, mode, owner and bytes, or a link's target.
func state(t *testing.T, p string) string {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	b, _ := os.ReadFile(p)
	link, _ := os.Readlink(p)
	return fmt.Sprintf("%v %d:%d %q -> %q", fi.Mode(), st.Uid, st.Gid, b, link)
}

func TestDropInDecodeRoundTrip(t *testing.T) {
	h := scratch(t)
	s := NewDropIn(h, DefaultDropIn, "0,1")
	raw, err := json.Marshal(s.Spec())
	if err != nil {
		t.Fatal(err)
	}
	d, err := Decode(h, raw)
	if err != nil {
		t.Fatal(err)
	}
	if d.ID() != s.ID() || d.Desired() != s.Desired() {
		t.Errorf("decoded %s %s, want %s %s", d.ID(), d.Desired(), s.ID(), s.Desired())
	}
	if _, err := Decode(h, []byte(`{"file":""}`)); err == nil {
		t.Error("decoding an empty spec succeeded")
	}
}

func TestDropInRefusesABadCPUList(t *testing.T) {
	h := scratch(t)
	err := NewDropIn(h, DefaultDropIn, "0,x").Apply(context.Background())
	if err == nil || !strings.Contains(err.Error(), `"0,x"`) {
		t.Errorf("bad CPU list: %v", err)
	}
}

// fakeKubelet returns a starter of shells named kubelet, so their command lines can carry any
// flags. Each waits in the shell's own read on a pipe nothing writes to, so no child (a second
// process named kubelet until it execs) comes and goes; each is killed when the test ends, or
// by the function start returns.
func fakeKubelet(t *testing.T) (start func(args ...string) (stop func())) {
	t.Helper()
	kubelet := filepath.Join(t.TempDir(), "kubelet")
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh to stand in for the kubelet")
	}
	b, err := os.ReadFile(sh)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kubelet, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return func(args ...string) func() {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(kubelet, append([]string{"-c", "read x", "kubelet"}, args...)...)
		cmd.Stdin = r
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		r.Close()
		stop := func() { cmd.Process.Kill(); cmd.Wait(); w.Close() }
		t.Cleanup(stop)
		// Start returns once the exec has begun (the child closed its close-on-exec files), and
		// the new program's arguments are set up after that: until then its cmdline reads empty
		// and the kubelet would be taken for one without flags.
		cmdline := fmt.Sprintf("/proc/%d/cmdline", cmd.Process.Pid)
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			if b, err := os.ReadFile(cmdline); err == nil && len(b) > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s still empty after 5s", cmdline)
			}
		}
		return stop
	}
}

// waitNotPending waits until r is no longer pending, a kubelet having started.
func waitNotPending(t *testing.T, r tuner.Restarter) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		p, err := r.Pending(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if !p {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("still pending after a kubelet started")
		}
	}
}

// A process named kubelet stands in for the kubelet: pending until one starts after the
// drop-in was written, or after a rollback removed it; the note says whether it reads the
// drop-in's directory.
func TestDropInIsPendingUntilTheKubeletRestarts(t *testing.T) {
	ctx := context.Background()
	h := scratch(t)
	s := NewDropIn(h, DefaultDropIn, "0,1")
	r := s.(tuner.Restarter)
	n := s.(tuner.Noter)
	if r.Restart() != "kubelet" {
		t.Errorf("restart %q", r.Restart())
	}
	prev := read(t, s)
	if err := s.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	// Written an hour from now: after every kubelet that may run here.
	future := time.Now().Add(time.Hour)
	if err := os.Chtimes(h.Path(DefaultDropIn), future, future); err != nil {
		t.Fatal(err)
	}
	if p, err := r.Pending(ctx); err != nil || !p {
		t.Errorf("pending %v %v with no kubelet started since, want pending", p, err)
	}
	// The drop-in was written a minute before this kubelet starts.
	past := time.Now().Add(-time.Minute)
	if err := os.Chtimes(h.Path(DefaultDropIn), past, past); err != nil {
		t.Fatal(err)
	}
	start := fakeKubelet(t)
	stop := start("--config=/var/lib/kubelet/config.yaml")
	waitNotPending(t, r)
	if note := n.Note(); !strings.Contains(note, "without --config-dir=/etc/kubernetes/kubelet.conf.d") {
		t.Errorf("note with a kubelet lacking --config-dir: %q", note)
	}
	stop()
	start("--config-dir=/etc/kubernetes/kubelet.conf.d")
	if note := n.Note(); strings.Contains(note, "config-dir") {
		t.Errorf("note with a kubelet reading the drop-in's directory: %q", note)
	}
	if err := os.Chtimes(h.Path(DefaultDropIn), future, future); err != nil {
		t.Fatal(err)
	}
	if p, _ := r.Pending(ctx); !p {
		t.Error("not pending although the drop-in is newer than the kubelet")
	}

	// Rolled back: the kubelet keeps the reserved CPUs until it restarts, so the removal is
	// pending as the write was. The scratch root's time (apply made every directory) dates it.
	if err := s.Restore(ctx, prev); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(h.Root, future, future); err != nil {
		t.Fatal(err)
	}
	if p, _ := r.Pending(ctx); !p {
		t.Error("not pending although the kubelet started before the rollback")
	}
	if err := os.Chtimes(h.Root, past, past); err != nil {
		t.Fatal(err)
	}
	if p, _ := r.Pending(ctx); p {
		t.Error("pending although the kubelet started after the rollback")
	}
	if got := configDir([]string{"kubelet", "--config-dir", "/etc/kubernetes/kubelet.conf.d/"}); got != "/etc/kubernetes/kubelet.conf.d" {
		t.Errorf("configDir: %q", got)
	}
}

// The note says what the static CPU manager needs: definitely when the kubelet's command line
// or configuration says static, as a condition when they cannot be read, nothing when the
// policy is none. It always says that rollback waits for a kubelet restart too.
func TestDropInNoteOnTheCPUManager(t *testing.T) {
	h := scratch(t)
	s := NewDropIn(h, DefaultDropIn, "0,1").(tuner.Noter)
	const rollback = "rollback too takes effect only when the kubelet restarts: until then it keeps the reserved CPUs"
	files := map[string]string{
		"/etc/kubelet/static.yaml":                        "kind: KubeletConfiguration\ncpuManagerPolicy: static # pinned pods\n",
		"/etc/kubelet/none.yaml":                          "kind: KubeletConfiguration\ncpuManagerPolicy: \"none\"\n",
		"/etc/kubelet/static.json":                        "{\n  \"kind\": \"KubeletConfiguration\",\n  \"cpuManagerPolicy\": \"static\",\n  \"maxPods\": 768\n}\n",
		"/etc/kubelet/silent.yaml":                        "kind: KubeletConfiguration\n",
		"/etc/kubernetes/kubelet.conf.d/50-static.conf":   "cpuManagerPolicy: static\n",
		"/etc/kubernetes/other.conf.d/50-static.conf":     "cpuManagerPolicy: static\n",
		"/etc/kubernetes/other.conf.d/60-none-later.conf": "cpuManagerPolicy: none\n",
	}
	for p, c := range files {
		if err := os.MkdirAll(filepath.Dir(h.Path(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(h.Path(p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	static := "the kubelet's cpuManagerPolicy is static: before the kubelet restarts (after apply or rollback), drain the node and remove /var/lib/kubelet/cpu_manager_state: " +
		"the kubelet refuses to start when its checkpoint has a reserved CPU assigned to a container"
	unknown := "if cpuManagerPolicy is static, before the kubelet restarts (after apply or rollback), drain the node and remove /var/lib/kubelet/cpu_manager_state: " +
		"the kubelet refuses to start when its checkpoint has a reserved CPU assigned to a container"
	start := fakeKubelet(t)
	for name, tc := range map[string]struct {
		args []string
		want string // the CPU manager's part, "" for none
	}{
		"flag_static":       {[]string{"--cpu-manager-policy=static", "--config=/etc/kubelet/none.yaml"}, static},
		"flag_none":         {[]string{"--cpu-manager-policy", "none", "--config=/etc/kubelet/static.yaml"}, ""},
		"config_static":     {[]string{"--config=/etc/kubelet/static.yaml"}, static},
		"config_json":       {[]string{"--config", "/etc/kubelet/static.json"}, static},
		"config_none":       {[]string{"--config=/etc/kubelet/none.yaml"}, ""},
		"default_none":      {[]string{"--config=/etc/kubelet/silent.yaml"}, ""},
		"drop_in_static":    {[]string{"--config=/etc/kubelet/none.yaml", "--config-dir=/etc/kubernetes/kubelet.conf.d"}, static},
		"later_drop_in":     {[]string{"--config=/etc/kubelet/static.yaml", "--config-dir=/etc/kubernetes/other.conf.d"}, ""},
		"config_unreadable": {[]string{"--config=/etc/kubelet/missing.yaml"}, unknown},
		"root_dir": {[]string{"--config=/etc/kubelet/static.yaml", "--root-dir=/data/kubelet"},
			strings.Replace(static, "/var/lib/kubelet/", "/data/kubelet/", 1)},
	} {
		t.Run(name, func(t *testing.T) {
			stop := start(tc.args...)
			defer stop()
			note := s.Note()
			if !strings.HasSuffix(note, rollback) {
				t.Errorf("note %q does not end in %q", note, rollback)
			}
			if tc.want == "" && strings.Contains(note, "cpu_manager_state") || tc.want != "" && !strings.Contains(note, tc.want) {
				t.Errorf("note %q, want the CPU manager's part %q", note, tc.want)
			}
		})
	}
	// No kubelet runs: its policy is unknown.
	if note := s.Note(); !strings.Contains(note, "no kubelet runs") || !strings.Contains(note, unknown) {
		t.Errorf("note with no kubelet: %q", note)
	}
}

// Through the engine: a failure at each step of applying the drop-in leaves the scratch root
// as it was (no file, no directory, no state); a complete apply rolls back from the state file.
func TestDropInFailuresLeaveNothing(t *testing.T) {
	ctx := context.Background()
	h := scratch(t)
	state := filepath.Join(t.TempDir(), "state.json")
	engine := func(fault func(tuner.Step, string) error) *tuner.Engine {
		return &tuner.Engine{Profile: "test", Settings: []tuner.Setting{NewDropIn(h, DefaultDropIn, "0,1")}, State: state, Fault: fault,
			Decode: func(_ string, spec json.RawMessage) (tuner.Setting, error) { return Decode(h, spec) }}
	}
	empty := func(t *testing.T) {
		t.Helper()
		if ents, _ := os.ReadDir(h.Root); len(ents) != 0 {
			t.Errorf("the scratch root holds %v", ents)
		}
		if _, err := os.Stat(state); err == nil {
			t.Error("the state file is left")
		}
	}
	for _, step := range []tuner.Step{tuner.StepRead, tuner.StepRecord, tuner.StepApply, tuner.StepVerify} {
		t.Run(string(step), func(t *testing.T) {
			_, err := engine(func(at tuner.Step, _ string) error {
				if at == step {
					return errors.New("injected")
				}
				return nil
			}).Apply(ctx)
			if err == nil || !strings.Contains(err.Error(), "injected") {
				t.Fatalf("apply with a failure at %s: %v", step, err)
			}
			empty(t)
		})
	}
	if _, err := engine(nil).Apply(ctx); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(h.Path(DefaultDropIn)); string(b) != documented {
		t.Errorf("applied %q", b)
	}
	if _, err := engine(nil).Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	empty(t)
}
