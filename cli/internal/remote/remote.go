// Package remote reaches a node of a cluster from wherever the CLI runs, through the API server
// alone: the user's kubeconfig, context and RBAC, the node's agent pod found by its labels,
// and its API through the pods/portforward subresource (the kubelet connects to the agent's
// loopback listener inside the pod), so that no port is opened on the node.
package remote

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nodectl/nodectl/agent/kube"
)

// Flag names, shared by every command that can act on another node.
const (
	FlagNode       = "node"
	FlagKubeconfig = "kubeconfig"
	FlagContext    = "context"
	FlagNamespace  = "agent-namespace"
)

// DefaultNamespace is deploy/base's namespace of the agent's DaemonSet.
const DefaultNamespace = "nodectl-system"

// AgentSelector selects the agent's pods (deploy/base's DaemonSet labels them so).
const AgentSelector = "app.kubernetes.io/name=nodectl-agent"

// Flags say which cluster and node.
type Flags struct {
	Node       string
	Kubeconfig string
	Context    string
	Namespace  string
}

// Register adds the flags to a root command's persistent flags.
func Register(fs *pflag.FlagSet) {
	fs.String(FlagNode, "", "act on this node of the cluster, through the API server (its agent's pod, by port-forward): no port is opened on the node")
	fs.String(FlagKubeconfig, "", "the kubeconfig for --node (default $KUBECONFIG, then ~/.kube/config)")
	fs.String(FlagContext, "", "the kubeconfig context for --node (default: its current context)")
	fs.String(FlagNamespace, DefaultNamespace, "the namespace of the agent's DaemonSet, for --node")
}

// FromCommand reads the flags as cmd sees them (its own, or inherited from the root).
func FromCommand(cmd *cobra.Command) Flags {
	get := func(name string) string {
		if f := cmd.Flags().Lookup(name); f != nil {
			return f.Value.String()
		}
		return ""
	}
	f := Flags{Node: get(FlagNode), Kubeconfig: get(FlagKubeconfig), Context: get(FlagContext), Namespace: get(FlagNamespace)}
	if f.Namespace == "" {
		f.Namespace = DefaultNamespace
	}
	return f
}

// Cluster is a connection to the API server.
type Cluster struct {
	Config    *rest.Config
	Namespace string // the agent's
	// Context is the kubeconfig context in use, for messages.
	Context string
	core    *rest.RESTClient
	authz   *rest.RESTClient
	authn   *rest.RESTClient
	coord   *rest.RESTClient
	rbac    *rest.RESTClient
}

// Connect loads the kubeconfig as kubectl does (--kubeconfig, else $KUBECONFIG, else
// ~/.kube/config; --context, else the current one).
func Connect(f Flags) (*Cluster, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = f.Kubeconfig
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: f.Context})
	raw, err := cc.RawConfig()
	if err != nil {
		return nil, fmt.Errorf("--%s %q: %w", FlagKubeconfig, f.Kubeconfig, err)
	}
	cfg, err := cc.ClientConfig()
	if err != nil {
		if clientcmd.IsEmptyConfig(err) {
			return nil, fmt.Errorf("--%s: no kubeconfig found (give --%s, or set $KUBECONFIG): --%s needs the cluster's API server", FlagNode, FlagKubeconfig, FlagNode)
		}
		if f.Context != "" {
			return nil, fmt.Errorf("--%s %q: %w", FlagContext, f.Context, err)
		}
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.UserAgent = "nodectl"
	cfg.QPS, cfg.Burst = 20, 40
	c := &Cluster{Config: cfg, Namespace: f.Namespace, Context: raw.CurrentContext}
	if f.Context != "" {
		c.Context = f.Context
	}
	cs, err := kube.RESTClients(cfg, corev1.SchemeGroupVersion, authorizationv1.SchemeGroupVersion, authenticationv1.SchemeGroupVersion,
		coordinationv1.SchemeGroupVersion, rbacv1.SchemeGroupVersion)
	if err != nil {
		return nil, fmt.Errorf("the API server %s: %w", cfg.Host, err)
	}
	c.core, c.authz, c.authn, c.coord, c.rbac = cs[0], cs[1], cs[2], cs[3], cs[4]
	return c, nil
}

// Permission is an RBAC right: a verb on a resource (and subresource) in a namespace ("" for
// cluster-scoped or every namespace), of one object when Name is set.
type Permission struct {
	Verb, Resource, Subresource, Namespace string
	Group                                  string // the resource's API group; "" for the core group
	Name                                   string // the object's; "" for any
	// Role is deploy/base's role that grants it (RoleUser when ""), named in a denial.
	Role string
}

