package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodectl/nodectl/agent"
	"github.com/nodectl/nodectl/agent/recorded"
	"github.com/nodectl/nodectl/analyzer"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/testcluster"
)

// checkStressPods runs `stress noisy` as pods on the node through the API server, as a person
// with a kubeconfig would, and holds it to its findings, its exit code under --fail-on, and to
// leaving nothing behind: after a whole run, and after the CLI is killed and `stress clean
// --node` runs.
func checkStressPods(ctx context.Context, t *testing.T, c *testcluster.Cluster, bin string) {
	node := testcluster.NodeName
	cmdOf := func(args ...string) *exec.Cmd {
		return exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", c.KubeconfigPath, "--node", node}, args...)...)
	}
	podCgroupsBefore := podCgroups(t)

	t.Run("noisy_names_the_hog_pods", func(t *testing.T) {
		junit := filepath.Join(t.TempDir(), "findings.xml")
		cmd := cmdOf("stress", "noisy", "--hog", "cpu,count=2", "--baseline", "20s", "--duration", "20s",
			"--out", filepath.Join(t.TempDir(), "run"), "-o", "json", "--fail-on", "warning", "--junit", junit)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		t.Logf("stress noisy --node:\n%s", stderr.String())
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		var rep analyzer.Report
		if jerr := json.Unmarshal(stdout.Bytes(), &rep); jerr != nil {
			t.Fatalf("stress noisy --node -o json (exit %d): %v\n%s", code, jerr, stdout.String())
		}
		ns := runNamespace(t, stderr.String())
		victim := ns + "/victim/victim"
		var f *analyzer.Finding
		for i := range rep.Findings {
			if rep.Findings[i].ID == analyzer.IDCPUContention && rep.Findings[i].Victim == victim {
				f = &rep.Findings[i]
			}
		}
		if f == nil {
			t.Fatalf("no cpu-contention of %s: %s", victim, summarize(rep))
		}
		t.Logf("%s %s: %s", f.ID, f.Severity, f.Summary)
		for _, hog := range []string{ns + "/cpu-hog-0/cpu-hog-0", ns + "/cpu-hog-1/cpu-hog-1"} {
			if !slices.Contains(f.Culprits, hog) {
				t.Errorf("cpu-contention of %s names %v, not %s", victim, f.Culprits, hog)
			}
		}
		want := 0
		if analyzer.SeverityRank(rep.Worst()) >= analyzer.SeverityRank(analyzer.SeverityWarning) {
			want = 3
		}
		if code != want {
			t.Errorf("exit %d with --fail-on warning and findings no worse than %q, want %d", code, rep.Worst(), want)
		}
		if b, err := os.ReadFile(junit); err != nil || !bytes.Contains(b, []byte(analyzer.IDCPUContention+": "+victim)) {
			t.Errorf("the JUnit file does not have the finding (%v):\n%s", err, b)
		}
		waitGone(ctx, t, c, ns, podCgroupsBefore)
	})

	// A victim pod next to a disk hog pod writing and fsyncing on the node's one disk: the run of
	// pods names the hog in the victim's disk-contention from its probe; the agent's window over
	// the same span names it from the kernel alone (the victim's traced fsyncs, no probe); and
	// the agent opened an I/O incident by itself.
	t.Run("disk_hog_named_by_the_run_and_the_agent", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "run")
		cmd := cmdOf("stress", "noisy", "--hog", "disk", "--baseline", "20s", "--duration", "20s", "--out", dir, "-o", "json")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		t.Logf("stress noisy --hog disk --node:\n%s", stderr.String())
		if err != nil {
			t.Fatalf("stress noisy --node: %v\n%s", err, stdout.String())
		}
		var rep analyzer.Report
		if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
			t.Fatalf("stress noisy --node -o json: %v\n%s", err, stdout.String())
		}
		ns := runNamespace(t, stderr.String())
		victim, hog := ns+"/victim/victim", ns+"/disk-hog-0/disk-hog-0"
		run, err := rundir.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		// The analysis over the agent's window comes after the run's pods were deleted: the
		// flight recorder's pod_info samples still name them.
		cgroups := map[string]string{}
		for _, w := range run.Meta.Workloads {
			cgroups[w.Name] = w.Cgroup
		}
		named := func(what string, rep analyzer.Report) {
			t.Helper()
			for _, f := range rep.Findings {
				if f.ID == analyzer.IDDiskContention && f.Victim == victim {
					t.Logf("%s: %s %s: %s", what, f.ID, f.Severity, f.Summary)
					if !slices.Contains(f.Culprits, hog) {
						t.Errorf("%s: disk-contention of %s names %v, not %s (%s)", what, victim, f.Culprits, hog, cgroups[hog])
					}
					return
				}
			}
			t.Errorf("%s: no disk-contention of %s (%s): %s", what, victim, cgroups[victim], summarize(rep))
		}
		named("the run of pods", rep)

		base, okB := run.Phase(rundir.PhaseBaseline)
		stress, okS := run.Phase(rundir.PhaseStress)
		if !okB || !okS {
			t.Fatalf("the run has no baseline or stress phase: %v", run.Phases())
		}
		out, err := cmdOf("analyze", "--from", stress.Start.Format(time.RFC3339Nano), "--to", stress.End.Format(time.RFC3339Nano),
			"--baseline", base.End.Sub(base.Start).String(), "-o", "json").Output()
		if err != nil {
			t.Fatalf("analyze --node over the stress phase: %v", err)
		}
		var window analyzer.Report
		if err := json.Unmarshal(out, &window); err != nil {
			t.Fatalf("analyze --node -o json: %v\n%s", err, out)
		}
		named("the agent's window", window)

		deadline := time.Now().Add(2 * time.Minute)
		for {
			out, err := cmdOf("agent", "incidents", "--limit", "0", "-o", "json").Output()
			if err != nil {
				t.Fatalf("agent incidents --node: %v", err)
			}
			var list []recorded.Incident
			if err := json.Unmarshal(out, &list); err != nil {
				t.Fatalf("agent incidents --node -o json: %v\n%s", err, out)
			}
			i := slices.IndexFunc(list, func(in recorded.Incident) bool {
				return (in.Trigger == agent.TriggerBlkRequestWait || in.Trigger == agent.TriggerFsyncStall) &&
					!in.Opened.Before(stress.Start) && !in.Opened.After(stress.End.Add(5*time.Second)) && in.State == recorded.StateClosed
			})
			if i >= 0 {
				// Its window starts before the victim existed here (the test agent's 40 s before
				// and 30 s of baseline): its findings are logged, the window's were asserted.
				in := list[i]
				t.Logf("incident %s (%s): %s %s", in.ID, in.Where(), in.Evidence, in.AnalysisError)
				if in.Report != nil {
					t.Logf("its analysis: %s", summarize(*in.Report))
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no I/O incident opened in the stress phase (%v to %v) and analyzed: %s", stress.Start, stress.End, out)
			}
			time.Sleep(2 * time.Second)
		}
		waitGone(ctx, t, c, ns, podCgroupsBefore)
	})

	// density runs a sweep of sandbox pods of 16 MiB and returns its -o json, its stdout and its
	// progress (stderr).
	type densityJSON struct {
		analyzer.DensityReport
		Findings []analyzer.Finding `json:"findings"`
	}
	density := func(t *testing.T, args ...string) (densityJSON, string, string) {
		t.Helper()
		cmd := cmdOf(append([]string{"stress", "density", "--sandbox-memory", "16Mi", "--request", "16Mi", "--limit", "128Mi", "--pace", "100ms",
			"--out", filepath.Join(t.TempDir(), "run"), "-o", "json"}, args...)...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		t.Logf("stress density --node %s:\n%s", strings.Join(args, " "), stderr.String())
		if err != nil {
			t.Fatalf("stress density --node: %v\n%s", err, stdout.String())
		}
		var rep densityJSON
		if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
			t.Fatalf("stress density --node -o json: %v\n%s", err, stdout.String())
		}
		return rep, stdout.String(), stderr.String()
	}

	// The test kubelet admits testcluster.MaxPods pods: sandbox pods added in steps meet that
	// ceiling (OutOfpods) well within this machine's memory, and the sweep must stop there and
	// name it.
	t.Run("density_stops_at_the_collapse", func(t *testing.T) {
		rep, stdout, stderr := density(t, "--step", "4", "--max", "40", "--step-duration", "6s")
		col, ceil := rep.Collapse, rep.Ceiling
		if col == nil || ceil == nil {
			t.Fatalf("no collapse up to --max 40 on a kubelet of maxPods %d:\n%s", testcluster.MaxPods, stdout)
		}
		t.Logf("collapse at %d (%s), max stable %d, ceiling %s: %s", col.Density, col.Signal, rep.MaxStable, ceil.Resource, ceil.Explanation)
		if col.Signal != rundir.SignalAdmission || ceil.Resource != analyzer.CeilingAdmission || !strings.Contains(ceil.Explanation, "OutOfpods") {
			t.Errorf("collapse %+v, ceiling %+v: want the kubelet's admission (OutOfpods)", col, ceil)
		}
		// The agent's pod is on the node too: the sandboxes fit below maxPods.
		if col.Density > testcluster.MaxPods+4 || rep.MaxStable >= col.Density || rep.MaxStable > testcluster.MaxPods {
			t.Errorf("collapse at %d, max stable %d: want the step that crossed maxPods %d", col.Density, rep.MaxStable, testcluster.MaxPods)
		}
		for _, s := range rep.Steps {
			if s.Density <= rep.MaxStable && (s.Ready != s.Started || s.Refused > 0 || s.WorkingSet <= 0 || s.MemoryLimit <= 0) {
				t.Errorf("stable step %+v: want every pod ready, none refused, the node's memory read", s)
			}
		}
		if !slices.ContainsFunc(rep.Findings, func(f analyzer.Finding) bool { return f.ID == analyzer.IDMemoryCollapse }) {
			t.Errorf("no %s finding: %+v", analyzer.IDMemoryCollapse, rep.Findings)
		}
		waitGone(ctx, t, c, runNamespace(t, stderr), podCgroupsBefore)
	})

	// Sandbox pods with a CPU request each fill the node's allocatable CPU (sized here so that
	// five of them book what the node's other pods leave) while its CPUs idle: the kubelet
	// refuses the next (OutOfcpu), and the bookings the agent read say CPU requests, not use,
	// were the ceiling (cpu-booking-ceiling, as the seed's 151 pods at 50m on an idle node).
	t.Run("density_booked_by_cpu_requests", func(t *testing.T) {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pods, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			t.Fatal(err)
		}
		free := n.Status.Allocatable.Cpu().MilliValue()
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
				continue // the kubelet no longer counts what it requested
			}
			for _, ctr := range p.Spec.Containers {
				free -= ctr.Resources.Requests.Cpu().MilliValue()
			}
		}
		request := free / 5
		t.Logf("%dm of the node's CPU free: %dm a sandbox", free, request)
		rep, _, stderr := density(t, "--cpu-request", strconv.FormatInt(request, 10)+"m", "--step", "2", "--max", "10", "--step-duration", "4s")
		if col, ceil := rep.Collapse, rep.Ceiling; col == nil || ceil == nil || col.Signal != rundir.SignalAdmission ||
			ceil.Resource != analyzer.CeilingAdmission || !strings.Contains(ceil.Explanation, "OutOfcpu") || rep.MaxStable != 4 {
			t.Errorf("collapse %+v, ceiling %+v, max stable %d: want the kubelet's admission (OutOfcpu) past 5 sandboxes", col, ceil, rep.MaxStable)
		}
		i := slices.IndexFunc(rep.Findings, func(f analyzer.Finding) bool { return f.ID == analyzer.IDCPUBookingCeiling })
		if i < 0 {
			t.Fatalf("no %s finding: %+v", analyzer.IDCPUBookingCeiling, rep.Findings)
		}
		// Its severity is the host's CPU use in the last step (this machine's control plane
		// included), which the test does not hold: the bound it names is.
		if f := rep.Findings[i]; !strings.Contains(f.Summary, "booked full by CPU requests") {
			t.Errorf("%s %s: %s; want the node booked full by CPU requests", f.ID, f.Severity, f.Summary)
		}
		waitGone(ctx, t, c, runNamespace(t, stderr), podCgroupsBefore)
	})

	// A pod at 50m boots under its CFS quota: it wakes slower than at 1 CPU, throttled most of
	// the time, and the report says so from the pod's cgroup.
	// Sandboxes in an image of the user's choice: an image that holds no nodectl, only a
	// "browser" (a copy of nodectl under that name, as a browser's image holds its browser),
	// which each sandbox maps; nodectl comes from the agent's image through the init container.
	// A pod without it could not start, so two ready sandboxes say the copy ran.
	t.Run("density_in_the_users_image", func(t *testing.T) {
		dir := t.TempDir()
		b, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		browser, tar, image := filepath.Join(dir, "browser"), filepath.Join(dir, "browser.tar"), "nodectl-test-browser:1"
		if err := os.WriteFile(browser, b, 0o755); err != nil {
			t.Fatal(err)
		}
		// The go that builds this test, whether or not it is on PATH (make passes its own).
		goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
		if out, err := exec.CommandContext(ctx, goTool, "run", "../../build/mkimage", "-binary", browser, "-tag", image, "-version", "1", "-out", tar).CombinedOutput(); err != nil {
			t.Fatalf("building the browser image: %v\n%s", err, out)
		}
		if err := c.Node.ImportImage(ctx, tar); err != nil {
			t.Fatal(err)
		}
		rep, _, _ := density(t, "--step", "2", "--max", "2", "--step-duration", "4s", "--image", image, "--image-binary", "/usr/local/bin/browser")
		if len(rep.Steps) != 1 || rep.Steps[0].Ready != 2 {
			t.Fatalf("steps %+v, want one step of two ready sandboxes", rep.Steps)
		}
	})

	t.Run("wake_throttled_at_a_small_limit", func(t *testing.T) {
		cmd := cmdOf("stress", "wake", "--cpu-limits", "50m,1", "--count", "2", "--out", filepath.Join(t.TempDir(), "run"), "-o", "json")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		t.Logf("stress wake --node:\n%s", stderr.String())
		if err != nil {
			t.Fatalf("stress wake --node: %v\n%s", err, stdout.String())
		}
		var rep analyzer.WakeReport
		if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
			t.Fatalf("stress wake --node -o json: %v\n%s", err, stdout.String())
		}
		if len(rep.Limits) != 2 {
			t.Fatalf("limits %+v, want 50m and 1", rep.Limits)
		}
		small, big := rep.Limits[0], rep.Limits[1]
		t.Logf("50m: %+v\n1: %+v", small, big)
		if small.Starts != 2 || big.Starts != 2 || small.WakeP50 <= big.WakeP50 || small.BootP50 <= big.BootP50 {
			t.Errorf("50m %+v, 1 %+v: want both limits' starts, 50m slower", small, big)
		}
		if small.ThrottledShare < 0.25 || small.CPUUsageP50 <= 0 {
			t.Errorf("50m %+v: want its boot throttled most of its wake, its CPU read from the pod's cgroup", small)
		}
		if !slices.ContainsFunc(rep.Findings, func(f analyzer.Finding) bool { return f.ID == analyzer.IDCPUThrottling }) {
			t.Errorf("no %s finding: %+v", analyzer.IDCPUThrottling, rep.Findings)
		}
		waitGone(ctx, t, c, runNamespace(t, stderr.String()), podCgroupsBefore)
	})

	// Writer pods released together through their attached standard input: every writer's
	// time to durable in every storm, the storms as phases, on the disk under their emptyDirs.
	t.Run("fsync_storm_of_writer_pods", func(t *testing.T) {
		cmd := cmdOf("stress", "fsync-storm", "--writers", "3", "--size", "16Mi", "--rounds", "2", "--pause", "1s",
			"--out", filepath.Join(t.TempDir(), "run"), "-o", "json")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		t.Logf("stress fsync-storm --node:\n%s", stderr.String())
		if err != nil {
			t.Fatalf("stress fsync-storm --node: %v\n%s", err, stdout.String())
		}
		var rep analyzer.StormReport
		if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
			t.Fatalf("stress fsync-storm --node -o json: %v\n%s", err, stdout.String())
		}
		if len(rep.Writers) != 3 || len(rep.Rounds) != 2 {
			t.Fatalf("writers %d, rounds %d: want 3 and 2\n%s", len(rep.Writers), len(rep.Rounds), stdout.String())
		}
		for _, w := range rep.Writers {
			if len(w.DurableSeconds) != 2 || w.DurableP50 <= 0 || w.Cgroup == "" {
				t.Errorf("writer %+v: want a time to durable in each storm, and its pod's cgroup", w)
			}
		}
		for _, r := range rep.Rounds {
			t.Logf("%s: %d writers, durable p50 %.3fs max %.3fs, start skew %.3fs, device %s, %.0f bytes", r.Name, r.Writers, r.DurableP50, r.DurableMax, r.StartSkew, r.Device, r.DeviceBytes)
			if r.Writers != 3 || r.Device == "" || r.DeviceBytes < 3*16<<20 {
				t.Errorf("round %+v: want all 3 writers, on the device they wrote their 48 MiB to", r)
			}
		}
		waitGone(ctx, t, c, runNamespace(t, stderr.String()), podCgroupsBefore)
	})

	// A long noisy run, once its victim runs: its CLI, progress and namespace.
	startLong := func(t *testing.T) (*exec.Cmd, *lockedBuffer, string) {
		cmd := cmdOf("stress", "noisy", "--hog", "cpu", "--baseline", "10m", "--duration", "10m")
		stderr := &lockedBuffer{}
		cmd.Stderr = stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd, stderr, waitProgress(t, cmd, stderr, "running: victim")
	}

	t.Run("a_stress_user_reaches_only_its_runs", func(t *testing.T) { checkStressRights(ctx, t, c, bin, podCgroupsBefore) })

	t.Run("interrupted_cli_cleans_up", func(t *testing.T) {
		cmd, stderr, ns := startLong(t)
		if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		err := cmd.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 130 {
			t.Errorf("stress noisy --node interrupted: %v, want exit 130\n%s", err, stderr.String())
		}
		// Gone without stress clean: the CLI deleted its pods before it exited.
		if pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); err != nil || len(pods.Items) > 0 {
			t.Errorf("after the interrupted run: %v, %d pods left in %s\n%s", err, len(pods.Items), ns, stderr.String())
		}
		waitGone(ctx, t, c, ns, podCgroupsBefore)
	})

	t.Run("killed_cli_then_clean", func(t *testing.T) {
		// Once the victim runs, the CLI dies without a chance to clean.
		cmd, _, ns := startLong(t)
		if err := syscall.Kill(cmd.Process.Pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		cmd.Wait()
		if _, err := c.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err != nil {
			t.Fatalf("namespace %s after the kill: %v, want it left behind for clean", ns, err)
		}
		out, err := cmdOf("stress", "clean").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "removed namespace "+ns) {
			t.Errorf("stress clean --node: %v\n%s", err, out)
		}
		waitGone(ctx, t, c, ns, podCgroupsBefore)
		if out, err := cmdOf("stress", "clean").CombinedOutput(); err != nil || !strings.Contains(string(out), "nothing to clean") {
			t.Errorf("a second stress clean --node: %v\n%s", err, out)
		}
	})

	// A namespace anyone allowed to make one could make: labelled as a run's on this node but
	// not named as one, holding a pod marked as a kept tuner, of an image of its own. Clean
	// deletes neither and starts nothing there (before, it deleted the namespace after running
	// a privileged rollback pod of that image on the node).
	t.Run("clean_trusts_no_label", func(t *testing.T) {
		const forged = "nodectl-forged"
		// As deploy/base's admission policies let its maker, the admin, make it.
		labels := map[string]string{"nodectl.io/run": "forged", "nodectl.io/node": testcluster.NodeName, "app.kubernetes.io/part-of": "nodectl-stress",
			"pod-security.kubernetes.io/enforce": "restricted"}
		if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: forged, Labels: labels,
			Annotations: map[string]string{"nodectl.io/created-by": "admin"}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// Gone before the next test, which counts the namespaces labelled as runs'.
		t.Cleanup(func() {
			cctx := context.WithoutCancel(ctx)
			c.Client.CoreV1().Pods(forged).Delete(cctx, "tune-apply", metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
			c.Client.CoreV1().Namespaces().Delete(cctx, forged, metav1.DeleteOptions{})
			waitGone(cctx, t, c, forged, podCgroupsBefore)
		})
		if err := c.WaitServiceAccount(ctx, forged); err != nil {
			t.Fatal(err)
		}
		kept := map[string]string{"nodectl.io/run": "forged", "nodectl.io/tune-kept": "true"}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "tune-apply", Namespace: forged, Labels: kept}, Spec: corev1.PodSpec{
			NodeName: testcluster.NodeName, Containers: []corev1.Container{{Name: "tune", Image: "registry.invalid/forged:1",
				SecurityContext: &corev1.SecurityContext{RunAsNonRoot: new(true), AllowPrivilegeEscalation: new(false),
					Capabilities:   &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
					SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}}}}}
		if _, err := c.Client.CoreV1().Pods(forged).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		out, err := cmdOf("stress", "clean").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "namespace "+forged+" carries nodectl's labels but is not a run's") {
			t.Errorf("stress clean --node with a forged namespace: %v\n%s", err, out)
		}
		ns, err := c.Client.CoreV1().Namespaces().Get(ctx, forged, metav1.GetOptions{})
		if err != nil || ns.DeletionTimestamp != nil {
			t.Errorf("the forged namespace after clean: %v (deleting: %v), want it left alone", err, ns != nil && ns.DeletionTimestamp != nil)
		}
		pods, err := c.Client.CoreV1().Pods(forged).List(ctx, metav1.ListOptions{})
		if err != nil || len(pods.Items) != 1 {
			t.Errorf("pods in the forged namespace after clean: %d (%v), want its own alone", len(pods.Items), err)
		}
	})
}

