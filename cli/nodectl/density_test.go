package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodectl/nodectl/rundir"
)

// densityReport is what `stress density -o json` prints.
type densityReport struct {
	Steps []struct {
		Density      int     `json:"density"`
		Ready        int     `json:"ready"`
		Started      int     `json:"started"`
		ReadinessP99 float64 `json:"readiness_p99_seconds"`
		PSIFull      float64 `json:"psi_memory_full_share"`
		WorkingSet   float64 `json:"working_set_bytes"`
		SwapUsed     float64 `json:"swap_used_bytes"`
		OOMKills     float64 `json:"oom_kills"`
	} `json:"steps"`
	MaxStable int `json:"max_stable"`
	Collapse  *struct {
		Density int    `json:"density"`
		Signal  string `json:"signal"`
	} `json:"collapse"`
	Ceiling *struct {
		Resource string `json:"resource"`
	} `json:"ceiling"`
	Findings []densityFinding `json:"findings"`
}

type densityFinding struct {
	ID      string `json:"id"`
	Summary string `json:"summary"`
}

// hostMemorySettings is what a density run may change on the host and must put back.
func hostMemorySettings(t *testing.T) string {
	t.Helper()
	swaps, err := exec.Command("swapon", "--show=NAME,SIZE").CombinedOutput()
	if err != nil {
		t.Fatalf("swapon --show: %v: %s", err, swaps)
	}
	var b strings.Builder
	b.Write(swaps)
	for _, s := range []string{"vm/swappiness", "vm/watermark_scale_factor"} {
		v, err := os.ReadFile(filepath.Join("/proc/sys", s))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s=%s", s, v)
	}
	return b.String()
}

// A small emulated node (1 GiB) of ~100 MiB browser-like sandboxes: without swap the sweep
// collapses once their heaps fill the node; with a swap file, the cold part of every heap goes
// to swap and the node holds clearly more. Nothing of either run is left on the host.
func TestDensitySwapRaisesTheCollapseThreshold(t *testing.T) {
	requireRoot(t)
	before := hostMemorySettings(t)
	swapFile := filepath.Join("/var/tmp", fmt.Sprintf("nodectl-density-test-%d.swap", os.Getpid()))
	t.Cleanup(func() {
		// Only if the run failed to: swapoff and remove the file, best effort.
		if _, err := os.Stat(swapFile); err == nil {
			_ = exec.Command("swapoff", swapFile).Run()
			_ = os.Remove(swapFile)
		}
	})
	common := []string{"stress", "density", "--node-memory", "1Gi", "--sandbox-memory", "100Mi", "--step", "2",
		"--step-duration", "6s", "--pace", "100ms", "--interval", "500ms", "-o", "json"}
	sweep := func(name string, extra ...string) densityReport {
		t.Helper()
		dir := filepath.Join(t.TempDir(), name)
		out, err := nodectl(t, append(append(slices.Clone(common), "--out", dir), extra...)...)
		if err != nil {
			t.Fatalf("stress density (%s): %v", name, err)
		}
		run, err := rundir.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		assertClean(t, run.Meta.ID)
		if after := hostMemorySettings(t); after != before {
			t.Errorf("%s: host memory settings changed:\nbefore %s\nafter  %s", name, before, after)
		}
		if _, err := os.Stat(swapFile); err == nil {
			t.Errorf("%s: swap file %s left behind", name, swapFile)
		}
		var rep densityReport
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("stress density -o json printed no report: %v\n%s", err, out)
		}
		for _, s := range rep.Steps {
			t.Logf("%s: density %d ready %d/%d readiness p99 %.3fs PSI full %.2f working set %.0f MiB swap %.0f MiB OOM %.0f",
				name, s.Density, s.Ready, s.Started, s.ReadinessP99, s.PSIFull, s.WorkingSet/(1<<20), s.SwapUsed/(1<<20), s.OOMKills)
		}
		return rep
	}

	noSwap := sweep("no-swap", "--max", "16")
	if noSwap.Collapse == nil {
		t.Fatalf("without swap the sweep never collapsed up to 16 sandboxes of 100 MiB in 1 GiB: %+v", noSwap)
	}
	t.Logf("no swap: max stable %d, collapse at %d (%s), ceiling %+v", noSwap.MaxStable, noSwap.Collapse.Density, noSwap.Collapse.Signal, noSwap.Ceiling)
	if !slices.ContainsFunc(noSwap.Findings, func(f densityFinding) bool { return f.ID == "memory-collapse" }) {
		t.Errorf("no memory-collapse finding without swap: %+v", noSwap.Findings)
	}
	if noSwap.MaxStable < 2 || noSwap.Ceiling == nil || noSwap.Ceiling.Resource != "memory-working-set" {
		t.Errorf("without swap: max stable %d, ceiling %+v; want at least 2 and the memory working set", noSwap.MaxStable, noSwap.Ceiling)
	}

	withSwap := sweep("swap", "--max", "40", "--swap", swapFile+":1Gi", "--swappiness", "100", "--watermark-scale-factor", "500")
	t.Logf("swap: max stable %d, collapse %+v, ceiling %+v", withSwap.MaxStable, withSwap.Collapse, withSwap.Ceiling)
	if r := float64(withSwap.MaxStable) / float64(noSwap.MaxStable); r < 1.5 {
		t.Errorf("with 1 GiB of swap the node held %d sandboxes, without %d (x%.2f); want at least x1.5", withSwap.MaxStable, noSwap.MaxStable, r)
	}
	var swapped float64
	for _, s := range withSwap.Steps {
		swapped = max(swapped, s.SwapUsed)
	}
	if swapped == 0 {
		t.Errorf("the swap sweep never used its swap file")
	}
}

