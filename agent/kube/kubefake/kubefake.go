// Package kubefake is kube.API over client-go's fake clientset, for tests of the readers' logic
// and of their users. Only tests import it, so the fake never links into nodectl.
package kubefake

import (
	"context"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
)

// Clientset is the API over a fake clientset. Embedding the fake keeps its reactors, its
// actions and its IsWatchListSemanticsUnSupported (the informer lists instead of streaming the
// first list, which the fake cannot).
type Clientset struct{ *fake.Clientset }

// New is a fake API server holding objs.
func New(objs ...runtime.Object) Clientset { return Clientset{fake.NewClientset(objs...)} }

func (c Clientset) ListPods(ctx context.Context, o metav1.ListOptions) (*corev1.PodList, error) {
	return c.CoreV1().Pods(metav1.NamespaceAll).List(ctx, o)
}

func (c Clientset) WatchPods(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	return c.CoreV1().Pods(metav1.NamespaceAll).Watch(ctx, o)
}

func (c Clientset) GetNode(ctx context.Context, name string) (*corev1.Node, error) {
	return c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
}

func (c Clientset) WatchNodes(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	return c.CoreV1().Nodes().Watch(ctx, o)
}

func (c Clientset) GetLease(ctx context.Context, ns, name string) (*coordinationv1.Lease, error) {
	return c.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
}

func (c Clientset) WatchLeases(ctx context.Context, ns string, o metav1.ListOptions) (watch.Interface, error) {
	return c.CoordinationV1().Leases(ns).Watch(ctx, o)
}
