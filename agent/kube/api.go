package kube

import (
	"context"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// API is what the agent asks the API server: the pods (of every namespace: the callers bound
// them with a field selector), the Node, and a Lease (the watches too, by field selector). Its production implementation (Client)
// links two API groups' types only: client-go's clientset registers every group's at init,
// tens of MB of binary and ~9 MB of the agent's resident memory.
type API interface {
	ListPods(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error)
	WatchPods(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	GetNode(ctx context.Context, name string) (*corev1.Node, error)
	WatchNodes(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	GetLease(ctx context.Context, namespace, name string) (*coordinationv1.Lease, error)
	WatchLeases(ctx context.Context, namespace string, opts metav1.ListOptions) (watch.Interface, error)
}

// scheme holds the types the agent reads and the CLI's --node sends (cli/internal/remote:
// SelfSubjectAccessReviews, SelfSubjectReviews, a run's RoleBinding), and meta/v1's options,
// Status and watch events.
var (
	scheme = runtime.NewScheme()
	codecs = serializer.NewCodecFactory(scheme)
	// ParameterCodec encodes the options of a request of a RESTClients client.
	ParameterCodec = runtime.NewParameterCodec(scheme)
)

func init() {
	utilruntime.Must(corev1.AddToScheme(scheme))
	utilruntime.Must(coordinationv1.AddToScheme(scheme))
	utilruntime.Must(authorizationv1.AddToScheme(scheme))
	utilruntime.Must(authenticationv1.AddToScheme(scheme))
	utilruntime.Must(rbacv1.AddToScheme(scheme))
	// The unversioned "v1" of a Status in an error response or a watch's Error event.
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
}

// restAPI is API over one REST client per API group, sharing a transport and a rate limiter.
type restAPI struct {
	core, coordination *rest.RESTClient
}

// newRESTAPI makes the two groups' clients from cfg.
func newRESTAPI(cfg *rest.Config) (*restAPI, error) {
	cs, err := RESTClients(cfg, corev1.SchemeGroupVersion, coordinationv1.SchemeGroupVersion)
	if err != nil {
		return nil, err
	}
	return &restAPI{core: cs[0], coordination: cs[1]}, nil
}

// RESTClients makes one REST client per API group from cfg, as client-go's typed clients do,
// with this package's scheme (core/v1, coordination/v1, authorization/v1), sharing a
// transport and one rate limiter, as one clientset does.
func RESTClients(cfg *rest.Config, groups ...schema.GroupVersion) ([]*rest.RESTClient, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	shared := *cfg
	if shared.RateLimiter == nil && shared.QPS > 0 {
		shared.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(shared.QPS, shared.Burst)
	}
	out := make([]*rest.RESTClient, 0, len(groups))
	for _, gv := range groups {
		c := shared
		c.GroupVersion = &gv
		c.APIPath = "/apis"
		if gv.Group == "" {
			c.APIPath = "/api"
		}
		c.NegotiatedSerializer = codecs.WithoutConversion()
		rc, err := rest.RESTClientForConfigAndClient(&c, hc)
		if err != nil {
			return nil, err
		}
		out = append(out, rc)
	}
	return out, nil
}

// timeout is a list's or watch's server-side timeout as the client's own, as the typed
// clients set it.
func timeout(opts metav1.ListOptions) time.Duration {
	if opts.TimeoutSeconds == nil {
		return 0
	}
	return time.Duration(*opts.TimeoutSeconds) * time.Second
}

func (a *restAPI) ListPods(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error) {
	l := &corev1.PodList{}
	// Protobuf, as the typed clients prefer for built-in types: less to decode than JSON.
	err := a.core.Get().UseProtobufAsDefault().Resource("pods").
		VersionedParams(&opts, ParameterCodec).Timeout(timeout(opts)).Do(ctx).Into(l)
	return l, err
}

func (a *restAPI) WatchPods(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return a.core.Get().UseProtobufAsDefault().Resource("pods").
		VersionedParams(&opts, ParameterCodec).Timeout(timeout(opts)).Watch(ctx)
}

func (a *restAPI) GetNode(ctx context.Context, name string) (*corev1.Node, error) {
	n := &corev1.Node{}
	err := a.core.Get().UseProtobufAsDefault().Resource("nodes").Name(name).
		VersionedParams(&metav1.GetOptions{}, ParameterCodec).Do(ctx).Into(n)
	return n, err
}

func (a *restAPI) WatchNodes(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return a.core.Get().UseProtobufAsDefault().Resource("nodes").
		VersionedParams(&opts, ParameterCodec).Timeout(timeout(opts)).Watch(ctx)
}

func (a *restAPI) GetLease(ctx context.Context, namespace, name string) (*coordinationv1.Lease, error) {
	l := &coordinationv1.Lease{}
	err := a.coordination.Get().UseProtobufAsDefault().Namespace(namespace).Resource("leases").Name(name).
		VersionedParams(&metav1.GetOptions{}, ParameterCodec).Do(ctx).Into(l)
	return l, err
}

func (a *restAPI) WatchLeases(ctx context.Context, namespace string, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return a.coordination.Get().UseProtobufAsDefault().Namespace(namespace).Resource("leases").
		VersionedParams(&opts, ParameterCodec).Timeout(timeout(opts)).Watch(ctx)
}
