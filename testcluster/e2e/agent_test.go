package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodectl/nodectl/agent"
	"github.com/nodectl/nodectl/agent/recorded"
	"github.com/nodectl/nodectl/analyzer"
	"github.com/nodectl/nodectl/testcluster"
)

func TestMain(m *testing.M) { testcluster.Main(m) }

const (
	agentNamespace = "nodectl-system"
	agentName      = "nodectl-agent"
	testNamespace  = "e2e"
	metricsURL     = "http://127.0.0.1:9560/metrics"
)

// The capabilities deploy/base adds, and those the agent's process must hold: exactly these.
var agentCaps = map[string]uint{"BPF": 39, "PERFMON": 38, "CHOWN": 0, "SETUID": 7, "SETGID": 6}

// agentKeeps are the capabilities the agent keeps once it runs as its own user (--run-as).
var agentKeeps = []string{"BPF", "PERFMON"}

// TestAgentOnARealNode applies deploy/ to a real control plane with a real kubelet and checks
// the agent there, in one sequence (each step needs the one before): it runs unprivileged with
// the declared capabilities; a runc pod and a gVisor pod burning CPU next to a victim pod are
// named in its metrics and in the cpu-contention finding of the window; a kubelet stopped for
// 15 s gives a lease_late incident explained from the kernel's side; the agent killed with -9
// is restarted by the kubelet with its incidents and flight recorder intact; its
// ServiceAccount reads what the agent needs and nothing more.
func TestAgentOnARealNode(t *testing.T) {
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	c := testcluster.Start(t, log)
	bin, image, tag := os.Getenv("NODECTL_BIN"), os.Getenv("NODECTL_IMAGE"), os.Getenv("NODECTL_IMAGE_TAG")
	if bin == "" || image == "" || tag == "" {
		t.Fatal("NODECTL_BIN, NODECTL_IMAGE and NODECTL_IMAGE_TAG are not set: run make test-cluster (it builds bin/nodectl and its image)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	if err := c.Node.ImportImage(ctx, image); err != nil {
		t.Fatal(err)
	}

	// The agent's host directories are the test's own, not a host agent's.
	data, run := filepath.Join(c.Dir, "agent-data"), filepath.Join(c.Dir, "agent-run")
	socket := filepath.Join(run, "agent.sock")
	applied := apply(ctx, t, c.Config, writeOverlay(t, "../../deploy/base", overlay(t, c, tag, data, run)))
	for _, u := range applied {
		t.Logf("applied %s", describe(u))
	}
	// No controller-manager runs here: the DaemonSet's pod is made as its controller would.
	if _, err := c.Node.RunDaemonSet(ctx, agentNamespace, agentName); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	pod := waitAgent(ctx, t, c.Client, "")
	t.Logf("agent pod %s Ready in %v", pod.Name, time.Since(start).Round(time.Millisecond))
	nodectl := func(args ...string) []byte {
		t.Helper()
		out, err := exec.CommandContext(ctx, bin, args...).Output()
		if err != nil {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			t.Fatalf("nodectl %s: %v\n%s", strings.Join(args, " "), err, stderr)
		}
		return out
	}

	t.Cleanup(func() {
		if t.Failed() {
			// The kubelet's file: the API server cannot reach the test kubelet's log endpoint.
			logs, _ := filepath.Glob(filepath.Join(c.Dir, "node", "pod-logs", agentNamespace+"_"+agentName+"*", "agent", "*.log"))
			for _, f := range logs {
				b, _ := os.ReadFile(f)
				if len(b) > 8<<10 {
					b = b[len(b)-8<<10:]
				}
				t.Logf("--- %s (last 8 KiB)\n%s", f, b)
			}
		}
	})
	t.Run("privileges", func(t *testing.T) { checkPrivileges(t, pod) })

	// A victim pod alone, then next to a runc hog and a gVisor hog, all burning CPU with the
	// same request (the same CPU weight): the victim's run-queue waits rise, charged to them.
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitServiceAccount(ctx, testNamespace); err != nil {
		t.Fatal(err)
	}
	runPods(ctx, t, c.Client, map[string]string{"victim": testcluster.RuntimeClassRunc})
	const phase = 30 * time.Second
	time.Sleep(phase)
	runPods(ctx, t, c.Client, map[string]string{"hog-runc": testcluster.RuntimeClassRunc, "hog-gvisor": testcluster.RuntimeClassGVisor})
	from := time.Now()
	time.Sleep(phase)
	to := time.Now()

	t.Run("pods_named_in_metrics", func(t *testing.T) {
		m := scrape(t)
		for _, want := range []struct{ workload, kind, sandbox string }{
			{testNamespace + "/hog-runc/burn", "container", "false"},
			{testNamespace + "/hog-gvisor", "pod", "true"},
			{testNamespace + "/victim/burn", "container", "false"},
		} {
			info := m.find("nodectl_pod_info", "workload", want.workload)
			if info == nil || info.labels["kind"] != want.kind || info.labels["sandbox"] != want.sandbox || info.labels["namespace"] != testNamespace {
				t.Errorf("nodectl_pod_info of %s: %+v, want kind %s, sandbox %s", want.workload, info, want.kind, want.sandbox)
			}
			if used := m.find("nodectl_cpu_usage_seconds_total", "workload", want.workload); used == nil || used.value < 5 {
				t.Errorf("nodectl_cpu_usage_seconds_total of %s: %+v, want the seconds it burnt", want.workload, used)
			}
		}
		if t.Failed() {
			wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			out, _ := exec.CommandContext(wctx, bin, "agent", "watch", "--socket", socket, "--metric", "cpu_usage_seconds_total").Output()
			cancel()
			t.Logf("the agent's cpu_usage records for 3 s:\n%s", out)
			for _, name := range []string{"victim", "hog-runc"} {
				p, _ := c.Client.CoreV1().Pods(testNamespace).Get(ctx, name, metav1.GetOptions{})
				if p != nil {
					t.Logf("pod %s uid %s containers %+v", name, p.UID, p.Status.ContainerStatuses)
				}
			}
			for _, s := range m {
				if s.name == "nodectl_cpu_usage_seconds_total" || s.name == "nodectl_pod_info" || s.name == "nodectl_agent_pod_cgroups" {
					t.Logf("%s %v %g", s.name, s.labels, s.value)
				}
			}
		}
	})

	// The agent's analysis of the hogs' phase names them.
	contention := func(t *testing.T) {
		var rep analyzer.Report
		out := nodectl("analyze", "--socket", socket, "--from", from.Format(time.RFC3339Nano), "--to", to.Format(time.RFC3339Nano),
			"--baseline", phase.String(), "-o", "json")
		if err := json.Unmarshal(out, &rep); err != nil {
			t.Fatalf("analyze -o json: %v\n%s", err, out)
		}
		checkContention(t, rep)
	}
	t.Run("cpu_contention_names_the_hog_pods", contention)
	t.Run("node_flag_through_the_api_server", func(t *testing.T) { checkRemote(ctx, t, c, bin, from, to, phase) })
	stopPods(ctx, t, c.Client, "victim", "hog-runc", "hog-gvisor")
	// Once the pods are deleted and the agent has forgotten their cgroups (its metrics no
	// longer name them), a window of their time still names them, from the flight recorder.
	t.Run("deleted_pods_still_named", func(t *testing.T) {
		gone := testNamespace + "/victim/burn"
		for deadline := time.Now().Add(2 * time.Minute); scrape(t).find("nodectl_pod_info", "workload", gone) != nil; time.Sleep(2 * time.Second) {
			if time.Now().After(deadline) {
				t.Fatalf("the agent still names %s 2 min after its pod was deleted", gone)
			}
		}
		contention(t)
	})
	t.Run("stress_runs_as_pods", func(t *testing.T) { checkStressPods(ctx, t, c, bin) })
	t.Run("tune_on_the_node", func(t *testing.T) { checkTuneOnNode(ctx, t, c, bin) })

	t.Run("kubelet_stopped_gives_lease_late", func(t *testing.T) {
		pid := c.Node.KubeletPID()
		// Past the renewal that was due: stopped 15 s, the gap is 15 to 25 s.
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		stopped := time.Now()
		cont := func() { syscall.Kill(pid, syscall.SIGCONT) }
		defer cont()
		time.Sleep(15 * time.Second)
		cont()
		in := waitIncident(ctx, t, nodectl, socket, func(in recorded.Incident) bool {
			return in.Trigger == agent.TriggerLeaseLate && in.Opened.After(stopped) && in.State == recorded.StateClosed
		})
		t.Logf("incident %s: %s; %s", in.ID, in.Where(), in.Evidence)
		if !strings.Contains(in.Workload, "kubelet") {
			t.Errorf("the incident names %q, want the kubelet", in.Workload)
		}
		if in.Report == nil {
			t.Fatalf("incident %s has no report (%s)", in.ID, in.AnalysisError)
		}
		rep := *in.Report
		f := findingOf(rep, analyzer.IDLeaseLate)
		if f == nil {
			t.Fatalf("no lease-late finding: %s", summarize(rep))
		}
		t.Logf("lease-late: %s", f.Summary)
		var gap float64
		for _, e := range f.Evidence {
			if e.Metric == "lease_renewal_gap_seconds" {
				gap = e.Value
			}
		}
		if gap < 15 || !strings.Contains(f.Summary, "did not run") {
			t.Errorf("lease-late gap %.1fs, summary %q; want a gap of 15 s or more and a kubelet that did not run", gap, f.Summary)
		}
		// The same window read as a density step: the heartbeat gave out with memory to spare.
		if c := findingOf(rep, analyzer.IDNodeCollapse); c == nil || !strings.Contains(c.Summary, "Ceiling: "+analyzer.CeilingHeartbeat) {
			t.Errorf("node-collapse %+v; want the node-heartbeat ceiling: %s", c, summarize(rep))
		} else {
			t.Logf("node-collapse: %s", c.Summary)
		}
	})

	t.Run("killed_agent_restarts_with_its_data", func(t *testing.T) {
		before := incidentIDs(t, nodectl, socket)
		if len(before) == 0 {
			t.Fatal("no incident to find again after the restart")
		}
		oldest := storeOldest(t, nodectl, socket)
		pid := agentPID(t)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		restarted := waitAgent(ctx, t, c.Client, pod.Name)
		t.Logf("restarted (restart count %d) %v after the kill", restarted.Status.ContainerStatuses[0].RestartCount, time.Since(killed).Round(time.Millisecond))
		if after := incidentIDs(t, nodectl, socket); !isSubset(before, after) {
			t.Errorf("incidents before the kill %v, after %v: some were lost", before, after)
		}
		if got := storeOldest(t, nodectl, socket); got.IsZero() || got.After(oldest) {
			t.Errorf("the flight recorder's oldest sample was %v before the kill, %v after", oldest, got)
		}
	})

	t.Run("service_account_reads_no_more", func(t *testing.T) { checkRBAC(ctx, t, c) })
}

// overlay is the test's kustomization on deploy/base: the image built for this run, the
// test's data and socket directories, short incident windows, an fsync bound the disk hog's
// effect passes on any disk (the victim's fsyncs go from ~30 ms to hundreds; the shipped 1 s
// is reached only on a slow one), and the host's network, because the test cluster runs no
// kube-proxy and its API server listens on loopback only (the in-cluster config is pointed
// there).
func overlay(t *testing.T, c *testcluster.Cluster, tag, data, run string) string {
	t.Helper()
	u, err := url.Parse(c.Server)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf(`images:
  - name: nodectl
    newTag: %q
patches:
  - target: {kind: DaemonSet, name: %[2]s}
    patch: |-
      apiVersion: apps/v1
      kind: DaemonSet
      metadata: {name: %[2]s, namespace: %[3]s}
      spec:
        template:
          spec:
            hostNetwork: true
            dnsPolicy: ClusterFirstWithHostNet
            containers:
              - name: agent
                imagePullPolicy: Never
                env:
                  - {name: KUBERNETES_SERVICE_HOST, value: %[4]q}
                  - {name: KUBERNETES_SERVICE_PORT, value: %[5]q}
            volumes:
              - {name: data, hostPath: {path: %[6]q, type: DirectoryOrCreate}}
              - {name: run, hostPath: {path: %[7]q, type: DirectoryOrCreate}}
  - target: {kind: DaemonSet, name: %[2]s}
    patch: |-
      - {op: add, path: /spec/template/spec/containers/0/args/-, value: "--incident-before=40s"}
      - {op: add, path: /spec/template/spec/containers/0/args/-, value: "--incident-after=10s"}
      - {op: add, path: /spec/template/spec/containers/0/args/-, value: "--incident-baseline=30s"}
      - {op: add, path: /spec/template/spec/containers/0/args/-, value: "--trigger-fsync-stall=100ms"}
`, tag, agentName, agentNamespace, u.Hostname(), u.Port(), data, run)
}

// waitAgent waits for the agent's pod to be Running and Ready; with restartedFrom, for it to
// have restarted since.
func waitAgent(ctx context.Context, t *testing.T, cs kubernetes.Interface, restartedFrom string) *corev1.Pod {
	t.Helper()
	var last string
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for ctx.Err() == nil {
		pods, err := cs.CoreV1().Pods(agentNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + agentName})
		if err == nil && len(pods.Items) == 1 {
			p := &pods.Items[0]
			for _, st := range p.Status.ContainerStatuses {
				if w := st.State.Waiting; w != nil && slices.Contains(hopeless, w.Reason) {
					t.Fatalf("the agent's container cannot start: %s: %s", w.Reason, w.Message)
				}
			}
			ready := p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].Ready
			restarted := restartedFrom == "" || len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount > 0
			if ready && restarted {
				return p
			}
			last = fmt.Sprintf("%s %s %+v", p.Name, p.Status.Phase, p.Status.ContainerStatuses)
		} else if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("%d pods", len(pods.Items))
		}
		time.Sleep(time.Second)
	}
	t.Fatalf("the agent's pod is not Ready: %s", last)
	return nil
}

