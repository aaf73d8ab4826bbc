package remote

import (
	"context"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
