package remote

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/nodectl/nodectl/agent/kube"
)

// The core objects a stress run through the API server makes and removes: its namespace and
// its pods. Errors say what was being done.

// CreateNamespace creates ns.
func (c *Cluster) CreateNamespace(ctx context.Context, ns *corev1.Namespace) error {
	err := c.core.Post().Resource("namespaces").Body(ns).Do(ctx).Error()
	if err != nil {
		return c.apiError(err, "creating namespace "+ns.Name)
	}
	return nil
}

// ListNamespaces lists the namespaces matching a label selector.
func (c *Cluster) ListNamespaces(ctx context.Context, selector string) ([]corev1.Namespace, error) {
	list := &corev1.NamespaceList{}
	opts := metav1.ListOptions{LabelSelector: selector}
	if err := c.core.Get().Resource("namespaces").VersionedParams(&opts, kube.ParameterCodec).Do(ctx).Into(list); err != nil {
		return nil, c.apiError(err, "listing namespaces "+selector)
	}
	return list.Items, nil
}

// GetNamespace reads a namespace.
func (c *Cluster) GetNamespace(ctx context.Context, name string) (*corev1.Namespace, error) {
	ns := &corev1.Namespace{}
	if err := c.core.Get().Resource("namespaces").Name(name).Do(ctx).Into(ns); err != nil {
		return nil, err
	}
	return ns, nil
}

// WhoAmI is the user the API server takes the kubeconfig's credentials for (a
// SelfSubjectReview, which every authenticated user may create).
func (c *Cluster) WhoAmI(ctx context.Context) (authenticationv1.UserInfo, error) {
	out := &authenticationv1.SelfSubjectReview{}
	if err := c.authn.Post().Resource("selfsubjectreviews").Body(&authenticationv1.SelfSubjectReview{}).Do(ctx).Into(out); err != nil {
		return authenticationv1.UserInfo{}, c.apiError(err, "asking who your credentials are")
	}
	if out.Status.UserInfo.Username == "" {
		return authenticationv1.UserInfo{}, fmt.Errorf("the API server %s says your credentials have no user name", c.Config.Host)
	}
	return out.Status.UserInfo, nil
}

// CreateRoleBinding creates rb in its namespace.
func (c *Cluster) CreateRoleBinding(ctx context.Context, rb *rbacv1.RoleBinding) error {
	err := c.rbac.Post().Namespace(rb.Namespace).Resource("rolebindings").Body(rb).Do(ctx).Error()
	if err != nil {
		return c.apiError(err, "creating role binding "+rb.Namespace+"/"+rb.Name)
	}
	return nil
}

// DeleteNamespace asks for the namespace's deletion (its controller removes what is left).
func (c *Cluster) DeleteNamespace(ctx context.Context, name string) error {
	return c.core.Delete().Resource("namespaces").Name(name).Do(ctx).Error()
}

// CreatePod creates pod in its namespace.
func (c *Cluster) CreatePod(ctx context.Context, pod *corev1.Pod) error {
	err := c.core.Post().Namespace(pod.Namespace).Resource("pods").Body(pod).Do(ctx).Error()
	if err != nil {
		return c.apiError(err, "creating pod "+pod.Namespace+"/"+pod.Name)
	}
	return nil
}

// ListPods lists the pods of a namespace.
func (c *Cluster) ListPods(ctx context.Context, namespace string) ([]corev1.Pod, error) {
	list := &corev1.PodList{}
	if err := c.core.Get().Namespace(namespace).Resource("pods").Do(ctx).Into(list); err != nil {
		return nil, c.apiError(err, "listing the pods of namespace "+namespace)
	}
	return list.Items, nil
}

// DeletePod deletes a pod with the grace period given (0: at once).
func (c *Cluster) DeletePod(ctx context.Context, namespace, name string, grace int64) error {
	opts := &metav1.DeleteOptions{GracePeriodSeconds: &grace}
	return c.core.Delete().Namespace(namespace).Resource("pods").Name(name).Body(opts).Do(ctx).Error()
}

// Node reads a node.
func (c *Cluster) Node(ctx context.Context, name string) (*corev1.Node, error) {
	n := &corev1.Node{}
	if err := c.core.Get().Resource("nodes").Name(name).Do(ctx).Into(n); err != nil {
		return nil, c.apiError(err, "reading node "+name)
	}
	return n, nil
}

// NodeCPUs is the node's CPU capacity, whole CPUs.
func (c *Cluster) NodeCPUs(ctx context.Context, name string) (int, error) {
	n, err := c.Node(ctx, name)
	if err != nil {
		return 0, err
	}
	cpu := n.Status.Capacity.Cpu()
	return max(1, int(cpu.Value())), nil
}

// NodeLease reads the node's heartbeat Lease, which its kubelet renews.
func (c *Cluster) NodeLease(ctx context.Context, name string) (*coordinationv1.Lease, error) {
	l := &coordinationv1.Lease{}
	if err := c.coord.Get().Namespace(corev1.NamespaceNodeLease).Resource("leases").Name(name).Do(ctx).Into(l); err != nil {
		return nil, c.apiError(err, "reading the Lease of node "+name)
	}
	return l, nil
}

// PodLog is the log of a pod's container so far; with since set, from that time on (the
// kubelet's resolution is the second).
func (c *Cluster) PodLog(ctx context.Context, namespace, pod, container string, since time.Time) ([]byte, error) {
	req := c.core.Get().Namespace(namespace).Resource("pods").Name(pod).SubResource("log").Param("container", container)
	if !since.IsZero() {
		req = req.Param("sinceTime", since.UTC().Format(time.RFC3339))
	}
	b, err := req.Do(ctx).Raw()
	if err != nil {
		return nil, c.apiError(err, "reading the log of "+namespace+"/"+pod)
	}
	return b, nil
}

// Attach streams stdin to the standard input of a pod's container (started with stdin open)
// and its standard output from now on to stdout, through the API server, until ctx ends or the
// container's output ends. The caller checks AttachPermissions first.
func (c *Cluster) Attach(ctx context.Context, namespace, pod, container string, stdin io.Reader, stdout io.Writer) error {
	opts := &corev1.PodAttachOptions{Container: container, Stdin: true, Stdout: true}
	u := c.core.Post().Namespace(namespace).Resource("pods").Name(pod).SubResource("attach").VersionedParams(opts, kube.ParameterCodec).URL()
	spdyExec, err := remotecommand.NewSPDYExecutor(c.Config, http.MethodPost, u)
	if err != nil {
		return err
	}
	// WebSockets first, as kubectl does, SPDY when the server cannot upgrade to them.
	wsExec, err := remotecommand.NewWebSocketExecutor(c.Config, http.MethodGet, u.String())
	if err != nil {
		return err
	}
	exec, err := remotecommand.NewFallbackExecutor(wsExec, spdyExec, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return err
	}
	if err := exec.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: stdin, Stdout: stdout}); err != nil {
		return c.apiError(err, "attaching to "+namespace+"/"+pod)
	}
	return nil
}

// AttachPermissions are what Attach needs: create for SPDY, get for WebSockets, as for
// port-forward.
func AttachPermissions(namespace string) []Permission {
	return []Permission{{Verb: "create", Resource: "pods", Subresource: "attach", Namespace: namespace, Role: RoleStressRun},
		{Verb: "get", Resource: "pods", Subresource: "attach", Namespace: namespace, Role: RoleStressRun}}
}
