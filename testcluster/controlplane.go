// Package testcluster runs a real Kubernetes control plane (etcd, kube-apiserver) and a real
// kubelet node (a private containerd with runc and gVisor runtime handlers) on this machine,
// for the project's cluster tests (`make test-cluster`). Everything it makes lives under the
// directories it is given and the cgroup CgroupRoot, and Stop removes it all.
package testcluster

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
)

// KubeVersion is the version of kube-apiserver and the kubelet testcluster/build-kube.sh builds.
const KubeVersion = "1.37.2"

// KubeDir is where kube-apiserver and the kubelet are cached: NODECTL_KUBE_CACHE, else
// /var/cache/nodectl/kube-v<KubeVersion> (build-kube.sh's default).
func KubeDir() string {
	if d := os.Getenv("NODECTL_KUBE_CACHE"); d != "" {
		return d
	}
	return "/var/cache/nodectl/kube-v" + KubeVersion
}

const (
	serviceCIDR = "10.0.0.0/24"
	serviceIP   = "10.0.0.1" // the kubernetes Service's address, in the serving certificate
	adminToken  = "nodectl-testcluster-admin"
	// kubeletToken authenticates the kubelet as the node's user (RBAC's system:node role is
	// bound to it when the node starts).
	kubeletToken = "nodectl-testcluster-kubelet"
)

// ControlPlane is etcd and kube-apiserver on loopback, with RBAC, a static admin token in
// system:masters and service-account tokens signed by its own key.
type ControlPlane struct {
	// Config and Client act as the admin (system:masters).
	Config *rest.Config
	Client kubernetes.Interface
	// KubeconfigPath is an admin kubeconfig file, for tools (kubectl, kustomize, ctr...).
	KubeconfigPath string
	// CAFile is the cluster CA; CAPEM its PEM.
	CAFile string
	CAPEM  []byte
	// Server is kube-apiserver's URL.
	Server string

	dir      string
	pki      *pki
	log      *slog.Logger
	etcd     *proc
	api      *proc
	apiBin   string
	apiArgs  []string
	stopCtl  context.CancelFunc
	ctlDone  chan struct{}
	stopOnce sync.Once
}

// StartControlPlane starts etcd and kube-apiserver with their state in dir and waits until the
// apiserver is ready. A failed start stops what it started.
func StartControlPlane(ctx context.Context, dir string, log *slog.Logger) (_ *ControlPlane, err error) {
	apiserver := filepath.Join(KubeDir(), "kube-apiserver")
	if _, err := os.Stat(apiserver); err != nil {
		return nil, fmt.Errorf("finding kube-apiserver: %w (build it with testcluster/build-kube.sh)", err)
	}
	etcdBin, err := exec.LookPath("etcd")
	if err != nil {
		return nil, fmt.Errorf("finding etcd: %w (apt-get install etcd-server, or make deps-cluster)", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("making the control plane's directory: %w", err)
	}
	cp := &ControlPlane{dir: dir, log: log.With("component", "testcluster")}
	defer func() {
		if err != nil {
			cp.Stop()
		}
	}()
	if cp.pki, err = newPKI(dir); err != nil {
		return nil, err
	}
	cp.CAFile, cp.CAPEM = cp.pki.caFile, cp.pki.caPEM

	clientPort, err := freePort()
	if err != nil {
		return nil, err
	}
	peerPort, err := freePort()
	if err != nil {
		return nil, err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(clientPort)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	if cp.etcd, err = startProc("etcd", dir, etcdBin, []string{
		"--name=testcluster",
		"--data-dir=" + filepath.Join(dir, "etcd"),
		"--listen-client-urls=" + etcdURL, "--advertise-client-urls=" + etcdURL,
		"--listen-peer-urls=" + peerURL, "--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=testcluster=" + peerURL,
		"--log-level=warn",
	}, cp.log); err != nil {
		return nil, err
	}

	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(
		adminToken+",admin,admin,\"system:masters\"\n"+
			kubeletToken+",system:node:"+NodeName+",kubelet,\"system:nodes\"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("writing the token file: %w", err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	cp.Server = "https://127.0.0.1:" + strconv.Itoa(port)
	start := time.Now()
	cp.apiBin, cp.apiArgs = apiserver, []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + dir,
		"--tls-cert-file=" + cp.pki.serverCert, "--tls-private-key-file=" + cp.pki.serverKey,
		"--client-ca-file=" + cp.pki.caFile,
		"--token-auth-file=" + tokens,
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + cp.pki.saPub,
		"--service-account-signing-key-file=" + cp.pki.saKey,
		"--service-cluster-ip-range=" + serviceCIDR,
		"--allow-privileged=true",
		// Port-forward, logs and exec: the API server dials the kubelet at the node's InternalIP
		// with a client certificate of the cluster CA, and checks the kubelet's.
		"--kubelet-preferred-address-types=InternalIP",
		"--kubelet-client-certificate=" + cp.pki.serverCert, "--kubelet-client-key=" + cp.pki.serverKey,
		"--kubelet-certificate-authority=" + cp.pki.caFile,
		// v1.37 refuses a loopback advertise address to the default reconciler.
		"--endpoint-reconciler-type=none",
	}
	if cp.api, err = startProc("kube-apiserver", dir, cp.apiBin, cp.apiArgs, cp.log); err != nil {
		return nil, err
	}

	cp.Config = &rest.Config{
		Host:            cp.Server,
		BearerToken:     adminToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: cp.CAPEM},
		QPS:             50, Burst: 100,
	}
	if cp.Client, err = kubernetes.NewForConfig(cp.Config); err != nil {
		return nil, fmt.Errorf("making the admin client: %w", err)
	}
	if err := cp.waitReady(ctx); err != nil {
		return nil, err
	}
	cp.log.Info("control plane ready", "server", cp.Server, "took", time.Since(start).Round(time.Millisecond))
	if cp.KubeconfigPath, err = cp.writeKubeconfig(filepath.Join(dir, "admin.kubeconfig"), "admin", adminToken); err != nil {
		return nil, err
	}
	cp.startServiceAccounts()
	return cp, nil
}

// RestartAPIServer stops kube-apiserver, waits down, and starts it again on the same address
// and etcd, as an upgrade of the control plane does to every client at once; it returns once
// the server is ready.
func (cp *ControlPlane) RestartAPIServer(ctx context.Context, down time.Duration) error {
	cp.api.stop(2 * time.Second)
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(down):
	}
	p, err := startProc("kube-apiserver", cp.dir, cp.apiBin, cp.apiArgs, cp.log)
	if err != nil {
		return err
	}
	cp.api = p
	return cp.waitReady(ctx)
}

