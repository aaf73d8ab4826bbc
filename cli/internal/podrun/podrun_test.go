package podrun

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
