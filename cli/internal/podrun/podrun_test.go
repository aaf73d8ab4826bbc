package podrun

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/nodectl/nodectl/cli/internal/remote"
)

// A pod that cannot run ends the run at once, saying why; one still starting does not.
func TestPodFailed(t *testing.T) {
	pod := func(st corev1.PodStatus) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "nodectl-r", Name: "victim"}, Status: st}
	}
	waiting := func(reason string) corev1.PodStatus {
		return corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: "m"}}}}}
	}
	for name, c := range map[string]struct {
		st   corev1.PodStatus
		want string
	}{
		"creating":       {waiting("ContainerCreating"), ""},
		"running":        {corev1.PodStatus{Phase: corev1.PodRunning}, ""},
		"image_pull":     {waiting("ImagePullBackOff"), "cannot run: ImagePullBackOff"},
		"failed":         {corev1.PodStatus{Phase: corev1.PodFailed, Reason: "OutOfpods", Message: "Node didn't have enough resource: pods"}, "failed: OutOfpods"},
		"exited_nonzero": {corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled"}}}}}, "exited with 137: OOMKilled"},
		"unschedulable":  {corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, Message: "no"}}}, "cannot be placed"},
	} {
		err := podFailed(pod(c.st))
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v, want none", name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "nodectl-r/victim")):
			t.Errorf("%s: %v, want the pod named and %q", name, err, c.want)
		}
	}
}

// A workload pod runs as nobody with no capability and the runtime's seccomp filter, its init
// container too, and stops by itself past the run's span: a killed CLI leaves no hog burning.
func TestWorkloadPodsAreConfinedAndEnd(t *testing.T) {
	r := &Run{Namespace: "nodectl-x", Node: "n1", Image: "nodectl:1"}
	if p := r.podOf(Spec{Name: "cpu-hog-0"}); p.Spec.ActiveDeadlineSeconds != nil {
		t.Errorf("a pod of a run without a span has deadline %d", *p.Spec.ActiveDeadlineSeconds)
	}
	r.SetSpan(50 * time.Second)
	p := r.podOf(Spec{Name: "sandbox-0", Image: "chrome:1"})
	ps := p.Spec.SecurityContext
	if ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot || ps.RunAsUser == nil || *ps.RunAsUser == 0 ||
		ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod security context %+v: want non-root under RuntimeDefault seccomp", ps)
	}
	for _, c := range append(p.Spec.InitContainers, p.Spec.Containers...) {
		sc := c.SecurityContext
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil ||
			len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" || len(sc.Capabilities.Add) > 0 {
			t.Errorf("container %s: security context %+v, want every capability dropped and no escalation", c.Name, sc)
		}
	}
	want := (50*time.Second + startMargin).Seconds()
	if d := p.Spec.ActiveDeadlineSeconds; d == nil || float64(*d) > want || float64(*d) < want-5 {
		t.Errorf("deadline %v s, want the span and the start margin, %.0f s", d, want)
	}
}

// A tuner pod that hangs, its CLI killed, is stopped by the kubelet; the deadline of a kept
// apply pod, which has ended, stops nothing, so it still marks the node as holding a profile.
func TestTunerPodsEnd(t *testing.T) {
	r := &Run{ID: "tune-validate-20261205-213510-74f484", Namespace: "nodectl-r", Node: "n", Image: "nodectl:dev"}
	for _, keep := range []bool{false, true} {
		p := r.tunerPod("tune-apply", "apply", keep, corev1.MountPropagationNone, nil)
		if d := p.Spec.ActiveDeadlineSeconds; d == nil || time.Duration(*d)*time.Second != TunerDeadline {
			t.Errorf("kept %v: deadline %v, want %s", keep, d, TunerDeadline)
		}
		if got := p.Labels[LabelKept] == "true"; got != keep {
			t.Errorf("kept %v: labels %v", keep, p.Labels)
		}
	}
}

