package main

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nodectl/nodectl/agent/record"
)

// The victim probe and a CPU hog run in runc containers and in gVisor sandboxes: the hog's CPU
// is charged to the hog's cgroup, the victim's run-queue waits name the hog as the preemptor, a
// runsc sandbox's Sentry, gofer and stubs are all in its workload's cgroup, and the run leaves no
// container, sandbox process, mount or cgroup (noisyRun checks the last part).
func TestNoisyInContainerRuntimes(t *testing.T) {
	requireRoot(t)
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			if _, err := exec.LookPath(rt); err != nil {
				t.Fatalf("%s is not installed; .ci/run installs it", rt)
			}
			mountsBefore := runtimeMounts(t)
			_, run := noisyRun(t, "--runtime", rt, "--hog", "cpu", "--baseline", "4s", "--duration", "6s", "--daemons", "none")
			if !strings.HasPrefix(run.Meta.Runtime, rt) {
				t.Errorf("meta.json runtime = %q, want %s", run.Meta.Runtime, rt)
			}
			for _, w := range run.Meta.Workloads {
				if w.Name != "victim" && w.Name != "cpu-hog-0" {
					continue
				}
				if w.Runtime != rt {
					t.Errorf("%s ran in %q, want %s", w.Name, w.Runtime, rt)
				}
				roles := map[string]int{}
				for _, p := range w.HostProcesses {
					roles[p.Role]++
				}
				t.Logf("%s host processes: %v", w.Name, roles)
				if rt == "runsc" && (roles["sandbox"] != 1 || roles["gofer"] != 1 || roles["stub"] == 0) {
					t.Errorf("%s: host processes in its cgroup %v, want its sandbox, gofer and stubs", w.Name, roles)
				}
				if len(w.HostProcesses) == 0 {
					t.Errorf("%s: no host process recorded", w.Name)
				}
			}
			stress, ok := run.Phase(record.PhaseStress)
			if !ok {
				t.Fatal("no stress phase")
			}
			hog, victim := workloadCgroup(run, "cpu-hog-0"), workloadCgroup(run, "victim")
			cores := run.Series(record.MetricCPUUsage).Cgroup(hog).Delta(stress) / stress.Seconds()
			if cores < 0.5 {
				t.Errorf("the hog's cgroup used %.2f cores in stress; its CPU is not charged to it", cores)
			}
			waits := run.Series(record.MetricRunqPreemptions).Cgroup(victim).Label(record.LabelPreemptor, hog).Delta(stress) +
				run.Series(record.MetricRunqWakeupWaits).Cgroup(victim).Label(record.LabelPreemptor, hog).Delta(stress)
			t.Logf("%s: hog %.2f cores; victim waited behind the hog %.0f times", rt, cores, waits)
			if waits == 0 {
				t.Errorf("no run-queue wait of the victim is charged to the hog's cgroup %s", hog)
			}
			if after := runtimeMounts(t); after != mountsBefore {
				t.Errorf("mounts of container runtimes: %d before the run, %d after", mountsBefore, after)
			}
			if out, _ := exec.Command("pgrep", "-f", "runsc-sandbox|runsc-gofer").Output(); len(out) > 0 {
				t.Errorf("gVisor processes left: %s", out)
			}
		})
	}
}

// runtimeMounts counts mounts that name a container runtime's state or a run's root filesystem.
func runtimeMounts(t *testing.T) int {
	t.Helper()
	out, err := exec.Command("cat", "/proc/self/mountinfo").Output()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "/run/nodectl") || strings.Contains(l, "runsc") || strings.Contains(l, "runc") {
			n++
		}
	}
	return n
}

// Under runsc, churn starts and stops real sandboxes; the runtime's own process runs in the hog's
// cgroup and each sandbox in a cgroup below it, so the heartbeat's starvation is charged to the
// churn hogs, and no sandbox outlives the run.
func TestHeartbeatNextToSandboxChurnIsStarved(t *testing.T) {
	requireRoot(t)
	rep, run := noisyRun(t, "--runtime", "runsc", "--heartbeat=100ms", "--hog", "churn,count=2", "--daemons", "none")
	stress, _ := run.Phase(record.PhaseStress)
	starts := 0.0
	for _, v := range run.Series(record.MetricChurnStarts).Values(stress) {
		starts += v
	}
	t.Logf("sandboxes started in stress: %.0f; findings %v", starts, rep.ids())
	if starts < 4 {
		t.Errorf("only %.0f sandboxes started during the stress phase", starts)
	}
	i, ok := finding(rep, "system-daemon-starvation")
	if !ok {
		t.Fatalf("no system-daemon-starvation finding; got %v", rep.ids())
	}
	if f := rep.Findings[i]; !slices.ContainsFunc(f.Culprits, func(c string) bool { return strings.HasPrefix(c, "churn-hog-") }) {
		t.Errorf("system-daemon-starvation blames %v, want the churn hogs", f.Culprits)
	}
	if out, _ := exec.Command("pgrep", "-f", "runsc-sandbox|runsc-gofer").Output(); len(out) > 0 {
		t.Errorf("gVisor processes left: %s", out)
	}
}

// The same sandbox in runc and in gVisor: at 50m its start is throttled and far slower than at
// one CPU, and the analyzer says so; under runsc the sandbox's own boot (the Sentry's) is in it.
func TestWakeInContainerRuntimes(t *testing.T) {
	requireRoot(t)
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "run")
			out, err := nodectl(t, "stress", "wake", "--runtime", rt, "--cpu-limits", "50m,1", "--count", "2", "--out", dir, "-o", "json")
			if err != nil {
				t.Fatalf("stress wake: %v", err)
			}
			run, err := record.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			assertClean(t, run.Meta.ID)
			var rep wakeReport
			if err := json.Unmarshal([]byte(out), &rep); err != nil {
				t.Fatalf("stress wake -o json: %v\n%s", err, out)
			}
			if len(rep.Limits) != 2 {
				t.Fatalf("limits %+v, want 50m and 1", rep.Limits)
			}
			slow, fast := rep.Limits[0], rep.Limits[1]
			t.Logf("%s wake p50: 50m %.3fs, 1 %.3fs (x%.1f); throttled share at 50m %.2f; findings %v",
				rt, slow.WakeP50, fast.WakeP50, slow.WakeP50/fast.WakeP50, slow.ThrottledShare, rep.ids())
			if fast.WakeP50 <= 0 || slow.WakeP50/fast.WakeP50 < 4 {
				t.Errorf("at 50m the %s sandbox woke only x%.1f slower than at 1 CPU; want at least x4", rt, slow.WakeP50/fast.WakeP50)
			}
			if i, ok := finding(rep.report, "cpu-throttling"); !ok || rep.Findings[i].Victim != "wake-50m" {
				t.Errorf("no cpu-throttling of wake-50m; findings %v", rep.ids())
			}
			if !strings.HasPrefix(run.Meta.Runtime, rt) {
				t.Errorf("meta.json runtime = %q, want %s", run.Meta.Runtime, rt)
			}
		})
	}
}
