package deploy

import (
	"bufio"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/resmap"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

const (
	namespace = "nodectl-system"
	agentName = "nodectl-agent"
	imageName = "nodectl"
)

// writable are the host directories the agent may write: its data and its socket's.
var writable = []string{"/var/lib/nodectl", "/run/nodectl"}

// render builds the kustomization in dir as `kustomize build` does.
func render(t *testing.T, dir string) resmap.ResMap {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	return m
}

// objects decodes every rendered resource of kind into T.
func objects[T any](t *testing.T, m resmap.ResMap, kind string) map[string]T {
	t.Helper()
	out := map[string]T{}
	for _, r := range m.Resources() {
		if r.GetKind() != kind {
			continue
		}
		b, err := r.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		var v T
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatalf("decoding %s %s: %v", kind, r.GetName(), err)
		}
		out[r.GetNamespace()+"/"+r.GetName()] = v
	}
	return out
}

// documentedCaps reads docs/deploy.md's capability table: the capabilities whose last column
// says the DaemonSet adds them.
func documentedCaps(t *testing.T) []corev1.Capability {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "docs", "deploy.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var caps []corev1.Capability
	rows := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "| `CAP_") {
			continue
		}
		rows++
		cells := strings.Split(strings.Trim(line, "| "), "|")
		name := strings.Trim(strings.TrimSpace(cells[0]), "`")
		if strings.TrimSpace(cells[len(cells)-1]) == "added" {
			caps = append(caps, corev1.Capability(strings.TrimPrefix(name, "CAP_")))
		}
	}
	if rows == 0 {
		t.Fatal("docs/deploy.md has no capability table")
	}
	slices.Sort(caps)
	return caps
}

func agentDaemonSet(t *testing.T, m resmap.ResMap) appsv1.DaemonSet {
	t.Helper()
	ds, ok := objects[appsv1.DaemonSet](t, m, "DaemonSet")[namespace+"/"+agentName]
	if !ok {
		t.Fatalf("no DaemonSet %s/%s", namespace, agentName)
	}
	return ds
}

func container(t *testing.T, ps corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	i := slices.IndexFunc(ps.Containers, func(c corev1.Container) bool { return c.Name == name })
	if i < 0 {
		t.Fatalf("no container %s", name)
	}
	return ps.Containers[i]
}

