package remote

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"

	"github.com/nodectl/nodectl/agent/kube"
	"github.com/nodectl/nodectl/agent/rpc"
	agentv1 "github.com/nodectl/nodectl/api/agent/v1"
)

// The agent's container and the flag that gives its loopback API listener (deploy/base).
const (
	agentContainer = "agent"
	apiListenFlag  = "--api-listen="
)

// listPods is the permission to find the agent's pods.
func (c *Cluster) listPods() Permission {
	return Permission{Verb: "list", Resource: "pods", Namespace: c.Namespace}
}

// portForward is the permissions to reach a pod's port: the WebSocket upgrade is a GET, and
// needs "create" as well since Kubernetes 1.35 (the SPDY one is a POST: "create").
func (c *Cluster) portForward() []Permission {
	p := Permission{Resource: "pods", Subresource: "portforward", Namespace: c.Namespace}
	get, create := p, p
	get.Verb, create.Verb = "get", "create"
	return []Permission{create, get}
}

// AgentPods lists the agent's pods, of one node or (node "") of all, by node name.
func (c *Cluster) AgentPods(ctx context.Context, node string) ([]corev1.Pod, error) {
	if err := c.Require(ctx, "finding the nodes' agents", c.listPods()); err != nil {
		return nil, err
	}
	opts := metav1.ListOptions{LabelSelector: AgentSelector}
	if node != "" {
		opts.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
	}
	list := &corev1.PodList{}
	err := c.core.Get().Namespace(c.Namespace).Resource("pods").VersionedParams(&opts, kube.ParameterCodec).Do(ctx).Into(list)
	if err != nil {
		return nil, c.apiError(err, "listing the agent's pods in namespace "+c.Namespace)
	}
	pods := list.Items
	slices.SortFunc(pods, func(a, b corev1.Pod) int { return strings.Compare(a.Spec.NodeName, b.Spec.NodeName) })
	return pods, nil
}

// AgentPod is the running agent pod of node.
func (c *Cluster) AgentPod(ctx context.Context, node string) (*corev1.Pod, error) {
	pods, err := c.AgentPods(ctx, node)
	if err != nil {
		return nil, err
	}
	var states []string
	for i := range pods {
		if pods[i].Status.Phase == corev1.PodRunning && pods[i].DeletionTimestamp == nil {
			return &pods[i], nil
		}
		states = append(states, pods[i].Name+" "+string(pods[i].Status.Phase))
	}
	if len(states) > 0 {
		return nil, fmt.Errorf("--%s %s: the agent's pod is not running (%s)", FlagNode, node, strings.Join(states, ", "))
	}
	return nil, fmt.Errorf("--%s %s: no nodectl agent pod (%s) on that node in namespace %s: is the node's name right (kubectl get nodes), and is the DaemonSet deployed (kubectl apply -k deploy/base; --%s if it lives elsewhere)?",
		FlagNode, node, AgentSelector, c.Namespace, FlagNamespace)
}

// apiPort is the port of the agent's loopback API listener, from its container's arguments.
func apiPort(pod *corev1.Pod) (int, error) {
	for _, ctr := range pod.Spec.Containers {
		if ctr.Name != agentContainer {
			continue
		}
		for _, a := range append(slices.Clone(ctr.Command), ctr.Args...) {
			if v, ok := strings.CutPrefix(a, apiListenFlag); ok {
				_, port, err := net.SplitHostPort(v)
				if err != nil {
					return 0, fmt.Errorf("agent pod %s/%s: %s%s: %w", pod.Namespace, pod.Name, apiListenFlag, v, err)
				}
				return strconv.Atoi(port)
			}
		}
	}
	return 0, fmt.Errorf("agent pod %s/%s serves no API to port-forward to (its container %q has no %s...): deploy it from this version's deploy/base",
		pod.Namespace, pod.Name, agentContainer, strings.TrimSuffix(apiListenFlag, "="))
}

// Forward forwards a local loopback port to the pod's port through the API server, until
// ctx ends or the returned stop is called. It returns the local address.
func (c *Cluster) Forward(ctx context.Context, pod *corev1.Pod, port int) (string, func(), error) {
	if err := c.Require(ctx, "reaching the agent", c.portForward()...); err != nil {
		return "", nil, err
	}
	url := c.core.Post().Namespace(pod.Namespace).Resource("pods").Name(pod.Name).SubResource("portforward").URL()
	transport, upgrader, err := spdy.RoundTripperFor(c.Config)
	if err != nil {
		return "", nil, err
	}
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, url)
	// WebSockets first, as kubectl does: SPDY is on its way out of the API server.
	ws, err := portforward.NewSPDYOverWebsocketDialer(url, c.Config)
	if err != nil {
		return "", nil, err
	}
	dialer = portforward.NewFallbackDialer(ws, dialer, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	fctx, cancel := context.WithCancel(ctx)
	ready := make(chan struct{})
	fw, err := portforward.NewOnAddressesWithContext(fctx, dialer, []string{"127.0.0.1"}, []string{"0:" + strconv.Itoa(port)}, ready, io.Discard, io.Discard)
	if err != nil {
		cancel()
		return "", nil, err
	}
	failed := make(chan error, 1)
	go func() { failed <- fw.ForwardPorts() }()
	select {
	case <-ready:
	case err := <-failed:
		cancel()
		return "", nil, fmt.Errorf("port-forward to %s/%s: %w", pod.Namespace, pod.Name, err)
	case <-ctx.Done():
		cancel()
		return "", nil, ctx.Err()
	}
	ports, err := fw.GetPorts()
	if err != nil || len(ports) != 1 {
		cancel()
		return "", nil, fmt.Errorf("port-forward to %s/%s: no local port (%v)", pod.Namespace, pod.Name, err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(int(ports[0].Local))), cancel, nil
}

// DialAgent connects to node's agent through a port-forward to its pod.
func (c *Cluster) DialAgent(ctx context.Context, node string) (agentv1.AgentClient, io.Closer, error) {
	pod, err := c.AgentPod(ctx, node)
	if err != nil {
		return nil, nil, err
	}
	return c.DialPod(ctx, pod)
}

// DialPod connects to the agent of pod through a port-forward.
func (c *Cluster) DialPod(ctx context.Context, pod *corev1.Pod) (agentv1.AgentClient, io.Closer, error) {
	port, err := apiPort(pod)
	if err != nil {
		return nil, nil, err
	}
	// The forward lives as long as the connection, not as the call that made it.
	addr, stop, err := c.Forward(context.WithoutCancel(ctx), pod, port)
	if err != nil {
		return nil, nil, err
	}
	client, conn, err := rpc.Dial(ctx, rpc.DialConfig{Loopback: addr})
	if err != nil {
		stop()
		return nil, nil, fmt.Errorf("the agent of node %s (pod %s/%s, through port-forward): %w", pod.Spec.NodeName, pod.Namespace, pod.Name, err)
	}
	return client, closers{conn, closerFunc(stop)}, nil
}

type closerFunc func()

func (f closerFunc) Close() error { f(); return nil }

// closers closes each in turn.
type closers []io.Closer

func (cs closers) Close() error {
	var first error
	for _, c := range cs {
		if err := c.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
