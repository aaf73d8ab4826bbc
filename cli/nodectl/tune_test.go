package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// Real sysctls the tune tests change; each test puts back the values it found, also when it
// fails.
var tuneSysctls = []string{
	"net.ipv4.neigh.default.gc_thresh1", "net.ipv4.neigh.default.gc_thresh2", "net.ipv4.neigh.default.gc_thresh3",
	"net.ipv6.neigh.default.gc_thresh1", "net.ipv6.neigh.default.gc_thresh2", "net.ipv6.neigh.default.gc_thresh3",
	"vm.swappiness", "vm.watermark_scale_factor",
}

func sysctlPath(key string) string { return "/proc/sys/" + strings.ReplaceAll(key, ".", "/") }

func readSysctl(t *testing.T, key string) string {
	t.Helper()
	b, err := os.ReadFile(sysctlPath(key))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// keepSysctls records the sysctls now and restores them when the test ends.
func keepSysctls(t *testing.T) map[string]string {
	t.Helper()
	orig := map[string]string{}
	for _, k := range tuneSysctls {
		orig[k] = readSysctl(t, k)
	}
	t.Cleanup(func() {
		for k, v := range orig {
			if err := os.WriteFile(sysctlPath(k), []byte(v), 0o644); err != nil {
				t.Errorf("restoring %s: %v", k, err)
			}
		}
	})
	return orig
}

// tuneScratch is a scratch host root for tune commands: files below it, the kernel's real
// procfs and sysfs.
func tuneScratch(t *testing.T) (root string, flags []string) {
	t.Helper()
	root = t.TempDir()
	return root, []string{"--host-root", root, "--procfs", "/proc", "--sysfs", "/sys"}
}

func writeProfile(t *testing.T, dir, text string) string {
	t.Helper()
	p := filepath.Join(dir, "profile-"+strconv.Itoa(len(text))+".yaml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

type tuneReport struct {
	Profile  string `json:"profile"`
	Changes  int    `json:"changes"`
	Settings []struct {
		ID       string   `json:"id"`
		Current  string   `json:"current"`
		Desired  string   `json:"desired"`
		Change   bool     `json:"change"`
		Suspects []string `json:"suspects"`
	} `json:"settings"`
}

func parseTune(t *testing.T, out string) tuneReport {
	t.Helper()
	var r tuneReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("parsing %q: %v", out, err)
	}
	return r
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// Plan shows the difference, apply changes the real sysctls, verify is clean, a manual change
// is drift (exit 3), rollback restores the exact earlier values.
func TestTuneRealSysctls(t *testing.T) {
	requireRoot(t)
	orig := keepSysctls(t)
	root, flags := tuneScratch(t)
	n := func(k string, add int) string {
		v, err := strconv.Atoi(orig[k])
		if err != nil {
			t.Fatal(err)
		}
		return strconv.Itoa(v + add)
	}
	// Desired values differ from whatever the machine has, in gc_thresh order.
	want := map[string]string{
		"net.ipv4.neigh.default.gc_thresh1": n("net.ipv4.neigh.default.gc_thresh1", 7),
		"net.ipv4.neigh.default.gc_thresh2": n("net.ipv4.neigh.default.gc_thresh2", 7),
		"net.ipv4.neigh.default.gc_thresh3": n("net.ipv4.neigh.default.gc_thresh3", 7),
		"vm.watermark_scale_factor":         n("vm.watermark_scale_factor", 3),
	}
	var prof strings.Builder
	prof.WriteString("name: e2e-sysctls\nsysctl:\n")
	for k, v := range want {
		prof.WriteString("  " + k + ": " + v + "\n")
	}
	args := append([]string{"--profile", writeProfile(t, root, prof.String())}, flags...)

	out, err := nodectl(t, append([]string{"tune", "plan", "-o", "json"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	plan := parseTune(t, out)
	if plan.Changes != len(want) {
		t.Fatalf("plan: %d changes, want %d: %s", plan.Changes, len(want), out)
	}
	for _, s := range plan.Settings {
		k := strings.TrimPrefix(s.ID, "sysctl:")
		if s.Current != orig[k] || s.Desired != want[k] {
			t.Errorf("plan %s: current %q desired %q, want %q and %q", s.ID, s.Current, s.Desired, orig[k], want[k])
		}
	}
	if _, err := nodectl(t, append([]string{"tune", "apply"}, args...)...); err != nil {
		t.Fatal(err)
	}
	for k, v := range want {
		if got := readSysctl(t, k); got != v {
			t.Errorf("after apply %s = %s, want %s", k, got, v)
		}
	}
	if out, err := nodectl(t, append([]string{"tune", "verify"}, flags...)...); err != nil {
		t.Fatalf("verify after apply: %v\n%s", err, out)
	}

	// Someone changes one behind the tuner's back.
	drifted := "vm.watermark_scale_factor"
	if err := os.WriteFile(sysctlPath(drifted), []byte(orig[drifted]), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = nodectl(t, append([]string{"tune", "verify", "-o", "json"}, flags...)...)
	if exitCode(err) != 3 {
		t.Fatalf("verify with drift: exit %d (%v), want 3", exitCode(err), err)
	}
	ver := parseTune(t, out)
	if ver.Changes != 1 {
		t.Fatalf("verify: %d drifted, want 1: %s", ver.Changes, out)
	}
	for _, s := range ver.Settings {
		if s.Change != (s.ID == "sysctl:"+drifted) {
			t.Errorf("verify %s: change %v", s.ID, s.Change)
		}
		if s.Change && s.Current != orig[drifted] {
			t.Errorf("verify %s: current %q, want %q", s.ID, s.Current, orig[drifted])
		}
	}

	if _, err := nodectl(t, append([]string{"tune", "rollback"}, flags...)...); err != nil {
		t.Fatal(err)
	}
	for _, k := range tuneSysctls {
		if got := readSysctl(t, k); got != orig[k] {
			t.Errorf("after rollback %s = %s, want %s", k, got, orig[k])
		}
	}
	assertNoTuneState(t, root)
}

func assertNoTuneState(t *testing.T, root string) {
	t.Helper()
	dir := filepath.Join(root, "var/lib/nodectl/tune")
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		t.Errorf("left in %s: %s", dir, e.Name())
	}
}

// The built-in profile on a scratch host root: drop-ins byte for byte as documented, the
// journal's storage bind-mounted, a second apply changes nothing, rollback leaves the scratch
// tree as it was.
func TestTuneBuiltinDropInsOnScratchRoot(t *testing.T) {
	requireRoot(t)
	keepSysctls(t)
	root, flags := tuneScratch(t)
	t.Cleanup(func() {
		// Whatever happened, no mount stays below the scratch root.
		_, _ = nodectl(t, append([]string{"tune", "rollback"}, flags...)...)
	})
	if _, err := nodectl(t, append([]string{"tune", "apply", "--profile", "sandbox-density"}, flags...)...); err != nil {
		t.Fatal(err)
	}
	journald := "# Written by nodectl tune. `nodectl tune rollback` removes it.\n[Journal]\nSystemMaxUse=500M\nRateLimitIntervalSec=30s\nRateLimitBurst=1000\n"
	kubelet := "# Written by nodectl tune. `nodectl tune rollback` removes it.\napiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nreservedSystemCPUs: \"0\"\n"
	files := map[string]string{
		"etc/systemd/journald.conf.d/90-nodectl.conf":   journald,
		"etc/kubernetes/kubelet.conf.d/90-nodectl.conf": kubelet,
	}
	stat := map[string]os.FileInfo{}
	for p, want := range files {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != want {
			t.Errorf("%s:\n%s\nwant\n%s", p, b, want)
		}
		stat[p], _ = os.Stat(filepath.Join(root, p))
	}
	if !isMountPoint(t, filepath.Join(root, "var/log/journal")) {
		t.Error("the journal's storage is not bind-mounted")
	}
	state := filepath.Join(root, "var/lib/nodectl/tune/state.json")
	before, err := os.ReadFile(state)
	if err != nil {
		t.Fatal(err)
	}

	out, err := nodectl(t, append([]string{"tune", "apply", "--profile", "sandbox-density"}, flags...)...)
	if err != nil || !strings.Contains(out, "nothing changed") {
		t.Fatalf("second apply: %v\n%s", err, out)
	}
	for p := range files {
		fi, _ := os.Stat(filepath.Join(root, p))
		if !fi.ModTime().Equal(stat[p].ModTime()) {
			t.Errorf("second apply rewrote %s", p)
		}
	}
	if after, _ := os.ReadFile(state); string(after) != string(before) {
		t.Error("second apply rewrote the state file")
	}
	out, err = nodectl(t, append([]string{"tune", "status"}, flags...)...)
	if err != nil || !strings.Contains(out, "sandbox-density") || !strings.Contains(out, "pending kubelet restart") {
		t.Errorf("status: %v\n%s", err, out)
	}

	if _, err := nodectl(t, append([]string{"tune", "rollback"}, flags...)...); err != nil {
		t.Fatal(err)
	}
	if isMountPoint(t, filepath.Join(root, "var/log/journal")) {
		t.Error("the journal's storage is still mounted after rollback")
	}
	// Everything apply made, the state file's directories included, is gone.
	if ents, _ := os.ReadDir(root); len(ents) != 0 {
		t.Errorf("rollback left %v below the scratch root", ents)
	}
}

func isMountPoint(t *testing.T, dir string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
			return true
		}
	}
	return false
}

// Bad profiles are refused with a message naming the problem, before anything changes.
func TestTuneBadProfilesAreRefused(t *testing.T) {
	requireRoot(t)
	orig := keepSysctls(t)
	root, flags := tuneScratch(t)
	profiles := map[string]struct{ text, want string }{
		"unknown_key":          {"name: bad\nsysctls:\n  vm.swappiness: 10\n", "sysctls"},
		"gc_thresh1_above_3":   {"name: bad\nsysctl:\n  net.ipv4.neigh.default.gc_thresh1: 9000\n  net.ipv4.neigh.default.gc_thresh2: 100\n  net.ipv4.neigh.default.gc_thresh3: 8192\n", "gc_thresh"},
		"swappiness_300":       {"name: bad\nextends: sandbox-density\nsysctl:\n  vm.swappiness: 300\n", "vm.swappiness"},
		"cpus_beyond_the_node": {"name: bad\nextends: sandbox-density\nreservedSystemCPUs:\n  cpus: 0-63\n", "0-63"},
		"unknown_sysctl":       {"name: bad\nsysctl:\n  vm.no_such_knob: 1\n", "vm.no_such_knob"},
	}
	for name, tc := range profiles {
		t.Run(name, func(t *testing.T) {
			p := writeProfile(t, t.TempDir(), tc.text)
			for _, cmd := range []string{"plan", "apply"} {
				_, stderr, err := nodectlAs(t, os.Args[0], nil, append([]string{"tune", cmd, "--profile", p}, flags...)...)
				if err == nil {
					t.Fatalf("tune %s of a bad profile succeeded", cmd)
				}
				if !strings.Contains(stderr, tc.want) {
					t.Errorf("tune %s: %q does not name %q", cmd, stderr, tc.want)
				}
			}
		})
	}
	for k, v := range orig {
		if got := readSysctl(t, k); got != v {
			t.Errorf("a refused profile changed %s: %s, was %s", k, got, v)
		}
	}
	if ents, _ := os.ReadDir(root); len(ents) != 0 {
		t.Errorf("a refused profile wrote below the host root: %v", ents)
	}
}

func TestTuneWithoutRootIsRefused(t *testing.T) {
	requireRoot(t) // to drop to another user
	exe := exeForNobody(t)
	for _, cmd := range []string{"apply", "rollback"} {
		_, stderr, err := nodectlAs(t, exe, nobody, "tune", cmd)
		if err == nil {
			t.Fatalf("tune %s as nobody succeeded", cmd)
		}
		if !strings.Contains(stderr, "needs root") {
			t.Errorf("tune %s as nobody: %q does not say it needs root", cmd, stderr)
		}
	}
}

func TestTuneCLIErrorsNameTheProblem(t *testing.T) {
	expectCLIErrors(t, []string{"tune"}, map[string]cliError{
		"unknown_profile":     {[]string{"plan", "--profile", "no-such-profile"}, "no-such-profile"},
		"relative_host_root":  {[]string{"plan", "--host-root", "host"}, `--host-root "host"`},
		"bad_output":          {[]string{"plan", "-o", "xml"}, `-o "xml": allowed values are text and json, or yaml`},
		"verify_no_yaml":      {[]string{"verify", "-o", "yaml"}, `-o "yaml"`},
		"validate_no_stress":  {[]string{"validate"}, "give the stress command after --"},
		"validate_not_stress": {[]string{"validate", "--", "analyze", "x"}, "after -- give a stress scenario"},
		"validate_sets_out":   {[]string{"validate", "--", "stress", "noisy", "--out", "/tmp/x"}, "stress flag --out"},
		"watch_bad_interval":  {[]string{"watch", "--interval", "0s"}, "--interval 0s"},
	})
}

// DaemonSet mode: watch applies the mounted profile at start-up, re-verifies it on an
// interval and exports drift as metrics; it stops on SIGTERM leaving the profile applied.
func TestTuneWatchExportsDrift(t *testing.T) {
	requireRoot(t)
	orig := keepSysctls(t)
	root, flags := tuneScratch(t)
	key := "net.ipv4.neigh.default.gc_thresh1"
	n, _ := strconv.Atoi(orig[key])
	want := strconv.Itoa(n + 11)
	prof := writeProfile(t, root, "name: e2e-watch\nsysctl:\n  "+key+": "+want+"\n")
	cmd := exec.Command(os.Args[0], append([]string{"tune", "watch", "--profile", prof, "--apply", "--interval", "100ms",
		"--listen", "127.0.0.1:0"}, flags...)...)
	cmd.Env = append(os.Environ(), beMain+"=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_, _ = nodectl(t, append([]string{"tune", "rollback"}, flags...)...)
	})
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			t.Log(line)
			if u, ok := strings.CutPrefix(line, "tune watch: metrics on "); ok {
				addr <- u
			}
		}
	}()
	var url string
	select {
	case url = <-addr:
	case <-time.After(30 * time.Second):
		t.Fatal("tune watch did not say where its metrics are")
	}
	// metric polls the exposition until name reads want.
	metric := func(name, want string) {
		t.Helper()
		var last string
		for range 300 {
			resp, err := http.Get(url)
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				for _, line := range strings.Split(string(b), "\n") {
					if v, ok := strings.CutPrefix(line, name+" "); ok {
						last = v
					}
				}
				if last == want {
					return
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatalf("%s reads %q, want %q", name, last, want)
	}
	metric(`nodectl_tune_apply_total{result="ok"}`, "1")
	metric("nodectl_tune_drifted_settings", "0")
	if got := readSysctl(t, key); got != want {
		t.Fatalf("watch --apply left %s = %s, want %s", key, got, want)
	}
	if err := os.WriteFile(sysctlPath(key), []byte(orig[key]), 0o644); err != nil {
		t.Fatal(err)
	}
	metric("nodectl_tune_drifted_settings", "1")
	metric(`nodectl_tune_setting_drifted{backend="sysctl",setting="sysctl:`+key+`"}`, "1")

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("tune watch on SIGTERM: %v", err)
	}
	if _, err := nodectl(t, append([]string{"tune", "rollback"}, flags...)...); err != nil {
		t.Fatal(err)
	}
	if got := readSysctl(t, key); got != orig[key] {
		t.Errorf("after rollback %s = %s, want %s", key, got, orig[key])
	}
}

// A GKE node system config is checked against the node: its sysctls and its swapConfig.
func TestTuneVerifiesAGKENodeSystemConfig(t *testing.T) {
	requireRoot(t)
	keepSysctls(t)
	_, flags := tuneScratch(t)
	// The seed report's node pool config, as shipped in deploy/.
	gke, err := filepath.Abs("../../deploy/gke/swap-dedicated-lssd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// The node as that pool's config makes it, but with no swap on.
	for k, v := range map[string]string{"vm.watermark_scale_factor": "500", "vm.swappiness": "100"} {
		if err := os.WriteFile(sysctlPath(k), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if sw, _ := os.ReadFile("/proc/swaps"); strings.Count(string(sw), "\n") > 1 {
		t.Skip("swap is on here: the test needs a node without swap")
	}
	out, err := nodectl(t, append([]string{"tune", "verify", "--profile", gke, "-o", "json"}, flags...)...)
	if exitCode(err) != 3 {
		t.Fatalf("verify of a GKE config on a node without swap: exit %d (%v), want 3", exitCode(err), err)
	}
	r := parseTune(t, out)
	for _, s := range r.Settings {
		wantDrift := strings.HasPrefix(s.ID, "swap:")
		if s.Change != wantDrift {
			t.Errorf("%s: drift %v (current %q, desired %q), want %v", s.ID, s.Change, s.Current, s.Desired, wantDrift)
		}
	}
	if r.Changes != 1 || len(r.Settings) != 3 {
		t.Errorf("verify: %d drifted of %d settings, want swap alone of 3: %s", r.Changes, len(r.Settings), out)
	}
	text, _ := nodectl(t, append([]string{"tune", "verify", "--profile", gke}, flags...)...)
	if !strings.Contains(text, "not checked") || !strings.Contains(text, "dedicatedLocalSsdProfile") {
		t.Errorf("verify does not say which GKE keys it did not check:\n%s", text)
	}
}

// Its terminal gone during validate's tuned run (SIGHUP: an SSH session dropped; Ctrl-C takes
// the same path) stops the run, which cleans up, and rolls the profile back.
func TestTuneValidateInterruptedRollsBack(t *testing.T) {
	requireRoot(t)
	orig := keepSysctls(t)
	root, flags := tuneScratch(t)
	key := "net.ipv4.neigh.default.gc_thresh1"
	n, _ := strconv.Atoi(orig[key])
	prof := writeProfile(t, root, "name: e2e-validate\nsysctl:\n  "+key+": "+strconv.Itoa(n+13)+"\n")
	runs := filepath.Join(t.TempDir(), "runs")
	cmd := exec.Command(os.Args[0], append(append([]string{"tune", "validate", "--profile", prof, "--out", runs}, flags...),
		"--", "stress", "noisy", "--baseline", "1s", "--duration", "6s")...)
	cmd.Env = append(os.Environ(), beMain+"=1")
	var errb strings.Builder
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	state := filepath.Join(root, "var/lib/nodectl/tune/state.json")
	meta := filepath.Join(runs, "after", "meta.json")
	deadline := time.Now().Add(90 * time.Second)
	for {
		if _, err := os.Stat(meta); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the tuned run did not start:\n%s", errb.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(time.Second) // into the tuned run's baseline
	if _, err := os.Stat(state); err != nil {
		t.Fatalf("no state file during the tuned run: %v", err)
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	t.Log(errb.String())
	if exitCode(err) != 130 {
		t.Errorf("interrupted validate: exit %d (%v), want 130", exitCode(err), err)
	}
	if !strings.Contains(errb.String(), "rolling back") {
		t.Error("validate did not say it rolled back")
	}
	if got := readSysctl(t, key); got != orig[key] {
		t.Errorf("after an interrupted validate %s = %s, want %s", key, got, orig[key])
	}
	if _, err := os.Stat(state); !errors.Is(err, os.ErrNotExist) {
		t.Error("an interrupted validate left the state file")
	}
	var m struct {
		ID string `json:"id"`
	}
	if b, err := os.ReadFile(meta); err == nil && json.Unmarshal(b, &m) == nil && m.ID != "" {
		assertClean(t, m.ID)
	} else {
		t.Errorf("reading the tuned run's id from %s: %v", meta, err)
	}
}

// The DaemonSet's containers (the agent in deploy/base, the tuner in the GKE overlay) run
// commands with flags this binary has, and the profile the tuner verifies, the GKE pool's
// node system config, resolves on this node.
func TestDeployArgsAreFlags(t *testing.T) {
	for _, file := range []string{"../../deploy/base/daemonset.yaml", "../../deploy/gke/daemonset-patch.yaml"} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Spec struct {
				Template struct {
					Spec struct {
						Containers []struct {
							Name string   `yaml:"name"`
							Args []string `yaml:"args"`
						} `yaml:"containers"`
					} `yaml:"spec"`
				} `yaml:"template"`
			} `yaml:"spec"`
		}
		if err := yaml.Unmarshal(b, &doc); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if len(doc.Spec.Template.Spec.Containers) == 0 {
			t.Fatalf("%s: no containers", file)
		}
		for _, c := range doc.Spec.Template.Spec.Containers {
			// The command is the arguments before the first flag.
			n := 0
			for n < len(c.Args) && !strings.HasPrefix(c.Args[n], "-") {
				n++
			}
			if n == 0 {
				t.Fatalf("%s: container %s runs no command: %q", file, c.Name, c.Args)
			}
			help, err := nodectl(t, append(c.Args[:n:n], "--help")...)
			if err != nil {
				t.Fatalf("%s: container %s: nodectl %s: %v", file, c.Name, strings.Join(c.Args[:n], " "), err)
			}
			for _, a := range c.Args[n:] {
				flag, _, _ := strings.Cut(a, "=")
				if !strings.Contains(help, flag+" ") {
					t.Errorf("%s: container %s passes %s, which nodectl %s does not have", file, c.Name, flag, strings.Join(c.Args[:n], " "))
				}
			}
		}
	}
	if out, err := nodectl(t, "tune", "plan", "--profile", "../../deploy/gke/swap-dedicated-lssd.yaml", "-o", "json"); err != nil {
		t.Fatalf("the GKE overlay's profile: %v\n%s", err, out)
	}
}
