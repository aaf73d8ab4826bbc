package testcluster

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

func TestMain(m *testing.M) { Main(m) }

// TestCluster starts the control plane and the node, runs a runc pod and a gVisor pod that
// burn CPU, checks where they run, and that stopping leaves nothing behind.
func TestCluster(t *testing.T) {
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	sysctls := readSysctls()
	c := Start(t, log)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "smoke"}}
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitServiceAccount(ctx, "smoke"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	pods := map[string]string{"burn-runc": RuntimeClassRunc, "burn-gvisor": RuntimeClassGVisor}
	for name, rc := range pods {
		if _, err := c.Client.CoreV1().Pods("smoke").Create(ctx, burnPod(name, rc), metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating pod %s: %v", name, err)
		}
	}
	uids := map[string]string{}
	for name := range pods {
		p, err := waitRunning(ctx, c.Client, "smoke", name)
		if err != nil {
			t.Fatal(err)
		}
		uids[name] = string(p.UID)
	}
	t.Logf("both pods Running in %v", time.Since(start).Round(time.Millisecond))

	// Each pod has its cgroup below CgroupRoot (burstable: it requests CPU) and burns in it.
	for name, uid := range uids {
		cg := filepath.Join("/sys/fs/cgroup/cpuacct", CgroupRoot, "kubepods/burstable", "pod"+uid)
		before := readInt(t, filepath.Join(cg, "cpuacct.usage"))
		time.Sleep(time.Second)
		used := time.Duration(readInt(t, filepath.Join(cg, "cpuacct.usage")) - before)
		argv0s := processes(cg)
		t.Logf("pod %s: cgroup %s, %v of CPU in 1 s, processes %v", name, cg, used, argv0s)
		if used < 300*time.Millisecond {
			t.Errorf("pod %s used %v of CPU in 1 s, want it burning", name, used)
		}
		gvisor := strings.Contains(strings.Join(argv0s, " "), "runsc-sandbox")
		if want := name == "burn-gvisor"; gvisor != want {
			t.Errorf("pod %s: runsc-sandbox in its cgroup %v, want %v (processes %v)", name, gvisor, want, argv0s)
		}
	}

	// A DaemonSet's pod runs as its own ServiceAccount, whose token is mounted.
	agentSA := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "agent"}}
	if _, err := c.Client.CoreV1().ServiceAccounts("smoke").Create(ctx, agentSA, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "agent"}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "agent"},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName:            "agent",
					TerminationGracePeriodSeconds: new(int64),
					Containers:                    []corev1.Container{{Name: "agent", Image: PauseImage, ImagePullPolicy: corev1.PullNever}},
				},
			},
		},
	}
	if _, err := c.Client.AppsV1().DaemonSets("smoke").Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dsPod, err := c.Node.RunDaemonSet(ctx, "smoke", "agent")
	if err != nil {
		t.Fatal(err)
	}
	if dsPod, err = waitRunning(ctx, c.Client, "smoke", dsPod.Name); err != nil {
		t.Fatal(err)
	}
	tokenMounted := false
	for _, v := range dsPod.Spec.Volumes {
		if v.Projected != nil {
			for _, src := range v.Projected.Sources {
				tokenMounted = tokenMounted || src.ServiceAccountToken != nil
			}
		}
	}
	if dsPod.Spec.ServiceAccountName != "agent" || !tokenMounted {
		t.Errorf("the DaemonSet's pod runs as %q, token mounted %v; want agent, true", dsPod.Spec.ServiceAccountName, tokenMounted)
	}

	// The default ServiceAccount authenticates with a real token and RBAC refuses it.
	cfg, err := c.ServiceAccountConfig(ctx, "smoke", "default")
	if err != nil {
		t.Fatal(err)
	}
	sa := kubernetes.NewForConfigOrDie(cfg)
	if _, err := sa.CoreV1().Pods("smoke").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the default ServiceAccount listing pods: %v, want forbidden", err)
	}
	imp := kubernetes.NewForConfigOrDie(c.ImpersonateServiceAccount("smoke", "default"))
	if _, err := imp.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("impersonating the default ServiceAccount getting the node: %v, want forbidden", err)
	}

	for name, b := range c.RSS() {
		t.Logf("RSS %s: %.0f MiB", name, float64(b)/(1<<20))
	}

	// Stop now (Cleanup would again, idempotently) to check what is left.
	start = time.Now()
	c.Node.Stop()
	c.ControlPlane.Stop()
	t.Logf("stopped in %v", time.Since(start).Round(time.Millisecond))
	if left := Leftovers(filepath.Join(c.Dir, "node")); len(left) > 0 {
		t.Errorf("left behind:\n%s", strings.Join(left, "\n"))
	}
	for path, now := range readSysctls() {
		if string(now) != string(sysctls[path]) {
			t.Errorf("%s %q after the run, %q before", path, now, sysctls[path])
		}
	}
}

func burnPod(name, runtimeClass string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			NodeName:                      NodeName,
			RuntimeClassName:              &runtimeClass,
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name:            "burn",
				Image:           PauseImage,
				Command:         BurnCommand,
				ImagePullPolicy: corev1.PullNever,
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")},
				},
			}},
		},
	}
}

func waitRunning(ctx context.Context, c kubernetes.Interface, ns, name string) (*corev1.Pod, error) {
	var pod *corev1.Pod
	err := poll(ctx, 500*time.Millisecond, "pod "+ns+"/"+name+" Running", nil, func() error {
		p, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		pod = p
		if p.Status.Phase == corev1.PodRunning {
			return nil
		}
		msg := string(p.Status.Phase)
		for _, cs := range p.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil {
				msg += ": " + w.Reason + " " + w.Message
			}
		}
		for _, cond := range p.Status.Conditions {
			if cond.Message != "" {
				msg += "; " + cond.Message
			}
		}
		return &podState{msg}
	})
	return pod, err
}

type podState struct{ s string }

func (p *podState) Error() string { return p.s }

func readInt(t *testing.T, path string) int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// processes lists argv[0] of every process in the cgroup and below.
func processes(cg string) []string {
	var out []string
	_ = filepath.WalkDir(cg, func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		b, _ := os.ReadFile(filepath.Join(path, "cgroup.procs"))
		for _, pid := range strings.Fields(string(b)) {
			cmd, _ := os.ReadFile("/proc/" + pid + "/cmdline")
			argv0, _, _ := strings.Cut(string(cmd), "\x00")
			out = append(out, filepath.Base(argv0))
		}
		return nil
	})
	return out
}

// testWriter sends the cluster's log lines to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