// checkPod is what holds of the agent's pod in every tree. wantAdd gives, by container, the
// capabilities it adds.
func checkPod(t *testing.T, ds appsv1.DaemonSet, wantAdd map[string][]corev1.Capability) {
	ps := ds.Spec.Template.Spec
	if !ps.HostPID || ps.HostNetwork {
		t.Errorf("hostPID %v, hostNetwork %v: want the host's PIDs and the pod's network", ps.HostPID, ps.HostNetwork)
	}
	if ps.PriorityClassName != "system-node-critical" {
		t.Errorf("priority class %q", ps.PriorityClassName)
	}
	if !slices.ContainsFunc(ps.Tolerations, func(tl corev1.Toleration) bool { return tl.Operator == corev1.TolerationOpExists && tl.Key == "" }) {
		t.Errorf("tolerations %+v: want one tolerating every taint", ps.Tolerations)
	}
	if ps.ServiceAccountName != agentName {
		t.Errorf("service account %q", ps.ServiceAccountName)
	}
	if ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
		t.Error("the ServiceAccount's token is mounted into every container: want it in the agent's alone")
	}
	if ps.SecurityContext == nil || ps.SecurityContext.SeccompProfile == nil || ps.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod security context %+v: want the runtime's default seccomp profile", ps.SecurityContext)
	}
	for _, c := range ps.Containers {
		token := slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.MountPath == "/var/run/secrets/kubernetes.io/serviceaccount"
		})
		if token != (c.Name == "agent") {
			t.Errorf("container %s: the API token mounted %v, want it in the agent's alone", c.Name, token)
		}
	}
	if u := ds.Spec.UpdateStrategy; u.Type != appsv1.RollingUpdateDaemonSetStrategyType || u.RollingUpdate == nil || u.RollingUpdate.MaxSurge == nil || u.RollingUpdate.MaxSurge.IntValue() != 0 {
		t.Errorf("update strategy %+v: want a rolling update without surge", u)
	}
	hostPaths := map[string]string{}
	for _, v := range ps.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	if len(ps.Containers) != len(wantAdd) {
		t.Errorf("%d containers, want %d", len(ps.Containers), len(wantAdd))
	}
	for _, c := range ps.Containers {
		t.Run(c.Name, func(t *testing.T) {
			want, ok := wantAdd[c.Name]
			if !ok {
				t.Fatalf("unexpected container %s", c.Name)
			}
			if name, _, _ := strings.Cut(c.Image, ":"); name != imageName {
				t.Errorf("image %q: want the kustomize image %s", c.Image, imageName)
			}
			if c.ImagePullPolicy != corev1.PullIfNotPresent {
				t.Errorf("image pull policy %q", c.ImagePullPolicy)
			}
			sc := c.SecurityContext
			if sc == nil {
				t.Fatal("no securityContext")
			}
			if sc.Privileged != nil && *sc.Privileged {
				t.Error("privileged")
			}
			if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				t.Error("privilege escalation not disallowed")
			}
			if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
				t.Error("root filesystem not read-only")
			}
			if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
				t.Errorf("capabilities %+v: want drop [ALL]", sc.Capabilities)
			}
			add := slices.Clone(sc.Capabilities.Add)
			slices.Sort(add)
			if !slices.Equal(add, want) {
				t.Errorf("adds %v, want %v", add, want)
			}
			for _, vm := range c.VolumeMounts {
				p, ok := hostPaths[vm.Name]
				if !ok {
					continue
				}
				if rw := slices.Contains(writable, p); vm.ReadOnly == rw {
					t.Errorf("host path %s at %s: read-only %v, want %v", p, vm.MountPath, vm.ReadOnly, !rw)
				}
			}
			if c.Resources.Limits.Memory().IsZero() || c.Resources.Requests.Memory().IsZero() {
				t.Errorf("memory request %s, limit %s: want both", c.Resources.Requests.Memory(), c.Resources.Limits.Memory())
			}
		})
	}

	agent := container(t, ps, "agent")
	for _, p := range []*corev1.Probe{agent.ReadinessProbe, agent.LivenessProbe} {
		if p == nil || p.GRPC == nil {
			t.Fatalf("probe %+v: want gRPC health probes", p)
		}
		if want := "--health-listen=:" + strconv.Itoa(int(p.GRPC.Port)); !slices.Contains(agent.Args, want) {
			t.Errorf("probe on port %d, but no %s in %q", p.GRPC.Port, want, agent.Args)
		}
	}
	var gomemlimit, nodeName bool
	for _, e := range agent.Env {
		switch {
		case e.Name == "GOMEMLIMIT":
			gomemlimit = strings.HasSuffix(e.Value, "MiB")
			mib, _ := strconv.Atoi(strings.TrimSuffix(e.Value, "MiB"))
			if limit := agent.Resources.Limits.Memory().Value() >> 20; int64(mib) >= limit/2 {
				t.Errorf("GOMEMLIMIT %s against a memory limit of %d MiB: the RSS runs above it by the binary and an analysis", e.Value, limit)
			}
		case e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			nodeName = e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
		}
	}
	if !gomemlimit || !nodeName {
		t.Errorf("env %+v: want GOMEMLIMIT in MiB and NODE_NAME from spec.nodeName", agent.Env)
	}
}

