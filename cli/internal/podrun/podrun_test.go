package podrun

import (
	"strings"
	"testing"

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
