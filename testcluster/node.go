package testcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	// NodeName is the kubelet's node.
	NodeName = "nodectl-test"
	// CgroupRoot is the kubelet's cgroupRoot: pods live in CgroupRoot/kubepods/<qos>/pod<uid>,
	// containerd, its shims and the kubelet in CgroupRoot/containerd and CgroupRoot/kubelet.
	CgroupRoot = "/nodectl/testcluster"
	// BridgeName is the CNI bridge the pods' veths hang on (not cni0: a host may run a real
	// cluster's).
	BridgeName = "nodectl-tc0"
	// cniNetwork names the CNI network; libcni keeps its results as <network>-<id>-<if> files.
	cniNetwork = "nodectl-testcluster"
	podSubnet  = "10.244.77.0/24"
	cniCache   = "/var/lib/cni/results"
	// RuntimeClassGVisor and RuntimeClassRunc are the RuntimeClasses StartNode creates.
	RuntimeClassGVisor = "gvisor"
	RuntimeClassRunc   = "runc"
	// MaxPods is the kubelet's maxPods: past it the kubelet refuses pods at admission.
	MaxPods = 16
)

// Node is a real kubelet registered as NodeName, on a private containerd with runtime handlers
// runc and runsc (gVisor through the runc v2 shim: this Debian has no containerd-shim-runsc-v1).
type Node struct {
	Name string
	// ContainerdSocket is the private containerd's socket (CRI and containerd API).
	ContainerdSocket string
	// RunscPlatform is the gVisor platform the runsc handler uses.
	RunscPlatform string
	// IP is the node's InternalIP, where its kubelet serves.
	IP net.IP

	cp         *ControlPlane
	dir        string
	log        *slog.Logger
	containerd *proc
	kubelet    *proc
	sysctls    map[string][]byte // changedSysctls before the node changed them
	stopOnce   sync.Once
}

// StartNode starts containerd and the kubelet with their state in dir, imports the pause
// image, creates the RuntimeClasses and waits until the node is Ready and has renewed its
// Lease. Leftovers of a killed earlier run in dir are removed first. A failed start undoes
// what it did.
func StartNode(ctx context.Context, cp *ControlPlane, dir string, log *slog.Logger) (_ *Node, err error) {
	kubeletBin := filepath.Join(KubeDir(), "kubelet")
	if _, err := os.Stat(kubeletBin); err != nil {
		return nil, fmt.Errorf("finding the kubelet: %w (build it with testcluster/build-kube.sh)", err)
	}
	for _, b := range []string{"containerd", "containerd-shim-runc-v2", "ctr", "runc", "runsc"} {
		if _, err := exec.LookPath(b); err != nil {
			return nil, fmt.Errorf("finding %s: %w (make deps)", b, err)
		}
	}
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		return nil, fmt.Errorf("finding the CNI plugins: %w (apt-get install containernetworking-plugins, or make deps-cluster)", err)
	}
	log = log.With("component", "testcluster")
	// The kubelet keeps some files outside its root directory: one kubelet per host.
	if c, err := net.Dial("unix", filepath.Join(kubeletDevicePlugins, "kubelet.sock")); err == nil {
		c.Close()
		return nil, errors.New("another kubelet runs on this host (it listens on " + kubeletDevicePlugins + "/kubelet.sock)")
	}
	if err := Clean(dir, log); err != nil {
		return nil, fmt.Errorf("removing an earlier run's leftovers: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("making the node's directory: %w", err)
	}
	n := &Node{
		Name:             NodeName,
		ContainerdSocket: filepath.Join(dir, "containerd.sock"),
		RunscPlatform:    runscPlatform(),
		cp:               cp,
		dir:              dir,
		log:              log,
	}
	defer func() {
		if err != nil {
			n.Stop()
		}
	}()
	n.sysctls = readSysctls()
	if err := makeCgroupRoot(); err != nil {
		return nil, err
	}

	start := time.Now()
	pauseTar := filepath.Join(dir, "pause.tar")
	if err := buildPauseImage(ctx, dir, pauseTar); err != nil {
		return nil, err
	}
	if err := n.writeConfigs(); err != nil {
		return nil, err
	}
	if n.containerd, err = startProc("containerd", dir, "containerd", []string{"--config", filepath.Join(dir, "containerd.toml")}, log); err != nil {
		return nil, err
	}
	if err := poll(ctx, 100*time.Millisecond, "containerd", n.containerd, func() error {
		return exec.CommandContext(ctx, "ctr", "--address", n.ContainerdSocket, "version").Run()
	}); err != nil {
		return nil, err
	}
	if err := n.ImportImage(ctx, pauseTar); err != nil {
		return nil, err
	}
	log.Info("containerd ready", "socket", n.ContainerdSocket, "took", time.Since(start).Round(time.Millisecond))

	if err := n.authorizeKubelet(ctx); err != nil {
		return nil, err
	}
	start = time.Now()
	if n.kubelet, err = startProc("kubelet", dir, kubeletBin, []string{
		"--config=" + filepath.Join(dir, "kubelet.yaml"),
		"--kubeconfig=" + filepath.Join(dir, "kubelet.kubeconfig"),
		"--root-dir=" + filepath.Join(dir, "kubelet"),
		"--hostname-override=" + NodeName,
		"--node-ip=" + n.IP.String(),
	}, log); err != nil {
		return nil, err
	}
	if err := joinCgroup(n.kubelet.cmd.Process.Pid, CgroupRoot+"/kubelet"); err != nil {
		return nil, err
	}
	if err := n.createRuntimeClasses(ctx); err != nil {
		return nil, err
	}
	if err := n.waitReady(ctx); err != nil {
		return nil, err
	}
	log.Info("node ready", "node", NodeName, "took", time.Since(start).Round(time.Millisecond))
	return n, nil
}

