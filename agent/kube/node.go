package kube

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// defaultPoll is PollReady's interval when given none: the node controller's own monitor
// period is 5 s, and a Ready flap shows anyway as a new transition time.
const defaultPoll = 10 * time.Second

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

// GetNode gets the Node named name (RBAC allows get on nodes, not list or watch).
func GetNode(ctx context.Context, api API, name string) (Node, error) {
	ctx, cancel := context.WithTimeout(ctx, getTimeout)
	defer cancel()
	n, err := api.GetNode(ctx, name)
	if err != nil {
		return Node{}, fmt.Errorf("getting node %s: %w", name, err)
	}
	return FromNode(n), nil
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

// PollReady gets the Node every interval until ctx is done and calls out with the first Node
// got (old is the zero Node) and then on each transition of its Ready condition. A transition
// is a new status or a new lastTransitionTime: a flap between two polls (True, False, True)
// still shows as a new transition time. Failed gets are logged and retried at the next tick.
// out is called from PollReady's goroutine.
func PollReady(ctx context.Context, api API, name string, every time.Duration, out func(old, new Node), log *slog.Logger) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	bridgeKlog(log)
	log = log.With("component", "node", "node", name)
	var (
		last   Node
		have   bool
		failed int
	)
	if every <= 0 {
		every = defaultPoll
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		n, err := GetNode(ctx, api, name)
		switch {
		case err != nil && ctx.Err() == nil:
			failed++
			if failed == 1 || failed%10 == 0 { // a long outage logs now and then, not each tick
				log.Warn("polling the node's Ready condition", "err", err, "failures", failed)
			}
		case err == nil:
			failed = 0
			if !have || n.Ready != last.Ready || !n.ReadySince.Equal(last.ReadySince) {
				out(last, n) // last is still the zero Node the first time
			}
			last, have = n, true
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