// waitProgress waits until the running CLI's progress says want, and returns the run's
// namespace; it kills the CLI and fails the test after two minutes.
func waitProgress(t *testing.T, cmd *exec.Cmd, stderr *lockedBuffer, want string) string {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); !strings.Contains(stderr.String(), want); time.Sleep(500 * time.Millisecond) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("the CLI did not say %q:\n%s", want, stderr.String())
		}
	}
	return runNamespace(t, stderr.String())
}

// lockedBuffer is a buffer a running command writes while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// runNamespace is the run's namespace, as the CLI's progress names it.
func runNamespace(t *testing.T, progress string) string {
	t.Helper()
	m := regexp.MustCompile(`namespace (nodectl-\S+) on node`).FindStringSubmatch(progress)
	if m == nil {
		t.Fatalf("the progress names no namespace:\n%s", progress)
	}
	return m[1]
}

// waitGone waits until the run's namespace and pods are gone from the API server and the
// kubelet removed their cgroups (the pod cgroups left are those there before the run).
func waitGone(ctx context.Context, t *testing.T, c *testcluster.Cluster, ns string, before []string) {
	t.Helper()
	var last string
	for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		_, nsErr := c.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		var extra []string
		for _, cg := range podCgroups(t) {
			if !slices.Contains(before, cg) {
				extra = append(extra, cg)
			}
		}
		switch {
		case err != nil || len(pods.Items) > 0:
			last = "pods left"
		case !apierrors.IsNotFound(nsErr):
			last = "namespace left"
		case len(extra) > 0:
			last = "pod cgroups left: " + strings.Join(extra, ", ")
		default:
			return
		}
	}
	t.Errorf("after the run of namespace %s: %s", ns, last)
}

// podCgroups are the kubelet's pod cgroups on the node (cpu hierarchy).
func podCgroups(t *testing.T) []string {
	t.Helper()
	var out []string
	root := filepath.Join("/sys/fs/cgroup/cpu", testcluster.CgroupRoot)
	filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && strings.HasPrefix(d.Name(), "pod") {
			out = append(out, strings.TrimPrefix(path, root))
			return filepath.SkipDir
		}
		return nil
	})
	return out
}
