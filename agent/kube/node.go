package kube

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Node is what the API server says bounds scheduling on the node, and whether it is Ready.
type Node struct {
	Name                                            string
	AllocatableCPUMilli, AllocatableMemory, MaxPods int64
	// AttachableVolumes is the sum of the allocatable "attachable-volumes-*" keys (in-tree
	// volume plugins' attach limits: one per cloud disk kind), 0 when there are none: unknown.
	AttachableVolumes int64
	// AttachedVolumes counts status.volumesAttached: the volumes attached to the node now.
	AttachedVolumes int64
	Ready           string    // the Ready condition's status: "True", "False" or "Unknown"
	ReadySince      time.Time // its lastTransitionTime
	ReadyReason     string
}

// FromNode is what the agent keeps of n.
func FromNode(n *corev1.Node) Node {
	a := n.Status.Allocatable
	v := Node{
		Name:                n.Name,
		AllocatableCPUMilli: a.Cpu().MilliValue(),
		AllocatableMemory:   a.Memory().Value(),
		MaxPods:             a.Pods().Value(),
		Ready:               string(corev1.ConditionUnknown), // no condition yet: never reported
	}
	v.AttachedVolumes = int64(len(n.Status.VolumesAttached))
	for k, q := range a {
		if strings.HasPrefix(string(k), corev1.ResourceAttachableVolumesPrefix) {
			v.AttachableVolumes += q.Value()
		}
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			v.Ready, v.ReadySince, v.ReadyReason = string(c.Status), c.LastTransitionTime.Time, c.Reason
		}
	}
	return v
}

// WatchNode calls out with the first version of the Node named name it gets (old is the zero
// Node) and then with each version that changes what the agent keeps of it, until ctx is
// done: a Get, then a watch by name (follower). RBAC allows get and watch on nodes. out is
// called from WatchNode's goroutine.
func WatchNode(ctx context.Context, api API, name string, out func(old, new Node), log *slog.Logger) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	bridgeKlog(log)
	var last Node
	have := false
	f := &follower[*corev1.Node]{
		what: "node " + name, name: name, log: log.With("component", "node", "node", name),
		get: func(ctx context.Context) (*corev1.Node, error) {
			n, err := api.GetNode(ctx, name)
			if err != nil {
				return nil, fmt.Errorf("getting node %s: %w", name, err)
			}
			return n, nil
		},
		watch: api.WatchNodes,
		seen: func(n *corev1.Node, _ bool) {
			v := FromNode(n)
			if have && same(v, last) {
				return
			}
			out(last, v) // last is still the zero Node the first time
			last, have = v, true
		},
	}
	f.run(ctx)
}

// same reports whether a and b are the same Node (their times by Equal: the same instant
// decoded twice may differ in location).
func same(a, b Node) bool {
	as, bs := a.ReadySince, b.ReadySince
	a.ReadySince, b.ReadySince = time.Time{}, time.Time{}
	return a == b && as.Equal(bs)
}
