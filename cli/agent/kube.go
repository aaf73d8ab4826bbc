package agent

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/spf13/pflag"

	"github.com/nodectl/nodectl/agent"
	"github.com/nodectl/nodectl/agent/kube"
)

// kubeFlags are how the agent reaches Kubernetes: the API server (a kubeconfig, or the pod's
// service account), this node's name and the container runtime's CRI socket.
type kubeFlags struct {
	kubeconfig, node, criSocket string
}

// criSockets are the runtimes' usual CRI sockets, tried in turn when --cri-socket is not given.
var criSockets = []string{"/run/containerd/containerd.sock", "/run/crio/crio.sock", "/var/run/containerd/containerd.sock", "/var/run/crio/crio.sock"}

func (k *kubeFlags) register(f *pflag.FlagSet) {
	f.StringVar(&k.kubeconfig, "kubeconfig", "", "reach the API server with this kubeconfig; empty: the pod's service account when the agent runs in a pod (KUBERNETES_SERVICE_HOST set), else no Kubernetes")
	f.StringVar(&k.node, "node-name", os.Getenv("NODE_NAME"), "this node's name in the cluster (default $NODE_NAME, set from the DaemonSet's downward API)")
	f.StringVar(&k.criSocket, "cri-socket", "", "the container runtime's CRI socket, to name containers with their runtime handler; default: the first of "+fmt.Sprint(criSockets)+" that exists; none: no CRI, containers named from their pods' statuses (the DaemonSet's: the CRI is root on the node)")
}

// kube is the agent's Kubernetes configuration, nil off Kubernetes.
func (k *kubeFlags) kube(log *slog.Logger) (*agent.Kube, error) {
	inCluster := os.Getenv("KUBERNETES_SERVICE_HOST") != ""
	if k.kubeconfig == "" && !inCluster {
		return nil, nil
	}
	if k.node == "" {
		return nil, fmt.Errorf("--node-name: required on Kubernetes (or NODE_NAME from the downward API): the agent follows this node's pods and Lease")
	}
	if _, err := os.Stat(k.kubeconfig); k.kubeconfig != "" && err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", k.kubeconfig, err)
	}
	sock := k.criSocket
	switch sock {
	case "":
		for _, s := range criSockets {
			if fi, err := os.Stat(s); err == nil && fi.Mode()&os.ModeSocket != 0 {
				sock = s
				break
			}
		}
		if sock == "" {
			log.Warn("no CRI socket found: pods are named from the API server and cgroup paths, without container names", "tried", criSockets)
		}
	case "none":
		sock = ""
	default:
		if fi, err := os.Stat(sock); err != nil || fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("--cri-socket %s: not a socket", sock)
		}
	}
	cs, err := kube.Client(k.kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %q: %w", k.kubeconfig, err)
	}
	return &agent.Kube{Client: cs, Node: k.node, CRISocket: sock}, nil
}