// writeConfigs writes containerd's, the CNI's, the runsc wrapper's and the kubelet's files.
func (n *Node) writeConfigs() error {
	d := n.dir
	cniDir := filepath.Join(d, "cni")
	if err := os.MkdirAll(cniDir, 0o755); err != nil {
		return fmt.Errorf("making the CNI config directory: %w", err)
	}
	// isGateway gives the bridge an address so the host (the kubelet's probes) reaches pods;
	// no ipMasq, so the plugin adds no iptables rules. It turns on ip_forward: Stop restores it.
	conflist := fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": %q,
  "plugins": [{
    "type": "bridge",
    "bridge": %q,
    "isGateway": true,
    "ipMasq": false,
    "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "dataDir": %q}
  }]
}
`, cniNetwork, BridgeName, podSubnet, filepath.Join(d, "cni-ipam"))
	// runsc through the runc shim: the shim calls BinaryName with runc's command line, which
	// runsc accepts; the wrapper adds the platform and no network (this runsc fails to take
	// over a pod's network namespace through the runc shim: "cannot run with network enabled
	// in root network namespace"; the test pods need none). runsc reads the CRI annotations
	// and would start a pod's containers inside the pause container's sandbox, which hangs
	// through the runc shim (that is containerd-shim-runsc-v1's job): the wrapper marks every
	// container a sandbox of its own, so a runsc pod has one gVisor sandbox per container, all
	// in the pod's cgroup.
	runscWrapper := fmt.Sprintf(`#!/bin/sh