// The RBAC is exactly: pods list/watch and nodes get/watch cluster-wide, leases get/watch in
// kube-node-lease, bound to the agent's ServiceAccount; and, bound to no one, the users' role
// for --node in the agent's namespace (pods list, pods/portforward get and create) and their
// cluster role for runs of pods (namespaces, pods, nodes get); no other role.
func checkRBAC(t *testing.T, m resmap.ResMap) {
	crs := objects[rbacv1.ClusterRole](t, m, "ClusterRole")
	roles := objects[rbacv1.Role](t, m, "Role")
	if len(crs) != 4 || len(roles) != 2 {
		t.Fatalf("%d cluster roles, %d roles: want four and two", len(crs), len(roles))
	}
	rule := func(group, resource string, verbs ...string) rbacv1.PolicyRule {
		return rbacv1.PolicyRule{APIGroups: []string{group}, Resources: []string{resource}, Verbs: verbs}
	}
	equal := func(got, want []rbacv1.PolicyRule) bool {
		return slices.EqualFunc(got, want, func(a, b rbacv1.PolicyRule) bool {
			return slices.Equal(a.APIGroups, b.APIGroups) && slices.Equal(a.Resources, b.Resources) && slices.Equal(a.Verbs, b.Verbs) &&
				slices.Equal(a.ResourceNames, b.ResourceNames) && len(a.NonResourceURLs) == 0
		})
	}
	if cr, ok := crs["/"+agentName]; !ok || !equal(cr.Rules, []rbacv1.PolicyRule{rule("", "pods", "list", "watch"), rule("", "nodes", "get", "watch")}) {
		t.Errorf("cluster role %s: %+v", agentName, cr.Rules)
	}
	if r, ok := roles["kube-node-lease/"+agentName]; !ok || !equal(r.Rules, []rbacv1.PolicyRule{rule("coordination.k8s.io", "leases", "get", "watch")}) {
		t.Errorf("role kube-node-lease/%s: %+v", agentName, r.Rules)
	}
	if r, ok := roles[namespace+"/nodectl-user"]; !ok || !equal(r.Rules, []rbacv1.PolicyRule{rule("", "pods", "list"), rule("", "pods/portforward", "get", "create")}) {
		t.Errorf("role %s/nodectl-user: %+v", namespace, r.Rules)
	}
	// Stress reaches no pod, log or namespace but through nodectl-stress-run, which it may bind
	// (admission keeps that to the runs' namespaces: checkAdmission); tuning is a right apart.
	bindRun := rule("rbac.authorization.k8s.io", "clusterroles", "bind")
	bindRun.ResourceNames = []string{"nodectl-stress-run"}
	if cr, ok := crs["/nodectl-stress"]; !ok || !equal(cr.Rules, []rbacv1.PolicyRule{rule("", "namespaces", "get", "list", "create"),
		rule("rbac.authorization.k8s.io", "rolebindings", "create"), bindRun, rule("", "nodes", "get"), rule("coordination.k8s.io", "leases", "get")}) {
		t.Errorf("cluster role nodectl-stress: %+v", cr.Rules)
	}
	if cr, ok := crs["/nodectl-stress-run"]; !ok || !equal(cr.Rules, []rbacv1.PolicyRule{rule("", "pods", "list", "create", "delete"),
		rule("", "pods/log", "get"), rule("", "pods/attach", "get", "create"), rule("", "namespaces", "delete")}) {
		t.Errorf("cluster role nodectl-stress-run: %+v", cr.Rules)
	}
	if cr, ok := crs["/nodectl-tune"]; !ok || !equal(cr.Rules, []rbacv1.PolicyRule{rule("nodectl.io", "nodes", "tune")}) {
		t.Errorf("cluster role nodectl-tune: %+v", cr.Rules)
	}
	sa := rbacv1.Subject{Kind: "ServiceAccount", Name: agentName, Namespace: namespace}
	for key, b := range objects[rbacv1.ClusterRoleBinding](t, m, "ClusterRoleBinding") {
		if b.RoleRef.Kind != "ClusterRole" || b.RoleRef.Name != agentName || !slices.Equal(b.Subjects, []rbacv1.Subject{sa}) {
			t.Errorf("cluster role binding %s: %+v", key, b)
		}
	}
	rbs := objects[rbacv1.RoleBinding](t, m, "RoleBinding")
	if b, ok := rbs["kube-node-lease/"+agentName]; len(rbs) != 1 || !ok || b.RoleRef.Kind != "Role" || b.RoleRef.Name != agentName || !slices.Equal(b.Subjects, []rbacv1.Subject{sa}) {
		t.Errorf("role bindings %+v: want one in kube-node-lease for %s", rbs, agentName)
	}
	if _, ok := objects[corev1.ServiceAccount](t, m, "ServiceAccount")[namespace+"/"+agentName]; !ok {
		t.Errorf("no ServiceAccount %s/%s", namespace, agentName)
	}
}

// checkAdmission: each of nodectl's admission policies is bound to deny, and fails closed (an
// expression that cannot be evaluated refuses the request). What they refuse is tested on a
// real API server (testcluster/e2e, stress_rights).
func checkAdmission(t *testing.T, m resmap.ResMap) {
	t.Helper()
	policies := objects[admissionv1.ValidatingAdmissionPolicy](t, m, "ValidatingAdmissionPolicy")
	bindings := objects[admissionv1.ValidatingAdmissionPolicyBinding](t, m, "ValidatingAdmissionPolicyBinding")
	want := []string{"nodectl-privileged-pods", "nodectl-run-namespaces", "nodectl-stress-run-bindings"}
	if got := slices.Sorted(maps.Keys(policies)); !slices.Equal(got, []string{"/" + want[0], "/" + want[1], "/" + want[2]}) {
		t.Fatalf("admission policies %v: want %v", got, want)
	}
	for _, name := range want {
		p := policies["/"+name]
		if p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != admissionv1.Fail || len(p.Spec.Validations) == 0 {
			t.Errorf("policy %s: failure policy %v, %d validations: want Fail, some", name, p.Spec.FailurePolicy, len(p.Spec.Validations))
		}
		n := 0
		for _, b := range bindings {
			if b.Spec.PolicyName == name {
				n++
				if !slices.Equal(b.Spec.ValidationActions, []admissionv1.ValidationAction{admissionv1.Deny}) || b.Spec.ParamRef != nil {
					t.Errorf("binding %s of %s: actions %v: want Deny", b.Name, name, b.Spec.ValidationActions)
				}
			}
		}
		if n != 1 {
			t.Errorf("policy %s has %d bindings: want one", name, n)
		}
	}
}

