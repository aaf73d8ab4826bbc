package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodectl/nodectl/testcluster"
)

// checkStressRights runs a stress run as a person bound to deploy/base's nodectl-stress and
// nodectl-user alone (a ServiceAccount's real token), and holds what that person may do to the
// run's namespace: everything a run does there, and nothing anywhere else. The API server's
// own SubjectAccessReviews say what RBAC grants; requests made as that person (dry runs: they
// change nothing) show what deploy/base's admission policies refuse.
func checkStressRights(ctx context.Context, t *testing.T, c *testcluster.Cluster, bin string, podCgroupsBefore []string) {
	const sa = "stresser"
	user := "system:serviceaccount:" + agentNamespace + ":" + sa
	groups := []string{"system:serviceaccounts", "system:serviceaccounts:" + agentNamespace, "system:authenticated"}
	core, rbac := c.Client.CoreV1(), c.Client.RbacV1()
	if _, err := core.ServiceAccounts(agentNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	subject := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: agentNamespace}}
	if _, err := rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "e2e-stresser"},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "nodectl-stress"}, Subjects: subject}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.RoleBindings(agentNamespace).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "e2e-stresser"},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "nodectl-user"}, Subjects: subject}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A namespace nodectl did not make.
	const other = "e2e-someone-elses"
	if _, err := core.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: other}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx := context.WithoutCancel(ctx)
		rbac.ClusterRoleBindings().Delete(cctx, "e2e-stresser", metav1.DeleteOptions{})
		rbac.ClusterRoleBindings().Delete(cctx, "e2e-stresser-tune", metav1.DeleteOptions{})
		rbac.RoleBindings(agentNamespace).Delete(cctx, "e2e-stresser", metav1.DeleteOptions{})
		core.ServiceAccounts(agentNamespace).Delete(cctx, sa, metav1.DeleteOptions{})
		core.Namespaces().Delete(cctx, other, metav1.DeleteOptions{})
	})
	kubeconfig, err := c.ServiceAccountKubeconfig(ctx, agentNamespace, sa, filepath.Join(t.TempDir(), sa+".kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	as := kubernetes.NewForConfigOrDie(c.ImpersonateServiceAccount(agentNamespace, sa))
	cmdOf := func(args ...string) *exec.Cmd {
		return exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", kubeconfig, "--node", testcluster.NodeName}, args...)...)
	}
	allowed := func(t *testing.T, ns, verb, resource, sub, name string) bool {
		t.Helper()
		r, err := c.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: groups,
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: verb, Resource: resource, Subresource: sub, Name: name},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return r.Status.Allowed
	}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	refused := func(t *testing.T, what string, err error, want string) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s as %s: %v, want refused with %q", what, sa, err, want)
		}
	}

	// A real run as that person, held running while its rights are examined.
	run := cmdOf("stress", "noisy", "--hog", "cpu", "--baseline", "10m", "--duration", "10m")
	stderr := &lockedBuffer{}
	run.Stderr = stderr
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	ns := waitProgress(t, run, stderr, "running: victim")
	defer func() {
		if run.ProcessState == nil {
			run.Process.Kill()
			run.Wait()
		}
	}()

	t.Run("the_run_namespace_is_its_makers", func(t *testing.T) {
		n, err := core.Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if n.Annotations["nodectl.io/created-by"] != user || n.Labels["pod-security.kubernetes.io/enforce"] != "restricted" {
			t.Errorf("namespace %s: annotations %v, labels %v: want made by %s, PodSecurity restricted", ns, n.Annotations, n.Labels, user)
		}
		rb, err := rbac.RoleBindings(ns).Get(ctx, "nodectl-stress-run", metav1.GetOptions{})
		if err != nil || rb.RoleRef.Name != "nodectl-stress-run" || len(rb.Subjects) != 1 || rb.Subjects[0] != subject[0] {
			t.Errorf("the run's binding: %+v, %v: want nodectl-stress-run for %s alone", rb, err, user)
		}
	})

	t.Run("rights_in_its_run_only", func(t *testing.T) {
		type right struct{ verb, resource, sub string }
		rights := []right{{"create", "pods", ""}, {"delete", "pods", ""}, {"list", "pods", ""}, {"get", "pods", "log"},
			{"create", "pods", "attach"}, {"get", "pods", "attach"}}
		for _, r := range rights {
			if !allowed(t, ns, r.verb, r.resource, r.sub, "") {
				t.Errorf("%s %s/%s in its run's namespace %s: refused, want allowed", r.verb, r.resource, r.sub, ns)
			}
			for _, elsewhere := range []string{"kube-system", other, agentNamespace, ""} {
				if elsewhere == agentNamespace && r == (right{"list", "pods", ""}) {
					continue // nodectl-user's: finding the agent's pod
				}
				if allowed(t, elsewhere, r.verb, r.resource, r.sub, "") {
					t.Errorf("%s %s/%s in namespace %q: allowed, want refused", r.verb, r.resource, r.sub, elsewhere)
				}
			}
		}
		if !allowed(t, ns, "delete", "namespaces", "", ns) {
			t.Errorf("delete namespace %s (its run's): refused", ns)
		}
		for _, elsewhere := range []string{"kube-system", other, agentNamespace} {
			if allowed(t, elsewhere, "delete", "namespaces", "", elsewhere) {
				t.Errorf("delete namespace %s: allowed, want refused", elsewhere)
			}
		}
	})

	t.Run("admission_keeps_it_there", func(t *testing.T) {
		bindRun := func(in string, who rbacv1.Subject) error {
			_, err := as.RbacV1().RoleBindings(in).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "e2e-escalate"},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "nodectl-stress-run"},
				Subjects: []rbacv1.Subject{who}}, dry)
			return err
		}
		refused(t, "binding nodectl-stress-run in kube-system", bindRun("kube-system", subject[0]), "only in a stress run's namespace")
		refused(t, "binding nodectl-stress-run in "+other, bindRun(other, subject[0]), "only in a stress run's namespace")
		mallory := rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "mallory"}
		refused(t, "binding nodectl-stress-run to another user in its run", bindRun(ns, mallory), "to the one who binds it")

		runNS := func(enforce, createdBy string, opts metav1.CreateOptions) (string, error) {
			id := runID()
			n, err := as.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "nodectl-" + id,
				Labels: map[string]string{"nodectl.io/run": id, "nodectl.io/node": testcluster.NodeName, "app.kubernetes.io/part-of": "nodectl-stress",
					"pod-security.kubernetes.io/enforce": enforce},
				Annotations: map[string]string{"nodectl.io/created-by": createdBy}}}, opts)
			if err != nil {
				return "", err
			}
			return n.Name, nil
		}
		if _, err := runNS("restricted", user, dry); err != nil {
			t.Errorf("a run's namespace as nodectl makes it: %v", err)
		}
		_, err := runNS("privileged", user, dry)
		refused(t, "a privileged run namespace", err, "who may tune its node")
		_, err = runNS("restricted", "admin", dry)
		refused(t, "a run namespace said to be admin's", err, "names its maker")

		// With nodectl-tune, a tuner run's namespace admits privileged pods; once the right is
		// gone, its maker, who still holds the run's rights there, may make none.
		if _, err := rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "e2e-stresser-tune"},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "nodectl-tune"}, Subjects: subject}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var tuned string
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
			if tuned, err = runNS("privileged", user, metav1.CreateOptions{}); err == nil {
				break
			}
		}
		if err != nil {
			t.Fatalf("a privileged run namespace with nodectl-tune: %v", err)
		}
		defer func() {
			// Gone before tune_on_the_node, which counts the runs' namespaces.
			core.Namespaces().Delete(context.WithoutCancel(ctx), tuned, metav1.DeleteOptions{})
			waitGone(context.WithoutCancel(ctx), t, c, tuned, podCgroups(t)) // no pod ran there; the run's still do
		}()
		if _, err := as.RbacV1().RoleBindings(tuned).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "nodectl-stress-run"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "nodectl-stress-run"},
			Subjects: subject}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("binding nodectl-stress-run in its own run %s: %v", tuned, err)
		}
		if err := c.WaitServiceAccount(ctx, tuned); err != nil {
			t.Fatal(err)
		}
		if err := rbac.ClusterRoleBindings().Delete(ctx, "e2e-stresser-tune", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		priv := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "e2e-privileged"}, Spec: corev1.PodSpec{NodeName: testcluster.NodeName,
			Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/x:1", SecurityContext: &corev1.SecurityContext{Privileged: new(true)}}}}}
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
			if _, err = as.CoreV1().Pods(tuned).Create(ctx, priv, dry); err != nil {
				break
			}
		}
		refused(t, "a privileged pod without nodectl-tune", err, "who may tune that node")
		// In a restricted run, PodSecurity refuses it first.
		_, err = as.CoreV1().Pods(ns).Create(ctx, priv, dry)
		refused(t, "a privileged pod in its restricted run", err, "forbidden")
	})

	t.Run("tune_needs_nodectl_tune", func(t *testing.T) {
		// The binding above is gone; the authorizer's cache follows shortly.
		var out []byte
		var err error
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
			if out, err = cmdOf("tune", "status").CombinedOutput(); err != nil && strings.Contains(string(out), "nodectl-tune") {
				return
			}
		}
		t.Errorf("tune status --node without nodectl-tune: %v, want refused naming nodectl-tune\n%s", err, out)
	})

	// The run ends with its CLI; the namespace goes with the rights the run was given in it.
	if err := run.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	err = run.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 {
		t.Errorf("the run interrupted: %v, want exit 130\n%s", err, stderr.String())
	}
	waitGone(ctx, t, c, ns, podCgroupsBefore)

	// Another person's run is out of reach of this one's clean.
	t.Run("clean_leaves_others_runs", func(t *testing.T) {
		id := runID()
		admins := "nodectl-" + id
		if _, err := core.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: admins,
			Labels: map[string]string{"nodectl.io/run": id, "nodectl.io/node": testcluster.NodeName, "app.kubernetes.io/part-of": "nodectl-stress",
				"pod-security.kubernetes.io/enforce": "restricted"},
			Annotations: map[string]string{"nodectl.io/created-by": "admin"}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		defer func() {
			core.Namespaces().Delete(context.WithoutCancel(ctx), admins, metav1.DeleteOptions{})
			waitGone(context.WithoutCancel(ctx), t, c, admins, podCgroups(t))
		}()
		out, err := cmdOf("stress", "clean").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "namespace "+admins+` is a run of "admin"`) {
			t.Errorf("stress clean --node beside another's run: %v\n%s", err, out)
		}
		if n, err := core.Namespaces().Get(ctx, admins, metav1.GetOptions{}); err != nil || n.DeletionTimestamp != nil {
			t.Errorf("the other's run after clean: %v, want it left alone", err)
		}
	})
}

// runID is a run id of the form nodectl gives its runs (stress.NewRunID), for namespaces the
// test makes as a run's.
func runID() string {
	b := make([]byte, 3)
	rand.Read(b)
	return "noisy-" + time.Now().UTC().Format("20060102-150405") + "-" + hex.EncodeToString(b)
}
