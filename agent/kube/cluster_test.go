package kube

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/nodectl/nodectl/testcluster"
)

// TestAgainstARealAPIServer runs the readers against etcd and kube-apiserver, as the agent's
// least-privileged ServiceAccount (pods list/watch, nodes get/watch, leases get/watch): a Lease
// created and renewed by hand, pods bound to the node and to another, the Node's Ready
// condition changed.
func TestAgainstARealAPIServer(t *testing.T) {
	if os.Getenv(testcluster.EnvVar) != "1" {
		t.Skipf("starts etcd and kube-apiserver: set %s=1 (make test-cluster)", testcluster.EnvVar)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cp, err := testcluster.StartControlPlane(ctx, t.TempDir(), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	// The admin writes with client-go's clientset; the agent reads through Client alone.
	admin := cp.Client
	const node = "it-node"
	agent := agentClient(ctx, t, cp, admin)

	// The node, Ready.
	n, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	setReady := func(status corev1.ConditionStatus, reason string) {
		t.Helper()
		n.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("4Gi"), corev1.ResourcePods: resource.MustParse("110")}
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, Reason: reason,
			LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
		if n, err = admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setReady(corev1.ConditionTrue, "KubeletReady")
	type change struct{ old, new Node }
	ready := make(chan change, 8)
	go WatchNode(ctx, agent, node, func(o, n Node) { ready <- change{o, n} }, log)
	nextReady := func(want string) Node {
		t.Helper()
		select {
		case c := <-ready:
			if c.new.Ready != want {
				t.Fatalf("Ready %s -> %s, want %s", c.old.Ready, c.new.Ready, want)
			}
			return c.new
		case <-time.After(20 * time.Second):
			t.Fatalf("no Ready transition to %s", want)
			return Node{}
		}
	}
	if first := nextReady("True"); first.AllocatableCPUMilli != 2000 || first.MaxPods != 110 || first.ReadyReason != "KubeletReady" {
		t.Errorf("node %+v", first)
	}
	time.Sleep(time.Second) // a transition time one second on: the API keeps seconds
	setReady(corev1.ConditionFalse, "KubeletNotReady")
	nextReady("False")

	// The Lease, renewed three times.
	leases := admin.CoordinationV1().Leases(NodeLeaseNamespace)
	l, err := leases.Create(ctx, liveLease(node, time.Now()), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	renewals := make(chan Renewal, 16)
	go WatchLease(ctx, agent, node, func(r Renewal) { renewals <- r }, log)
	var prev time.Time
	for i := range 4 {
		if i > 0 {
			time.Sleep(300 * time.Millisecond)
			l.Spec.RenewTime = ptrMicro(time.Now())
			if l, err = leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case r := <-renewals:
			if !r.RenewTime.Equal(l.Spec.RenewTime.Time) || r.Holder != node || r.LeaseDuration != 40*time.Second {
				t.Fatalf("renewal %d: %+v, want renewTime %v", i, r, l.Spec.RenewTime.Time)
			}
			if i > 0 && r.Gap != r.RenewTime.Sub(prev) {
				t.Errorf("renewal %d: gap %v, want %v", i, r.Gap, r.RenewTime.Sub(prev))
			}
			// The same clock wrote and read it: the delivery delay alone.
			if r.Lag < 0 || r.Lag > 5*time.Second {
				t.Errorf("renewal %d: lag %v", i, r.Lag)
			}
			t.Logf("renewal %d: gap %v lag %v", i, r.Gap, r.Lag)
			prev = r.RenewTime
		case <-time.After(20 * time.Second):
			t.Fatalf("renewal %d not reported", i)
		}
	}

	// Pods: one bound to the node, one to another; the informer sees the first only.
	if err := cp.WaitServiceAccount(ctx, "default"); err != nil {
		t.Fatal(err)
	}
	pods := NewPods(agent, node, log)
	pctx, pcancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); pods.Run(pctx) }()
	defer func() { pcancel(); <-done }()
	mine := itPod("web", node, res(rl{cpu: "100m", mem: "64Mi"}, rl{cpu: "200m", mem: "64Mi"}))
	if mine, err = admin.CoreV1().Pods("default").Create(ctx, mine, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	other, err := admin.CoreV1().Pods("default").Create(ctx, itPod("elsewhere", "other-node", res(nil, nil)), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the pods' first list", pods.Synced)
	waitFor(t, "the node's pod", func() bool { _, ok := pods.ByUID(string(mine.UID)); return ok })
	p, _ := pods.ByUID(string(mine.UID))
	if p.Name != "web" || p.Namespace != "default" || p.QoS != Burstable || p.CPURequestMilli != 100 || p.CPULimitMilli != 200 ||
		p.MemoryRequest != 64<<20 || p.OwnerKind != "" || p.Phase != "Pending" || len(p.Containers) != 1 {
		t.Errorf("pod %+v", p)
	}
	if _, ok := pods.ByUID(string(other.UID)); ok {
		t.Error("another node's pod was listed")
	}
	if err := admin.CoreV1().Pods("default").Delete(ctx, "web", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the pod's deletion", func() bool { _, ok := pods.ByUID(string(mine.UID)); return !ok })

	// The API server's errors decode with the package's own scheme.
	if _, err := agent.GetLease(ctx, NodeLeaseNamespace, "no-such-node"); !apierrors.IsNotFound(err) {
		t.Errorf("getting a missing lease: %v, want NotFound", err)
	}
	if _, err := agent.GetNode(ctx, "no-such-node"); !apierrors.IsNotFound(err) {
		t.Errorf("getting a missing node: %v, want NotFound", err)
	}
}

func ptrMicro(t time.Time) *metav1.MicroTime { m := metav1.NewMicroTime(t); return &m }

func liveLease(node string, renew time.Time) *coordinationv1.Lease {
	l := nodeLease(node, renew)
	l.ResourceVersion = ""
	return l
}

func itPod(name, node string, r corev1.ResourceRequirements) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "c", Image: "registry.nodectl.test/none:1", Resources: r}},
		},
	}
}