// metricsReader is the label of the namespaces whose pods may scrape the agent's metrics.
const metricsReader = "nodectl.io/metrics-reader"

// checkNetworkPolicy: one policy isolates the agent's pods for ingress and lets in only the
// metrics ports, only from namespaces labelled metricsReader; the probes come from the node,
// which a policy cannot block, and the API is not on the pod's network.
func checkNetworkPolicy(t *testing.T, m resmap.ResMap, ds appsv1.DaemonSet) {
	t.Helper()
	nps := objects[networkingv1.NetworkPolicy](t, m, "NetworkPolicy")
	np, ok := nps[namespace+"/"+agentName]
	if len(nps) != 1 || !ok {
		t.Fatalf("network policies %v: want one, %s/%s", slices.Collect(maps.Keys(nps)), namespace, agentName)
	}
	sel := np.Spec.PodSelector.MatchLabels
	for k, v := range sel {
		if ds.Spec.Template.Labels[k] != v {
			t.Errorf("the policy selects %v, not the agent's pods (%v)", sel, ds.Spec.Template.Labels)
		}
	}
	if len(sel) == 0 || !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		t.Errorf("selector %v, policy types %v: want the agent's pods isolated for ingress", sel, np.Spec.PolicyTypes)
	}
	// The metrics ports: every container's port named metrics or ending in -metrics.
	var want []int
	for _, c := range ds.Spec.Template.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == "metrics" || strings.HasSuffix(p.Name, "-metrics") {
				want = append(want, int(p.ContainerPort))
			}
		}
	}
	in := np.Spec.Ingress
	if len(in) != 1 {
		t.Fatalf("ingress %+v: want one rule, for the metrics ports %v", in, want)
	}
	var got []int
	for _, p := range in[0].Ports {
		if p.Port == nil || p.Protocol == nil || *p.Protocol != corev1.ProtocolTCP || p.EndPort != nil {
			t.Errorf("ingress port %+v: want one TCP port", p)
			continue
		}
		got = append(got, p.Port.IntValue())
	}
	slices.Sort(want)
	slices.Sort(got)
	if len(want) == 0 || !slices.Equal(got, want) {
		t.Errorf("ingress to ports %v: want the metrics ports %v alone", got, want)
	}
	from := in[0].From
	if len(from) != 1 || from[0].PodSelector != nil || from[0].IPBlock != nil || from[0].NamespaceSelector == nil ||
		len(from[0].NamespaceSelector.MatchExpressions) != 0 || !maps.Equal(from[0].NamespaceSelector.MatchLabels, map[string]string{metricsReader: "true"}) {
		t.Errorf("metrics allowed from %+v: want the namespaces labelled %s=true alone", from, metricsReader)
	}
}

func TestBase(t *testing.T) {
	m := render(t, "base")
	ds := agentDaemonSet(t, m)
	checkPod(t, ds, map[string][]corev1.Capability{"agent": documentedCaps(t)})
	checkRBAC(t, m)
	checkAdmission(t, m)
	checkNetworkPolicy(t, m, ds)
	// No CRI: its socket is the runtime's whole API, root on the node, through any mount.
	agent := container(t, ds.Spec.Template.Spec, "agent")
	if !slices.Contains(agent.Args, "--cri-socket=none") {
		t.Errorf("agent args %q: want --cri-socket=none", agent.Args)
	}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.HostPath != nil && (strings.Contains(v.HostPath.Path, "containerd") || strings.Contains(v.HostPath.Path, "crio")) {
			t.Errorf("volume %s mounts the runtime's %s", v.Name, v.HostPath.Path)
		}
	}
	if _, ok := objects[corev1.Namespace](t, m, "Namespace")["/"+namespace]; !ok {
		t.Errorf("no Namespace %s", namespace)
	}
}