// deploy/base's roles a person is bound to, each for one use of --node.
const (
	RoleUser   = "nodectl-user"   // a Role in the agent's namespace: reach the agent
	RoleStress = "nodectl-stress" // a ClusterRole: start runs of pods
	// RoleStressRun is the ClusterRole nodectl binds the run's creator to in each run's
	// namespace (a RoleBinding), and only there: its pods, their logs and input, the namespace.
	RoleStressRun = "nodectl-stress-run"
	RoleTune      = "nodectl-tune" // a ClusterRole: privileged tuner pods on a node
)

func (p Permission) String() string {
	r := resourceName(p)
	if p.Name != "" {
		r += " " + p.Name
	}
	where := "in every namespace"
	if p.Namespace != "" {
		where = "in namespace " + p.Namespace
	}
	return fmt.Sprintf("%s %s %s", p.Verb, r, where)
}

// DeniedError is a permission the user does not have.
type DeniedError struct {
	Permission Permission
	Context    string
	Why        string // what needs it
	Reason     string // the authorizer's, when it gave one
}

func (e *DeniedError) Error() string {
	var grant string
	switch e.Permission.Role {
	case RoleStress:
		grant = "deploy/base's ClusterRole nodectl-stress has what runs of pods need: kubectl create clusterrolebinding NAME --clusterrole nodectl-stress --user YOU"
	case RoleTune:
		grant = "deploy/base's ClusterRole nodectl-tune lets its holders run privileged tuner pods, with nodectl-stress: kubectl create clusterrolebinding NAME --clusterrole nodectl-tune --user YOU"
	case RoleStressRun:
		grant = "nodectl binds you to deploy/base's ClusterRole nodectl-stress-run in each run's namespace: is deploy/base, with that ClusterRole and its admission policies, applied?"
	default:
		grant = fmt.Sprintf("deploy/base's Role nodectl-user in %s has what --node needs: kubectl -n %s create rolebinding NAME --role nodectl-user --user YOU", DefaultNamespace, DefaultNamespace)
	}
	msg := fmt.Sprintf("forbidden: your kubeconfig context %q may not %s, which %s needs; a role granting verb %q on %q does (%s)",
		e.Context, e.Permission, e.Why, e.Permission.Verb, resourceName(e.Permission), grant)
	if e.Reason != "" {
		msg += " (" + e.Reason + ")"
	}
	return msg
}

func resourceName(p Permission) string {
	r := p.Resource
	if p.Group != "" {
		r += "." + p.Group
	}
	if p.Subresource != "" {
		r += "/" + p.Subresource
	}
	return r
}

// Require asks the API server whether the user has each permission (SelfSubjectAccessReview,
// which every authenticated user may create), and names the first one missing. Asking first
// gives a clear error instead of a failed stream upgrade.
func (c *Cluster) Require(ctx context.Context, why string, perms ...Permission) error {
	for _, p := range perms {
		review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: p.Namespace, Verb: p.Verb, Group: p.Group, Resource: p.Resource, Subresource: p.Subresource, Name: p.Name,
			},
		}}
		out := &authorizationv1.SelfSubjectAccessReview{}
		err := c.authz.Post().Resource("selfsubjectaccessreviews").Body(review).Do(ctx).Into(out)
		if err != nil {
			return c.apiError(err, "checking your permissions")
		}
		if !out.Status.Allowed {
			return &DeniedError{Permission: p, Context: c.Context, Why: why, Reason: out.Status.Reason}
		}
	}
	return nil
}

// apiError says what the CLI was doing when the API server failed.
func (c *Cluster) apiError(err error, doing string) error {
	var status apierrors.APIStatus
	if errors.As(err, &status) && apierrors.IsUnauthorized(err) {
		return fmt.Errorf("%s: the API server %s refused your credentials (kubeconfig context %q): %w", doing, c.Config.Host, c.Context, err)
	}
	return fmt.Errorf("%s on the API server %s: %w", doing, c.Config.Host, err)
}

// annotation marks the commands that take --node.
const annotation = "nodectl.io/node"

// Supports marks cmd as one that acts on another node with --node.
func Supports(cmd *cobra.Command) *cobra.Command {
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[annotation] = "true"
	return cmd
}

// Check refuses --node on a command that runs on this machine only, naming those that take it.
func Check(cmd *cobra.Command) error {
	if FromCommand(cmd).Node == "" || cmd.Annotations[annotation] == "true" {
		return nil
	}
	var takers []string
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Annotations[annotation] == "true" {
			takers = append(takers, strings.TrimPrefix(c.CommandPath(), cmd.Root().Name()+" "))
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(cmd.Root())
	return fmt.Errorf("--%s: `%s` acts on this machine only; these take --%s: %s", FlagNode, cmd.CommandPath(), FlagNode, strings.Join(takers, ", "))
}
