// Package kube reads what the API server says about this node: its pods (an informer restricted
// to the node), its Lease in kube-node-lease (the kubelet's heartbeats) and its Node object
// (allocatable, the Ready condition). Every reader is bounded to the node and never trusts that
// it saw every event: informers relist, and the Lease's and the Node's watches (follower) get
// them afresh after a failure.
package kube

import (
	"fmt"
	"log/slog"
	"sync"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

// userAgent names nodectl in the API server's audit log and metrics.
const userAgent = "nodectl"

// Client is the API server from kubeconfig, or from the in-cluster config (the pod's service
// account) when kubeconfig is "".
func Client(kubeconfig string) (API, error) {
	var (
		cfg *rest.Config
		err error
	)
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	if err != nil {
		where := kubeconfig
		if where == "" {
			where = "the in-cluster config"
		}
		return nil, fmt.Errorf("loading the API server's address from %s: %w", where, err)
	}
	cfg.UserAgent = userAgent
	// One node's agent asks little: a get every few seconds at most, one list per relist.
	cfg.QPS, cfg.Burst = 5, 10
	a, err := newRESTAPI(cfg)
	if err != nil {
		return nil, fmt.Errorf("making the API client for %s: %w", cfg.Host, err)
	}
	return a, nil
}

var klogOnce sync.Once

// bridgeKlog sends client-go's own logging (klog: reflector errors, relists) to log, once per
// process: klog's logger is global, so the first logger given wins.
func bridgeKlog(log *slog.Logger) {
	if log == nil {
		return
	}
	klogOnce.Do(func() { klog.SetSlogLogger(log.With("component", "client-go")) })
}