// maxCgroups is the --max-cgroups of args, or the agent's default (1,000) without one.
func maxCgroups(t *testing.T, args []string) int {
	t.Helper()
	n := 1000
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--max-cgroups="); ok {
			var err error
			if n, err = strconv.Atoi(v); err != nil {
				t.Fatalf("agent arg %q: %v", a, err)
			}
		}
	}
	return n
}

func TestGKEOverlay(t *testing.T) {
	m := render(t, "gke")
	ds := agentDaemonSet(t, m)
	// The tuner only verifies: it needs no capability at all.
	checkPod(t, ds, map[string][]corev1.Capability{"agent": documentedCaps(t), "tuner": nil})
	checkRBAC(t, m)
	checkAdmission(t, m)
	checkNetworkPolicy(t, m, ds)
	ps := ds.Spec.Template.Spec
	if ps.NodeSelector["cloud.google.com/gke-nodepool"] != "lssd-swap-pool" || ps.NodeSelector["kubernetes.io/os"] != "linux" {
		t.Errorf("node selector %v: want the swap pool's, on linux", ps.NodeSelector)
	}
	// Its nodes run up to 1,024 pods, about 3 cgroups each: the bound covers them, with the
	// memory measured at that many beside it.
	agent := container(t, ps, "agent")
	if n := maxCgroups(t, agent.Args); n < 3*1024 {
		t.Errorf("agent args %q: --max-cgroups %d, want at least 3 cgroups a pod for 1,024 pods", agent.Args, n)
	}
	if req := agent.Resources.Requests.Memory(); req.Cmp(resource.MustParse("80Mi")) < 0 {
		t.Errorf("agent memory request %s: want at least the 80Mi measured at 3,000 cgroups", req)
	}
	if lim, req := agent.Resources.Limits.Memory(), agent.Resources.Requests.Memory(); lim.Value() < 2*req.Value() {
		t.Errorf("agent memory limit %s: want room for an incident's analysis above the request %s", lim, req)
	}
	tuner := container(t, ps, "tuner")
	if len(tuner.Args) < 2 || tuner.Args[0] != "tune" || tuner.Args[1] != "watch" || slices.Contains(tuner.Args, "--apply") {
		t.Errorf("tuner args %q: want tune watch, verifying only", tuner.Args)
	}
	if sc := tuner.SecurityContext; sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Error("the tuner runs as root")
	}

	// The profile: the pool's own node system config, in a generated ConfigMap the pod mounts.
	want, err := os.ReadFile(filepath.Join("gke", "swap-dedicated-lssd.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cmName string
	for key, cm := range objects[corev1.ConfigMap](t, m, "ConfigMap") {
		if strings.HasPrefix(key, namespace+"/nodectl-tune-profile-") && cm.Data["swap-dedicated-lssd.yaml"] == string(want) {
			cmName = cm.Name
		}
	}
	if cmName == "" {
		t.Fatal("no generated ConfigMap nodectl-tune-profile-<hash> holding swap-dedicated-lssd.yaml")
	}
	if !slices.ContainsFunc(ps.Volumes, func(v corev1.Volume) bool { return v.ConfigMap != nil && v.ConfigMap.Name == cmName }) {
		t.Errorf("no volume of ConfigMap %s", cmName)
	}
	if !slices.ContainsFunc(tuner.Args, func(a string) bool { return a == "--profile=/etc/nodectl/tune/swap-dedicated-lssd.yaml" }) ||
		!slices.ContainsFunc(tuner.VolumeMounts, func(vm corev1.VolumeMount) bool { return vm.MountPath == "/etc/nodectl/tune" }) {
		t.Errorf("tuner args %q, mounts %+v: want the profile from the ConfigMap", tuner.Args, tuner.VolumeMounts)
	}
	// GKE admits system-node-critical pods outside kube-system only under a quota of that scope.
	quotas := objects[corev1.ResourceQuota](t, m, "ResourceQuota")
	admits := false
	for _, q := range quotas {
		if sel := q.Spec.ScopeSelector; q.Namespace == namespace && sel != nil && len(sel.MatchExpressions) == 1 &&
			sel.MatchExpressions[0].ScopeName == corev1.ResourceQuotaScopePriorityClass &&
			slices.Contains(sel.MatchExpressions[0].Values, "system-node-critical") {
			admits = true
		}
	}
	if !admits {
		t.Errorf("quotas %+v: want one admitting system-node-critical pods in %s", quotas, namespace)
	}
}