// waitReady polls /readyz (verbose, so a failure names the check).
func (cp *ControlPlane) waitReady(ctx context.Context) error {
	tlsCfg, err := rest.TLSConfigFor(cp.Config)
	if err != nil {
		return fmt.Errorf("making the readiness client: %w", err)
	}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg}}
	defer hc.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return poll(ctx, 250*time.Millisecond, "kube-apiserver /readyz", cp.api, func() error {
		if dead, err := cp.etcd.exited(); dead {
			return err
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, cp.Server+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %s", resp.Status)
		}
		return nil
	})
}

// writeKubeconfig writes a kubeconfig for a user authenticated by a bearer token.
func (cp *ControlPlane) writeKubeconfig(path, user, token string) (string, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["testcluster"] = &clientcmdapi.Cluster{Server: cp.Server, CertificateAuthorityData: cp.CAPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["testcluster"] = &clientcmdapi.Context{Cluster: "testcluster", AuthInfo: user}
	cfg.CurrentContext = "testcluster"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return "", fmt.Errorf("writing the kubeconfig %s: %w", path, err)
	}
	return path, nil
}

// ImpersonateUser returns an admin config that acts as user in groups (system:authenticated is
// added), for RBAC checks: the apiserver authorizes each request as that user.
func (cp *ControlPlane) ImpersonateUser(user string, groups ...string) *rest.Config {
	cfg := rest.CopyConfig(cp.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: append(groups, "system:authenticated")}
	return cfg
}

// ImpersonateServiceAccount returns an admin config that acts as the ServiceAccount
// namespace/name with the groups its tokens carry.
func (cp *ControlPlane) ImpersonateServiceAccount(namespace, name string) *rest.Config {
	return cp.ImpersonateUser("system:serviceaccount:"+namespace+":"+name,
		"system:serviceaccounts", "system:serviceaccounts:"+namespace)
}

// ServiceAccountConfig returns a config that authenticates with a real token of the
// ServiceAccount namespace/name (the TokenRequest API), as a pod of it would.
func (cp *ControlPlane) ServiceAccountConfig(ctx context.Context, namespace, name string) (*rest.Config, error) {
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))}}
	tr, err := cp.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, req, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("requesting a token of %s/%s: %w", namespace, name, err)
	}
	return &rest.Config{
		Host:            cp.Server,
		BearerToken:     tr.Status.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: cp.CAPEM},
	}, nil
}

