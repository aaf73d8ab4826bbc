package remote

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The API's port comes from the agent container's --api-listen; an agent without it is told to
// be redeployed.
func TestAPIPort(t *testing.T) {
	pod := func(args ...string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "nodectl-system", Name: "a"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "tuner", Args: []string{"--api-listen=127.0.0.1:1"}}, {Name: "agent", Args: args}}}}
	}
	if p, err := apiPort(pod("agent", "--api-listen=127.0.0.1:9562")); err != nil || p != 9562 {
		t.Errorf("port %d, %v; want 9562", p, err)
	}
	if _, err := apiPort(pod("agent")); err == nil || !strings.Contains(err.Error(), "serves no API to port-forward to") {
		t.Errorf("an agent without --api-listen: %v", err)
	}
}

func TestDeniedErrorNamesThePermission(t *testing.T) {
	err := &DeniedError{Permission: Permission{Verb: "create", Resource: "pods", Subresource: "portforward", Namespace: "nodectl-system"},
		Context: "dev", Why: "reaching the agent"}
	for _, want := range []string{`context "dev" may not create pods/portforward in namespace nodectl-system`, "reaching the agent", "nodectl-user"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
}