bundle=
prev=
for a in "$@"; do
	case "$prev" in --bundle|-b) bundle=$a ;; esac
	case "$a" in --bundle=*) bundle=${a#--bundle=} ;; esac
	prev=$a
done
if [ -n "$bundle" ] && [ -f "$bundle/config.json" ]; then
	sed -i 's/"io.kubernetes.cri.container-type":"container"/"io.kubernetes.cri.container-type":"sandbox"/' "$bundle/config.json"
fi
exec %s --platform=%s --network=none "$@"
`, mustLookPath("runsc"), n.RunscPlatform)
	containerdTOML := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = %[3]q

[ttrpc]
  address = %[4]q

# containerd and the shims it starts live here: Stop kills what is left in it.
[cgroup]
  path = %[5]q

[plugins."io.containerd.internal.v1.opt"]
  path = %[6]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[7]q
  # root here lacks CAP_SYS_RESOURCE: runc fails every sandbox unless oom_score_adj is kept.
  restrict_oom_score_adj = true
  # network namespaces under the state directory, not /var/run/netns.
  netns_mounts_under_state_dir = true
  enable_selinux = false

[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    Root = %[8]q

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc.options]
    BinaryName = %[9]q
    Root = %[10]q

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = %[11]q
`, filepath.Join(d, "containerd", "root"), filepath.Join(d, "containerd", "state"),
		n.ContainerdSocket, n.ContainerdSocket+".ttrpc", CgroupRoot+"/containerd",
		filepath.Join(d, "containerd", "opt"), PauseImage,
		filepath.Join(d, "runc-root"), filepath.Join(d, "runsc"), filepath.Join(d, "runsc-root"), cniDir)

	port, err := freePort()
	if err != nil {
		return err
	}
	if n.IP, err = hostIP(); err != nil {
		return err
	}
	kubeletCert, kubeletKey := filepath.Join(d, "kubelet.crt"), filepath.Join(d, "kubelet.key")
	if err := n.cp.pki.issue(kubeletCert, kubeletKey, NodeName, []string{"localhost", NodeName}, []net.IP{net.IPv4(127, 0, 0, 1), n.IP}); err != nil {
		return err
	}
	// The kubelet serves on the node's InternalIP, where the API server connects to it for
	// port-forward, logs and exec (its client certificate, checked against the cluster CA).
	kubeletYAML := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %s