// startDensity starts a long swap sweep in the background and returns once a sandbox is ready,
// with the run's swap file enabled and its sysctls set.
func startDensity(t *testing.T, swapFile string) (*exec.Cmd, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "run")
	cmd := exec.Command(os.Args[0], "stress", "density", "--node-memory", "512Mi", "--sandbox-memory", "32Mi",
		"--binary-size", "8Mi", "--step", "2", "--max", "4", "--step-duration", "5m",
		"--swap", swapFile+":64Mi", "--swappiness", "90", "--watermark-scale-factor", "400", "--out", dir)
	cmd.Env = append(os.Environ(), beMain+"=1")
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if run, err := rundir.Open(dir); err == nil {
			_, _ = nodectl(t, "stress", "clean", "--all", run.Meta.ID)
		}
		if _, err := os.Stat(swapFile); err == nil {
			_ = exec.Command("swapoff", swapFile).Run()
			_ = os.Remove(swapFile)
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if run, err := rundir.Open(dir); err == nil && len(run.Series(rundir.MetricSandboxReadiness)) > 0 {
			return cmd, run.Meta.ID
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("no sandbox of the run became ready:\n%s", errb.String())
	return nil, ""
}

// assertSwapOn checks that the run's swap file and sysctls are in force while it runs, so that
// restoring them is tested, not assumed.
func assertSwapOn(t *testing.T, swapFile string) {
	t.Helper()
	swaps, _ := os.ReadFile("/proc/swaps")
	sw, _ := os.ReadFile("/proc/sys/vm/swappiness")
	if !strings.Contains(string(swaps), swapFile) || strings.TrimSpace(string(sw)) != "90" {
		t.Fatalf("while the run runs: swap file %s in /proc/swaps %v, vm.swappiness %s (want 90)", swapFile, strings.Contains(string(swaps), swapFile), sw)
	}
}

func TestDensityInterruptedRestoresTheHost(t *testing.T) {
	requireRoot(t)
	before := hostMemorySettings(t)
	swapFile := filepath.Join("/var/tmp", fmt.Sprintf("nodectl-density-int-%d.swap", os.Getpid()))
	cmd, id := startDensity(t, swapFile)
	assertSwapOn(t, swapFile)
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if err == nil || !errors.As(err, &ee) || ee.ExitCode() != 130 {
		t.Errorf("interrupted run exited with %v, want exit status 130", err)
	}
	assertClean(t, id)
	if after := hostMemorySettings(t); after != before {
		t.Errorf("host memory settings changed:\nbefore %s\nafter  %s", before, after)
	}
	if _, err := os.Stat(swapFile); err == nil {
		t.Errorf("swap file %s left behind", swapFile)
	}
}

func TestDensityKilledRunIsRestoredByStressClean(t *testing.T) {
	requireRoot(t)
	before := hostMemorySettings(t)
	swapFile := filepath.Join("/var/tmp", fmt.Sprintf("nodectl-density-kill-%d.swap", os.Getpid()))
	cmd, id := startDensity(t, swapFile)
	assertSwapOn(t, swapFile)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	out, err := nodectl(t, "stress", "clean", id)
	if err != nil {
		t.Fatalf("stress clean: %v\n%s", err, out)
	}
	if !strings.Contains(out, "swap:"+swapFile) {
		t.Errorf("stress clean did not report restoring the swap file: %s", out)
	}
	assertClean(t, id)
	if after := hostMemorySettings(t); after != before {
		t.Errorf("host memory settings changed:\nbefore %s\nafter  %s", before, after)
	}
	if _, err := os.Stat(swapFile); err == nil {
		t.Errorf("swap file %s left behind", swapFile)
	}
}

func TestDensityCLIErrorsNameTheFlag(t *testing.T) {
	expectCLIErrors(t, []string{"stress", "density"}, map[string]cliError{
		"zero_step":        {[]string{"--step", "0"}, "--step 0: want an integer from 1 to 10000"},
		"max_below_step":   {[]string{"--step", "4", "--max", "2"}, "--max 2: want an integer from --step (4) to 10000"},
		"bad_memory":       {[]string{"--sandbox-memory", "lots"}, `--sandbox-memory: bad size "lots"`},
		"limit_below_heap": {[]string{"--sandbox-memory", "200Mi", "--limit", "100Mi"}, "--limit 100Mi: must be above --sandbox-memory 200Mi"},
		"request_over":     {[]string{"--request", "3Gi", "--limit", "2Gi"}, "--request 3Gi: is above --limit 2Gi"},
		"tiny_node":        {[]string{"--node-memory", "100Mi"}, "--node-memory 100Mi: must hold at least one sandbox"},
		"swap_no_size":     {[]string{"--swap", "/var/tmp/x.swap"}, `--swap "/var/tmp/x.swap": not a block device; for a swap file the run makes, give its size: FILE:SIZE`},
		"swap_zero_size":   {[]string{"--swap", "/var/tmp/x.swap:0"}, "at least 1Mi"},
		"swap_relative":    {[]string{"--swap", "x.swap:1Gi"}, "want FILE:SIZE with an absolute FILE"},
		"swappiness":       {[]string{"--swappiness", "300"}, "--swappiness 300: want 0 to 200, or -1 to leave it"},
		"wsf":              {[]string{"--watermark-scale-factor", "0"}, "--watermark-scale-factor 0: want 1 to 3000"},
		"psi_share":        {[]string{"--collapse-psi-full", "2"}, "--collapse-psi-full 2: want a share from 0 to 1"},
		"hot_share":        {[]string{"--hot-share", "0"}, "--hot-share 0: want a share above 0 and at most 1"},
		"bad_output":       {[]string{"-o", "yaml"}, `-o "yaml": allowed values are text and json`},
		"bad_cpu_request":  {[]string{"--cpu-request", "fast"}, `--cpu-request: bad CPU limit "fast"`},
		"cpu_request_over": {[]string{"--cpu-request", "2", "--cpu-limit", "500m"}, "--cpu-request 2: is above --cpu-limit 500m"},
		"image_local":      {[]string{"--image", "chrome:1"}, `--image "chrome:1", --image-binary "": only with --node`},
	})
}

// With only the OOM criterion on, a node too small for its sandboxes (no swap) collapses by an
// OOM kill inside the run: the reclaim tracer records it with the killed sandbox, the analyzer
// reports one oom-kill for the node naming it, and memory-collapse says the OOM kill crossed
// first.
func TestDensityOOMKillInsideTheRun(t *testing.T) {
	requireRoot(t)
	dir := filepath.Join(t.TempDir(), "run")
	out, err := nodectl(t, "stress", "density", "--node-memory", "384Mi", "--sandbox-memory", "100Mi", "--binary-size", "16Mi",
		"--step", "2", "--max", "8", "--step-duration", "4s", "--pace", "100ms", "--interval", "500ms", "--trace",
		"--collapse-psi-full", "0", "--collapse-readiness", "0", "--collapse-tick-gap", "0", "--out", dir, "-o", "json")
	if err != nil {
		t.Fatalf("stress density: %v", err)
	}
	run, err := rundir.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	assertClean(t, run.Meta.ID)
	var rep struct {
		densityReport
		Findings []struct {
			ID      string `json:"id"`
			Victim  string `json:"victim"`
			Summary string `json:"summary"`
		} `json:"findings"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("stress density -o json: %v\n%s", err, out)
	}
	if rep.Collapse == nil || rep.Collapse.Signal != "oom-kill" {
		t.Fatalf("collapse %+v, want one by oom-kill", rep.Collapse)
	}
	var kills []rundir.Record
	for _, r := range run.Records {
		if r.Type == rundir.TypeEvent && r.Name == rundir.EventOOMKill {
			kills = append(kills, r)
		}
	}
	if len(kills) == 0 {
		t.Fatal("no oom_kill event recorded by the reclaim tracer")
	}
	if k := kills[0]; !strings.Contains(k.Cgroup, "/sandbox-") || k.Labels[rundir.LabelOOMLimitCgroup] != workloadCgroup(run, "node") {
		t.Errorf("first kill in %s with limit cgroup %q; want a sandbox's, the node's limit %s", k.Cgroup, k.Labels[rundir.LabelOOMLimitCgroup], workloadCgroup(run, "node"))
	}
	var oom, collapse int
	for _, f := range rep.Findings {
		switch f.ID {
		case "oom-kill":
			oom++
			if f.Victim != "node" || !strings.Contains(f.Summary, "sandbox-") {
				t.Errorf("oom-kill of %q: %s; want the node, naming the sandbox", f.Victim, f.Summary)
			}
		case "memory-collapse":
			collapse++
		}
	}
	if oom != 1 || collapse != 1 {
		t.Errorf("%d oom-kill and %d memory-collapse findings, want one each", oom, collapse)
	}
}