// ServiceAccountKubeconfig writes a kubeconfig at path with a real token of the
// ServiceAccount namespace/name, for the CLI acting as that identity.
func (cp *ControlPlane) ServiceAccountKubeconfig(ctx context.Context, namespace, name, path string) (string, error) {
	cfg, err := cp.ServiceAccountConfig(ctx, namespace, name)
	if err != nil {
		return "", err
	}
	return cp.writeKubeconfig(path, "system:serviceaccount:"+namespace+":"+name, cfg.BearerToken)
}

// startServiceAccounts does the jobs of kube-controller-manager that namespaces need (no
// controller-manager runs here): every namespace gets its `default` ServiceAccount (the
// ServiceAccount admission plugin rejects pods without one) and the `kube-root-ca.crt`
// ConfigMap (the projected token volume it adds mounts it), and a deleted one goes once its
// pods are gone (finishNamespace).
func (cp *ControlPlane) startServiceAccounts() {
	ctx, cancel := context.WithCancel(context.Background())
	cp.stopCtl, cp.ctlDone = cancel, make(chan struct{})
	lw := cache.NewListWatchFromClient(cp.Client.CoreV1().RESTClient(), "namespaces", "", fields.Everything())
	_, ctl := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &corev1.Namespace{},
		// A terminating namespace is looked at again until its pods are gone.
		ResyncPeriod: 2 * time.Second,
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc: func(obj any) { cp.ensureNamespace(ctx, obj.(*corev1.Namespace)) },
			UpdateFunc: func(_, obj any) {
				cp.ensureNamespace(ctx, obj.(*corev1.Namespace))
			},
		},
	})
	go func() {
		defer close(cp.ctlDone)
		ctl.Run(ctx.Done())
	}()
}

func (cp *ControlPlane) ensureNamespace(ctx context.Context, ns *corev1.Namespace) {
	if ns.Status.Phase == corev1.NamespaceTerminating {
		cp.finishNamespace(ctx, ns)
		return
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: ns.Name}}
	if _, err := cp.Client.CoreV1().ServiceAccounts(ns.Name).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) && ctx.Err() == nil {
		cp.log.Warn("creating the default ServiceAccount", "namespace", ns.Name, "err", err)
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-root-ca.crt", Namespace: ns.Name},
		Data:       map[string]string{"ca.crt": string(cp.CAPEM)},
	}
	if _, err := cp.Client.CoreV1().ConfigMaps(ns.Name).Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) && ctx.Err() == nil {
		cp.log.Warn("creating the root CA ConfigMap", "namespace", ns.Name, "err", err)
	}
}

// finishNamespace does the namespace controller's last job for a terminating namespace whose
// pods are gone: it deletes what the namespace holds of this harness's making (its
// ServiceAccounts and ConfigMaps) and removes the namespace's finalizer, so it disappears.
func (cp *ControlPlane) finishNamespace(ctx context.Context, ns *corev1.Namespace) {
	pods, err := cp.Client.CoreV1().Pods(ns.Name).List(ctx, metav1.ListOptions{})
	if err != nil || len(pods.Items) > 0 {
		return
	}
	all := metav1.ListOptions{}
	if err := cp.Client.CoreV1().ServiceAccounts(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{}, all); err != nil && ctx.Err() == nil {
		cp.log.Warn("deleting the ServiceAccounts of a terminating namespace", "namespace", ns.Name, "err", err)
	}
	if err := cp.Client.CoreV1().ConfigMaps(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{}, all); err != nil && ctx.Err() == nil {
		cp.log.Warn("deleting the ConfigMaps of a terminating namespace", "namespace", ns.Name, "err", err)
	}
	done := ns.DeepCopy()
	done.Spec.Finalizers = nil
	if _, err := cp.Client.CoreV1().Namespaces().Finalize(ctx, done, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) && ctx.Err() == nil {
		cp.log.Warn("finalizing a terminating namespace", "namespace", ns.Name, "err", err)
	}
}

// WaitServiceAccount waits until namespace has its default ServiceAccount (made right after
// the namespace is), so pods created next are admitted.
func (cp *ControlPlane) WaitServiceAccount(ctx context.Context, namespace string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return poll(ctx, 100*time.Millisecond, "the default ServiceAccount of "+namespace, nil, func() error {
		_, err := cp.Client.CoreV1().ServiceAccounts(namespace).Get(ctx, "default", metav1.GetOptions{})
		return err
	})
}

// Stop stops kube-apiserver and etcd; their state stays in dir, which the caller owns.
// Idempotent.
func (cp *ControlPlane) Stop() {
	cp.stopOnce.Do(func() {
		if cp.stopCtl != nil {
			cp.stopCtl()
			<-cp.ctlDone
		}
		// No graceful drain to wait for: a test's apiserver has no other clients.
		cp.api.stop(2 * time.Second)
		cp.etcd.stop(5 * time.Second)
	})
}
