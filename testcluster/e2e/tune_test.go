package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodectl/nodectl/analyzer"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/testcluster"
)

// checkTuneOnNode validates a tuning profile on the node through the API server, as a person
// with a kubeconfig would: the profile applied and rolled back by the tuner pod on the node
// (seen here in the node's own /proc/sys, the net sysctl in the host's network namespace),
// both runs made of pods, nothing left; and, after the CLI is killed with the profile applied,
// `stress clean --node` rolls it back.
func checkTuneOnNode(ctx context.Context, t *testing.T, c *testcluster.Cluster, bin string) {
	cmdOf := func(args ...string) *exec.Cmd {
		return exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", c.KubeconfigPath, "--node", testcluster.NodeName}, args...)...)
	}
	// Two sysctls, each set to a value the node does not have.
	keys := []string{"vm.swappiness", "net.ipv4.neigh.default.gc_thresh1"}
	was := map[string]int{}
	want := map[string]int{}
	for _, k := range keys {
		was[k] = readSysctl(t, k)
		want[k] = was[k] + 7
	}
	if want["vm.swappiness"] > 200 {
		want["vm.swappiness"] = was["vm.swappiness"] - 7
	}
	prof := filepath.Join(t.TempDir(), "e2e-sysctls.yaml")
	body := "name: e2e-sysctls\nsysctl:\n"
	for _, k := range keys {
		body += fmt.Sprintf("  %s: %d\n", k, want[k])
	}
	if err := os.WriteFile(prof, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	// applied says whether the node holds the profile's values now.
	applied := func() bool {
		for _, k := range keys {
			if readSysctl(t, k) != want[k] {
				return false
			}
		}
		return true
	}
	restored := func(t *testing.T) {
		t.Helper()
		for _, k := range keys {
			if got := readSysctl(t, k); got != was[k] {
				t.Errorf("%s = %d after the rollback, want %d as before", k, got, was[k])
			}
		}
	}
	// Whatever happens to the test, the node's sysctls end as they were.
	t.Cleanup(func() {
		for _, k := range keys {
			_ = os.WriteFile(filepath.Join("/proc/sys", strings.ReplaceAll(k, ".", "/")), []byte(strconv.Itoa(was[k])), 0o644)
		}
	})
	stressArgs := []string{"--", "stress", "wake", "--cpu-limits", "1", "--count", "2"}
	before := podCgroups(t)

	t.Run("validate_through_a_tuner_pod", func(t *testing.T) {
		// Watch the node's sysctls while validate runs: the tuned run must see the profile.
		var seen atomic.Bool
		watch, stopWatch := context.WithCancel(ctx)
		go func() {
			for watch.Err() == nil {
				if applied() {
					seen.Store(true)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
		out := filepath.Join(t.TempDir(), "validate")
		cmd := cmdOf(append([]string{"tune", "validate", "--profile", prof, "--out", out, "-o", "json"}, stressArgs...)...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		stopWatch()
		t.Logf("tune validate --node:\n%s", stderr.String())
		if err != nil {
			t.Fatalf("tune validate --node: %v\n%s", err, stdout.String())
		}
		var diff analyzer.DiffReport
		if err := json.Unmarshal(stdout.Bytes(), &diff); err != nil {
			t.Fatalf("tune validate --node -o json: %v\n%s", err, stdout.String())
		}
		if !strings.Contains(stderr.String(), "changed 2 settings") {
			t.Errorf("validate's progress does not say the tuner changed the 2 settings")
		}
		if !seen.Load() {
			t.Errorf("the node never held the profile's values %v during validate", want)
		}
		restored(t)
		for _, run := range []string{"before", "after"} {
			r, err := rundir.Open(filepath.Join(out, run))
			if err != nil {
				t.Errorf("run %s: %v", run, err)
			} else if r.Meta.Scenario != rundir.ScenarioWake {
				t.Errorf("run %s is a %q run, want wake", run, r.Meta.Scenario)
			}
		}
		waitGone(ctx, t, c, runNamespace(t, stderr.String()), before)

		// The passed-through tune status agrees, from a tuner pod of its own.
		b, err := cmdOf("tune", "status", "-o", "json").Output()
		var st struct {
			Applied bool `json:"applied"`
		}
		if err != nil || json.Unmarshal(b, &st) != nil || st.Applied {
			t.Errorf("tune status --node after validate: %v, applied %v\n%s", err, st.Applied, b)
		}
	})

	t.Run("killed_validate_then_clean_rolls_back", func(t *testing.T) {
		cmd := cmdOf(append([]string{"tune", "validate", "--profile", prof, "--out", filepath.Join(t.TempDir(), "validate")}, stressArgs...)...)
		stderr := &lockedBuffer{}
		cmd.Stderr = stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		ns := waitProgress(t, cmd, stderr, "3/4 tuned run")
		if !applied() {
			t.Errorf("the node does not hold the profile during the tuned run")
		}
		// The CLI dies with the profile applied; its tuned run is interrupted with it.
		if err := syscall.Kill(cmd.Process.Pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		cmd.Wait()
		if _, err := c.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err != nil {
			t.Fatalf("namespace %s after the kill: %v, want it kept: the node holds its profile", ns, err)
		}
		out, err := cmdOf("stress", "clean").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "removed namespace "+ns) {
			t.Errorf("stress clean --node: %v\n%s", err, out)
		}
		restored(t)
		waitGone(ctx, t, c, ns, before)
		// The tuned run's own namespace went with its interrupted CLI, or with the clean.
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
			list, err := c.Client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/part-of=nodectl-stress"})
			if err == nil && len(list.Items) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("namespaces of runs left after the clean: %v %v", err, list.Items)
				break
			}
		}
	})
}

// readSysctl reads an integer sysctl of this machine, the test node.
func readSysctl(t *testing.T, key string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/")))
	if err != nil {
		t.Fatal(err)
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("%s: %v", key, err)
	}
	return v
}