// hopeless are the reasons a container waits that no wait cures.
var hopeless = []string{"ErrImageNeverPull", "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError", "CreateContainerError"}

// checkPrivileges: the pod asks for no privilege but the declared capabilities, and the
// agent's process on the host runs as its own user with the two it keeps.
func checkPrivileges(t *testing.T, pod *corev1.Pod) {
	sc := pod.Spec.Containers[0].SecurityContext
	if sc == nil || sc.Privileged != nil && *sc.Privileged || sc.Capabilities == nil {
		t.Fatalf("security context %+v: want unprivileged with capabilities", sc)
	}
	var added []string
	for _, c := range sc.Capabilities.Add {
		added = append(added, string(c))
	}
	if len(added) != len(agentCaps) || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("capabilities add %v drop %v, want add %v and drop ALL", added, sc.Capabilities.Drop, agentCaps)
	}
	for _, name := range added {
		if _, ok := agentCaps[name]; !ok {
			t.Errorf("capability %s added, not one the agent was measured to need", name)
		}
	}
	var want uint64
	for _, name := range agentKeeps {
		want |= 1 << agentCaps[name]
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("the root filesystem is writable")
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", agentPID(t)))
	if err != nil {
		t.Fatal(err)
	}
	// The runtime's default seccomp filter holds (mode 2), and the agent still loads and runs.
	if !strings.Contains(string(status), "\nSeccomp:\t2\n") {
		t.Errorf("the agent runs without a seccomp filter (want RuntimeDefault):\n%s", status)
	}
	// Its own user, not root, with what it keeps alone, effective and permitted.
	if !strings.Contains(string(status), "\nUid:\t65532\t65532\t65532\t65532\n") {
		t.Errorf("the agent does not run as uid 65532:\n%s", status)
	}
	caps := 0
	for _, l := range strings.Split(string(status), "\n") {
		field, v, _ := strings.Cut(l, ":")
		if field != "CapEff" && field != "CapPrm" {
			continue
		}
		caps++
		got, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("the agent's %s %#x, want %#x (%v)", field, got, want, agentKeeps)
		}
	}
	if caps != 2 {
		t.Error("no CapEff and CapPrm in the agent's status")
	}
}