// Only a namespace named as nodectl names its runs is one: labels alone are anyone's to set.
func TestOwnRun(t *testing.T) {
	const id = "noisy-20261205-213510-74f484"
	labels := func(run, node string) map[string]string {
		return map[string]string{LabelRun: run, LabelNode: node, LabelPartOf: LabelPartVal}
	}
	for name, c := range map[string]struct {
		ns   corev1.Namespace
		node string
		want bool
	}{
		"a_run":            {corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "nodectl-" + id, Labels: labels(id, "n1")}}, "n1", true},
		"any_node":         {corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "nodectl-" + id, Labels: labels(id, "n1")}}, "", true},
		"another_node":     {corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "nodectl-" + id, Labels: labels(id, "n2")}}, "n1", false},
		"kube_system":      {corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-system", Labels: labels(id, "n1")}}, "n1", false},
		"run_label_forged": {corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "nodectl-x", Labels: labels("x", "n1")}}, "n1", false},
		"no_node":          {corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "nodectl-" + id, Labels: labels(id, "")}}, "", false},
	} {
		if got := ownRun(c.ns, c.node); got != c.want {
			t.Errorf("%s: ownRun = %v, want %v", name, got, c.want)
		}
	}
}

// Every right the CLI checks before and during a run is the one deploy/base grants for it: the
// start's in nodectl-stress, the run's in nodectl-stress-run, the tuner's in nodectl-tune, and
// none is granted by another of them (the run's rights are reached only through the binding).
func TestPermissionsAreDeployBases(t *testing.T) {
	f, err := os.Open(filepath.Join("..", "..", "..", "deploy", "base", "rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	roles := map[string][]rbacv1.PolicyRule{}
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	for {
		var cr rbacv1.ClusterRole
		if err := dec.Decode(&cr); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if cr.Kind == "ClusterRole" {
			roles[cr.Name] = cr.Rules
		}
	}
	grants := func(role string, p remote.Permission) bool {
		res := p.Resource
		if p.Subresource != "" {
			res += "/" + p.Subresource
		}
		return slices.ContainsFunc(roles[role], func(r rbacv1.PolicyRule) bool {
			return slices.Contains(r.APIGroups, p.Group) && slices.Contains(r.Resources, res) && slices.Contains(r.Verbs, p.Verb) &&
				(len(r.ResourceNames) == 0 || slices.Contains(r.ResourceNames, p.Name))
		})
	}
	perms := append(append(startPermissions(), runPermissions("nodectl-r")...), tunePermission("node-a"))
	for _, p := range perms {
		for _, role := range []string{remote.RoleStress, remote.RoleStressRun, remote.RoleTune} {
			if got, want := grants(role, p), role == p.Role; got != want {
				t.Errorf("%s: granted by %s: %v, want %v", p, role, got, want)
			}
		}
	}
}

// A run's RoleBinding binds the user the API server named: a ServiceAccount as one, anyone else
// as a user, whatever their name holds.
func TestSubjectOf(t *testing.T) {
	for user, want := range map[string]rbacv1.Subject{
		"alice@example.com":                 {Kind: "User", APIGroup: rbacv1.GroupName, Name: "alice@example.com"},
		"system:serviceaccount:ci:runner":   {Kind: "ServiceAccount", Namespace: "ci", Name: "runner"},
		"system:serviceaccount:ci":          {Kind: "User", APIGroup: rbacv1.GroupName, Name: "system:serviceaccount:ci"},
		"system:serviceaccount:ci:runner:x": {Kind: "User", APIGroup: rbacv1.GroupName, Name: "system:serviceaccount:ci:runner:x"},
		"system:node:gke-pool-1-abcd":       {Kind: "User", APIGroup: rbacv1.GroupName, Name: "system:node:gke-pool-1-abcd"},
	} {
		if got := subjectOf(user); got != want {
			t.Errorf("%s: %+v, want %+v", user, got, want)
		}
	}
}