// agentClient is the production API (Client, from a kubeconfig) acting as a ServiceAccount
// with the agent's RBAC and nothing else, authenticated by a token of its own.
func agentClient(ctx context.Context, t *testing.T, cp *testcluster.ControlPlane, admin kubernetes.Interface) API {
	t.Helper()
	cfg := agentConfig(ctx, t, cp, admin)
	kc := clientcmdapi.NewConfig()
	kc.Clusters["it"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["agent"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["it"] = &clientcmdapi.Context{Cluster: "it", AuthInfo: "agent"}
	kc.CurrentContext = "it"
	path := filepath.Join(t.TempDir(), "agent.kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	api, err := Client(path)
	if err != nil {
		t.Fatal(err)
	}
	return api
}

// agentConfig is the REST config of a ServiceAccount with the agent's RBAC and nothing else.
func agentConfig(ctx context.Context, t *testing.T, cp *testcluster.ControlPlane, admin kubernetes.Interface) *rest.Config {
	t.Helper()
	const ns, sa = "default", "nodectl-it"
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "watch"}},
	}
	leaseRules := []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "watch"}}}
	subject := []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: ns}}
	rbac := admin.RbacV1()
	for _, err := range []error{
		ignore(admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})),
		ignore(rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: sa}, Rules: rules}, metav1.CreateOptions{})),
		ignore(rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: sa}, Subjects: subject,
			RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: sa}}, metav1.CreateOptions{})),
		ignore(rbac.Roles(NodeLeaseNamespace).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: sa}, Rules: leaseRules}, metav1.CreateOptions{})),
		ignore(rbac.RoleBindings(NodeLeaseNamespace).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: sa}, Subjects: subject,
			RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: sa}}, metav1.CreateOptions{})),
	} {
		if err != nil {
			t.Fatalf("setting up the agent's RBAC: %v", err)
		}
	}
	cfg, err := cp.ServiceAccountConfig(ctx, ns, sa)
	if err != nil {
		t.Fatal(err)
	}
	// The rules hold: no list of leases.
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoordinationV1().Leases(NodeLeaseNamespace).List(ctx, metav1.ListOptions{}); err == nil {
		t.Fatal("the agent's ServiceAccount may list leases: the test's RBAC is wrong")
	}
	return cfg
}

func ignore[T any](_ T, err error) error { return err }