// agentPID finds the agent's process on the host: nodectl with the DaemonSet's health flag.
func agentPID(t *testing.T) int {
	t.Helper()
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(string(cmd), "\x00")
		if len(args) > 2 && filepath.Base(args[0]) == "nodectl" && args[1] == "agent" && slices.Contains(args, "--health-listen=:9561") {
			return pid
		}
	}
	t.Fatal("no agent process on the host")
	return 0
}

// runPods starts burning pods (name → RuntimeClass), each requesting 100m, and waits until
// they run.
func runPods(ctx context.Context, t *testing.T, cs kubernetes.Interface, pods map[string]string) {
	t.Helper()
	for name, rc := range pods {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNamespace},
			Spec: corev1.PodSpec{
				NodeName: testcluster.NodeName, RuntimeClassName: &rc, TerminationGracePeriodSeconds: new(int64),
				Containers: []corev1.Container{{Name: "burn", Image: testcluster.PauseImage, Command: testcluster.BurnCommand,
					ImagePullPolicy: corev1.PullNever,
					Resources:       corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}}}},
			},
		}
		if _, err := cs.CoreV1().Pods(testNamespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating pod %s: %v", name, err)
		}
	}
	for name := range pods {
		for {
			p, err := cs.CoreV1().Pods(testNamespace).Get(ctx, name, metav1.GetOptions{})
			if err == nil && p.Status.Phase == corev1.PodRunning {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("pod %s not Running: %v", name, err)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
}

// stopPods deletes the pods and kills what they run: a gVisor pod's sandbox does not stop
// through the runc shim here (testcluster), and its burning would go on into the next steps.
func stopPods(ctx context.Context, t *testing.T, cs kubernetes.Interface, names ...string) {
	t.Helper()
	for _, name := range names {
		p, err := cs.CoreV1().Pods(testNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("pod %s: %v", name, err)
			continue
		}
		if err := cs.CoreV1().Pods(testNamespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Errorf("deleting pod %s: %v", name, err)
		}
		dir := filepath.Join("/sys/fs/cgroup/cpuacct", testcluster.CgroupRoot, "kubepods", strings.ToLower(string(p.Status.QOSClass)), "pod"+string(p.UID))
		filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			procs, _ := os.ReadFile(filepath.Join(path, "cgroup.procs"))
			for _, f := range strings.Fields(string(procs)) {
				if pid, err := strconv.Atoi(f); err == nil {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			return nil
		})
	}
}

// sample is one Prometheus sample of a scrape.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

type scraped []sample

func (s scraped) find(name, label, value string) *sample {
	for i := range s {
		if s[i].name == name && s[i].labels[label] == value {
			return &s[i]
		}
	}
	return nil
}

// scrape reads the agent's metrics (text format; label values here hold no commas or quotes).
func scrape(t *testing.T) scraped {
	t.Helper()
	resp, err := http.Get(metricsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out scraped
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		s := sample{labels: map[string]string{}}
		rest := line
		if i := strings.IndexByte(line, '{'); i >= 0 {
			j := strings.LastIndexByte(line, '}')
			s.name, rest = line[:i], line[j+1:]
			for _, kv := range strings.Split(line[i+1:j], ",") {
				if k, v, ok := strings.Cut(kv, "="); ok {
					s.labels[k] = strings.Trim(v, `"`)
				}
			}
		} else {
			s.name, rest, _ = strings.Cut(line, " ")
		}
		s.value, _ = strconv.ParseFloat(strings.Fields(rest)[0], 64)
		out = append(out, s)
	}
	return out
}

// waitIncident polls the agent's incidents until one matches.
func waitIncident(ctx context.Context, t *testing.T, nodectl func(...string) []byte, socket string, match func(recorded.Incident) bool) recorded.Incident {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	var seen []recorded.Incident
	for time.Now().Before(deadline) && ctx.Err() == nil {
		seen = incidents(t, nodectl, socket)
		for _, in := range seen {
			if match(in) {
				return in
			}
		}
		time.Sleep(2 * time.Second)
	}
	var list []string
	for _, in := range seen {
		list = append(list, in.ID+" "+in.State+" "+in.Evidence)
	}
	t.Fatalf("no such incident; the agent has:\n%s", strings.Join(list, "\n"))
	return recorded.Incident{}
}

func incidents(t *testing.T, nodectl func(...string) []byte, socket string) []recorded.Incident {
	t.Helper()
	var list []recorded.Incident
	out := nodectl("agent", "incidents", "--socket", socket, "--limit", "0", "-o", "json")
	if err := json.Unmarshal(out, &list); err != nil {
		t.Fatalf("agent incidents -o json: %v\n%s", err, out)
	}
	return list
}

func incidentIDs(t *testing.T, nodectl func(...string) []byte, socket string) []string {
	var ids []string
	for _, in := range incidents(t, nodectl, socket) {
		ids = append(ids, in.ID)
	}
	return ids
}

// storeOldest is the oldest sample the agent's flight recorder holds.
func storeOldest(t *testing.T, nodectl func(...string) []byte, socket string) time.Time {
	t.Helper()
	var st struct {
		Store struct {
			Oldest time.Time `json:"oldest"`
		} `json:"store"`
	}
	out := nodectl("agent", "status", "--socket", socket, "-o", "json")
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("agent status -o json: %v\n%s", err, out)
	}
	return st.Store.Oldest
}

func isSubset(a, b []string) bool {
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

func findingOf(rep analyzer.Report, id string) *analyzer.Finding {
	for i := range rep.Findings {
		if rep.Findings[i].ID == id {
			return &rep.Findings[i]
		}
	}
	return nil
}

func summarize(rep analyzer.Report) string {
	var b bytes.Buffer
	for _, f := range rep.Findings {
		fmt.Fprintf(&b, "\n  %s %s ← %v: %s", f.ID, f.Victim, f.Culprits, f.Summary)
	}
	if b.Len() == 0 {
		return "no findings"
	}
	return b.String()
}

// checkRBAC asks the API server what the agent's ServiceAccount may do, and does it with the
// account's own token: what the agent needs, and nothing else.
func checkRBAC(ctx context.Context, t *testing.T, c *testcluster.Cluster) {
	user := "system:serviceaccount:" + agentNamespace + ":" + agentName
	for _, a := range []struct {
		verb, resource, group, namespace, name string
		allowed                                bool
	}{
		{"list", "pods", "", "", "", true},
		{"watch", "pods", "", "", "", true},
		{"get", "nodes", "", "", testcluster.NodeName, true},
		{"watch", "nodes", "", "", testcluster.NodeName, true},
		{"get", "leases", "coordination.k8s.io", corev1.NamespaceNodeLease, testcluster.NodeName, true},
		{"watch", "leases", "coordination.k8s.io", corev1.NamespaceNodeLease, "", true},
		{"list", "leases", "coordination.k8s.io", corev1.NamespaceNodeLease, "", false},
		{"update", "leases", "coordination.k8s.io", corev1.NamespaceNodeLease, testcluster.NodeName, false},
		{"get", "leases", "coordination.k8s.io", "default", "x", false},
		{"list", "nodes", "", "", "", false},
		{"patch", "nodes", "", "", testcluster.NodeName, false},
		{"get", "secrets", "", agentNamespace, "x", false},
		{"list", "secrets", "", "", "", false},
		{"get", "configmaps", "", agentNamespace, "x", false},
		{"delete", "pods", "", testNamespace, "x", false},
		{"create", "pods", "", testNamespace, "", false},
		{"get", "pods", "", testNamespace, "x", false},
	} {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + agentNamespace, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: a.verb, Resource: a.resource, Group: a.group, Namespace: a.namespace, Name: a.name},
		}}
		got, err := c.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.Allowed != a.allowed {
			t.Errorf("%s %s %s/%s by the agent's ServiceAccount: allowed %v, want %v", a.verb, a.resource, a.namespace, a.name, got.Status.Allowed, a.allowed)
		}
	}
	cfg, err := c.ServiceAccountConfig(ctx, agentNamespace, agentName)
	if err != nil {
		t.Fatal(err)
	}
	sa := kubernetes.NewForConfigOrDie(cfg)
	if _, err := sa.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("the agent's token listing pods: %v", err)
	}
	if _, err := sa.CoreV1().Secrets("").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the agent's token listing secrets: %v, want forbidden", err)
	}
}

// testWriter sends the cluster's log to the test's.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