port: %d
readOnlyPort: 0
healthzPort: 0
tlsCertFile: %s
tlsPrivateKeyFile: %s
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: %s}
authorization: {mode: AlwaysAllow}
containerRuntimeEndpoint: unix://%s
podLogsDir: %s
cgroupDriver: cgroupfs
cgroupRoot: %s
cgroupsPerQOS: true
failCgroupV1: false
failSwapOn: false
enforceNodeAllocatable: []
localStorageCapacityIsolation: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "1Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
registerNode: true
# Few pods: a density sweep of pods meets the kubelet's admission ceiling (OutOfpods) well
# within this machine's memory.
maxPods: %d
# No KUBE-FIREWALL, KUBE-KUBELET-CANARY or KUBE-IPTABLES-HINT chains on the host.
makeIPTablesUtilChains: false
volumePluginDir: %s
`, n.IP, port, kubeletCert, kubeletKey, n.cp.CAFile, n.ContainerdSocket, filepath.Join(d, "pod-logs"), CgroupRoot, MaxPods, filepath.Join(d, "volume-plugins"))

	files := []struct {
		path string
		data string
		mode os.FileMode
	}{
		{filepath.Join(cniDir, "10-nodectl.conflist"), conflist, 0o644},
		{filepath.Join(d, "runsc"), runscWrapper, 0o755},
		{filepath.Join(d, "containerd.toml"), containerdTOML, 0o644},
		{filepath.Join(d, "kubelet.yaml"), kubeletYAML, 0o644},
	}
	for _, f := range files {
		if err := os.WriteFile(f.path, []byte(f.data), f.mode); err != nil {
			return fmt.Errorf("writing %s: %w", f.path, err)
		}
	}
	if _, err := n.cp.writeKubeconfig(filepath.Join(d, "kubelet.kubeconfig"), "system:node:"+NodeName, kubeletToken); err != nil {
		return err
	}
	return nil
}

func mustLookPath(bin string) string {
	if p, err := exec.LookPath(bin); err == nil {
		return p
	}
	return bin
}

// runscPlatform picks gVisor's platform as stress/launch does: systrap where this runsc has it,
// else ptrace (KVM can hang in a nested VM).
func runscPlatform() string {
	out, _ := exec.Command("runsc", "flags").CombinedOutput()
	if bytes.Contains(out, []byte("systrap")) {
		return "systrap"
	}
	return "ptrace"
}

// authorizeKubelet binds RBAC's system:node role to the kubelet's user (no Node authorizer
// runs here).
func (n *Node) authorizeKubelet(ctx context.Context) error {
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "nodectl-testcluster:kubelet"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:node"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "system:node:" + NodeName}},
	}
	if _, err := n.cp.Client.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("binding system:node to the kubelet: %w", err)
	}
	return nil
}

func (n *Node) createRuntimeClasses(ctx context.Context) error {
	for name, handler := range map[string]string{RuntimeClassGVisor: "runsc", RuntimeClassRunc: "runc"} {
		rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Handler: handler}
		if _, err := n.cp.Client.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating the RuntimeClass %s: %w", name, err)
		}
	}
	return nil
}

// waitReady waits for the Node's Ready condition and then for a renewal of its Lease.
func (n *Node) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	c := n.cp.Client
	if err := poll(ctx, 500*time.Millisecond, "node "+NodeName+" Ready", n.kubelet, func() error {
		if dead, err := n.containerd.exited(); dead {
			return err
		}
		node, err := c.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				if cond.Status == corev1.ConditionTrue {
					return nil
				}
				return fmt.Errorf("Ready %s: %s", cond.Status, cond.Message)
			}
		}
		return errNotYet
	}); err != nil {
		return err
	}
	var first *metav1.MicroTime
	return poll(ctx, time.Second, "a renewal of node "+NodeName+"'s Lease", n.kubelet, func() error {
		lease, err := c.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		return renewedSince(lease, &first)
	})
}

// renewedSince remembers the first renewal time seen and says whether a later one came.
func renewedSince(lease *coordinationv1.Lease, first **metav1.MicroTime) error {
	rt := lease.Spec.RenewTime
	if rt == nil {
		return errNotYet
	}
	if *first == nil {
		*first = rt.DeepCopy()
		return errNotYet
	}
	if rt.After((*first).Time) {
		return nil
	}
	return errNotYet
}

// ImportImage imports an image archive (docker-archive or OCI tar) into the node's containerd,
// for pods with imagePullPolicy Never.
func (n *Node) ImportImage(ctx context.Context, tarPath string) error {
	out, err := exec.CommandContext(ctx, "ctr", "--address", n.ContainerdSocket, "-n", "k8s.io", "images", "import", tarPath).CombinedOutput()
	if err != nil {
		return fmt.Errorf("importing the image %s: %w: %s", tarPath, err, out)
	}
	return nil
}

// RunDaemonSet does the DaemonSet controller's job for the node (no kube-controller-manager
// runs here): it creates the DaemonSet namespace/name's pod on the node from its template,
// owned by the DaemonSet, and returns it. The kubelet restarts its containers as usual;
// a deleted pod is not recreated.
func (n *Node) RunDaemonSet(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	c := n.cp.Client
	ds, err := c.AppsV1().DaemonSets(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading the DaemonSet %s/%s: %w", namespace, name, err)
	}
	if err := n.cp.WaitServiceAccount(ctx, namespace); err != nil {
		return nil, err
	}
	pod := &corev1.Pod{
		ObjectMeta: *ds.Spec.Template.ObjectMeta.DeepCopy(),
		Spec:       *ds.Spec.Template.Spec.DeepCopy(),
	}
	pod.Name = name + "-" + NodeName
	pod.Namespace = namespace
	pod.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(ds, appsv1.SchemeGroupVersion.WithKind("DaemonSet"))}
	pod.Spec.NodeName = NodeName
	pod, err = c.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("creating the pod of the DaemonSet %s/%s: %w", namespace, name, err)
	}
	return pod, nil
}

// KubeletPID is the kubelet's process id (a test may stop it to miss Lease renewals).
func (n *Node) KubeletPID() int { return n.kubelet.cmd.Process.Pid }

// Stop deletes the node's pods, stops the kubelet and containerd and removes everything they
// made on the host: sandboxes and shims, mounts, network namespaces, the bridge, the CNI's
// cache, cgroups, containerd's and the kubelet's state. Idempotent; errors are logged.
func (n *Node) Stop() {
	n.stopOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		start := time.Now()
		if n.kubelet != nil {
			if err := n.deletePods(ctx); err != nil {
				n.log.Warn("deleting the node's pods", "err", err)
			}
		}
		n.kubelet.stop(10 * time.Second)
		if n.containerd != nil {
			if err := removeSandboxes(ctx, n.ContainerdSocket); err != nil {
				// Expected for gVisor sandboxes (the runc shim misses their exit): killed below.
				n.log.Info("removing the pod sandboxes", "err", err)
			}
		}
		n.containerd.stop(10 * time.Second)
		if err := Clean(n.dir, n.log); err != nil {
			n.log.Warn("cleaning the host", "err", err)
		}
		for path, v := range n.sysctls {
			if err := os.WriteFile(path, v, 0o644); err != nil {
				n.log.Warn("restoring a sysctl", "path", path, "err", err)
			}
		}
		n.log.Info("node stopped", "took", time.Since(start).Round(time.Millisecond))
	})
}

// deletePods deletes every pod bound to the node and waits until the kubelet has confirmed
// each (the API object is gone only then).
func (n *Node) deletePods(ctx context.Context) error {
	c := n.cp.Client
	sel := metav1.ListOptions{FieldSelector: "spec.nodeName=" + NodeName}
	pods, err := c.CoreV1().Pods("").List(ctx, sel)
	if err != nil {
		return fmt.Errorf("listing pods: %w", err)
	}
	grace := int64(2)
	for _, p := range pods.Items {
		if err := c.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting pod %s/%s: %w", p.Namespace, p.Name, err)
		}
	}
	// The kubelet confirms a deletion once the pod's containers are gone; a gVisor pod's
	// never are through the runc shim (it misses the sandbox's exit): once only those are
	// left, or after a while, the pods are deleted without confirmation and the rest is
	// killed.
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	gvisorLeft := false
	err = poll(wctx, 500*time.Millisecond, "the node's pods to go", n.kubelet, func() error {
		pods, err := c.CoreV1().Pods("").List(wctx, sel)
		if err != nil {
			return err
		}
		var names []string
		for _, p := range pods.Items {
			if rc := p.Spec.RuntimeClassName; rc == nil || *rc != RuntimeClassGVisor {
				names = append(names, p.Namespace+"/"+p.Name)
			}
		}
		if len(names) > 0 {
			return fmt.Errorf("left: %s", strings.Join(names, ", "))
		}
		gvisorLeft = len(pods.Items) > 0
		return nil
	})
	if err == nil && !gvisorLeft {
		return nil
	}
	if err != nil {
		n.log.Info("deleting the node's pods without the kubelet's confirmation", "err", err)
	}
	pods, lerr := c.CoreV1().Pods("").List(ctx, sel)
	if lerr != nil {
		return fmt.Errorf("listing pods: %w", lerr)
	}
	now := int64(0)
	for _, p := range pods.Items {
		if err := c.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &now}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting pod %s/%s: %w", p.Namespace, p.Name, err)
		}
	}
	return nil
}

const ipForwardPath = "/proc/sys/net/ipv4/ip_forward"

// changedSysctls are the host settings the node changes: ip_forward (the CNI bridge plugin)
// and the kernel tunables the kubelet sets at start-up; Stop writes back what they were.
var changedSysctls = []string{ipForwardPath, "/proc/sys/vm/overcommit_memory", "/proc/sys/vm/panic_on_oom",
	"/proc/sys/kernel/panic", "/proc/sys/kernel/panic_on_oops", "/proc/sys/kernel/keys/root_maxkeys", "/proc/sys/kernel/keys/root_maxbytes"}

// readSysctls reads changedSysctls.
func readSysctls() map[string][]byte {
	out := map[string][]byte{}
	for _, p := range changedSysctls {
		if v, err := os.ReadFile(p); err == nil {
			out[p] = v
		}
	}
	return out
}

// hostIP is the address of the interface of the default route: the kubelet's node IP (it
// refuses a loopback one), which the API server dials.
func hostIP() (net.IP, error) {
	// Connecting a UDP socket sends nothing; it only picks the route's source address.
	c, err := net.Dial("udp4", "203.0.113.1:9")
	if err != nil {
		return nil, fmt.Errorf("the test node needs a default IPv4 route for the kubelet's node IP: %w", err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP, nil
}
