package e2e

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodectl/nodectl/analyzer"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/testcluster"
)

// checkRemote reaches the node's agent the way a person at a laptop does: a kubeconfig, --node
// and the API server's port-forward, as the admin, as a user bound to deploy/base's
// nodectl-user Role, and as one who may only read pods. The window from..to had the hog pods
// next to the victim.
func checkRemote(ctx context.Context, t *testing.T, c *testcluster.Cluster, bin string, from, to time.Time, baseline time.Duration) {
	run := func(kubeconfig string, args ...string) ([]byte, string, error) {
		cmd := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", kubeconfig}, args...)...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		return out, stderr.String(), err
	}
	admin := c.KubeconfigPath
	node := testcluster.NodeName

	t.Run("status", func(t *testing.T) {
		out, stderr, err := run(admin, "--node", node, "agent", "status", "-o", "json")
		if err != nil {
			t.Fatalf("agent status --node: %v\n%s", err, stderr)
		}
		var st struct {
			Node string `json:"node"`
		}
		if err := json.Unmarshal(out, &st); err != nil || st.Node != node {
			t.Errorf("agent status --node %s: node %q (%v)\n%s", node, st.Node, err, out)
		}
	})

	t.Run("analyze_names_the_hog_pods", func(t *testing.T) {
		out, stderr, err := run(admin, "--node", node, "analyze", "--from", from.Format(time.RFC3339Nano), "--to", to.Format(time.RFC3339Nano),
			"--baseline", baseline.String(), "-o", "json")
		if err != nil {
			t.Fatalf("analyze --node: %v\n%s", err, stderr)
		}
		var rep analyzer.Report
		if err := json.Unmarshal(out, &rep); err != nil {
			t.Fatalf("analyze --node -o json: %v\n%s", err, out)
		}
		checkContention(t, rep)
	})

	t.Run("export_pulls_a_run_directory", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "window")
		if _, stderr, err := run(admin, "--node", node, "agent", "export", "--from", from.Format(time.RFC3339Nano), "--to", to.Format(time.RFC3339Nano),
			"--baseline", baseline.String(), "--out", dir); err != nil {
			t.Fatalf("agent export --node: %v\n%s", err, stderr)
		}
		r, err := rundir.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := analyzer.Analyze(r)
		if err != nil {
			t.Fatal(err)
		}
		checkContention(t, *rep)
	})

	t.Run("all_nodes", func(t *testing.T) {
		out, stderr, err := run(admin, "agent", "status", "--all-nodes")
		if err != nil || !strings.Contains(string(out), node) {
			t.Errorf("agent status --all-nodes: %v\n%s%s", err, out, stderr)
		}
		out, stderr, err = run(admin, "agent", "incidents", "--all-nodes", "-o", "json")
		var list []struct {
			Node string `json:"node"`
		}
		if err != nil || json.Unmarshal(out, &list) != nil {
			t.Errorf("agent incidents --all-nodes -o json: %v\n%s%s", err, out, stderr)
		}
		for _, in := range list {
			if in.Node != node {
				t.Errorf("an incident of node %q, want %s", in.Node, node)
			}
		}
	})

	// Two people: one bound to deploy/base's nodectl-user Role, one allowed to read pods only.
	ns := agentNamespace
	for _, sa := range []string{"operator", "reader"} {
		if _, err := c.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Client.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "pod-reader"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for sa, role := range map[string]string{"operator": "nodectl-user", "reader": "pod-reader"} {
		if _, err := c.Client.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: sa},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ns}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	kubeconfig := func(t *testing.T, sa string) string {
		path, err := c.ServiceAccountKubeconfig(ctx, ns, sa, filepath.Join(t.TempDir(), sa+".kubeconfig"))
		if err != nil {
			t.Fatal(err)
		}
		return path
	}

	t.Run("nodectl_user_role_suffices", func(t *testing.T) {
		if out, stderr, err := run(kubeconfig(t, "operator"), "--node", node, "agent", "incidents"); err != nil {
			t.Errorf("agent incidents --node as a user bound to nodectl-user: %v\n%s%s", err, out, stderr)
		}
	})

	t.Run("pod_reader_is_refused_port_forward", func(t *testing.T) {
		_, stderr, err := run(kubeconfig(t, "reader"), "--node", node, "agent", "status")
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 1 {
			t.Fatalf("agent status --node as a pod reader: %v, want exit 1\n%s", err, stderr)
		}
		for _, want := range []string{"forbidden", "create pods/portforward in namespace " + ns, "nodectl-user"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("the refusal does not say %q:\n%s", want, stderr)
			}
		}
		t.Logf("refused: %s", strings.TrimSpace(stderr))
	})
}

// checkContention wants the victim pod's cpu-contention naming both hog pods.
func checkContention(t *testing.T, rep analyzer.Report) {
	t.Helper()
	victim := testNamespace + "/victim/burn"
	for _, f := range rep.Findings {
		if f.ID == analyzer.IDCPUContention && f.Victim == victim {
			for _, hog := range []string{testNamespace + "/hog-runc/burn", testNamespace + "/hog-gvisor"} {
				if !slices.Contains(f.Culprits, hog) {
					t.Errorf("cpu-contention of %s names %v, not %s", victim, f.Culprits, hog)
				}
			}
			return
		}
	}
	t.Errorf("no cpu-contention finding for %s: %s", victim, summarize(rep))
}
