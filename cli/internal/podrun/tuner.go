package podrun

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodectl/nodectl/cli/internal/remote"
)

// The node's tuner, `nodectl tune` in a pod of the run's namespace: the agent runs without the
// privileges that change a node's sysctls, files, mounts and cgroups, so a short-lived
// privileged pod in the node's own namespaces does, with the node's root at HostRoot and the
// state file where a `nodectl tune` run on the node keeps it.
const (
	// LabelTune marks a tuner pod with its tune command (apply, rollback, ...).
	LabelTune = "nodectl.io/tune"
	// LabelKept marks a tuner pod kept after it ended: a validation's apply, kept until its
	// rollback. While one is in a namespace, the node may hold a profile the run applied, and
	// Clean rolls it back before it deletes the namespace. (A `tune apply --node` the user ran
	// is not kept, and never rolled back by Clean.)
	LabelKept = "nodectl.io/tune-kept"
	// HostRoot is where a tuner pod sees the node's root filesystem.
	HostRoot = "/host"
)

// PodSecurity's labels that admit the tuner's privileged pod in the run's namespace (a
// cluster may enforce baseline or restricted by default).
var privilegedNamespace = map[string]string{
	"pod-security.kubernetes.io/enforce": "privileged",
	"pod-security.kubernetes.io/warn":    "privileged",
	"pod-security.kubernetes.io/audit":   "privileged",
}

// StartTuner is Start for a run that runs the node's tuner: its namespace admits privileged
// pods, which deploy/base's policies allow only to those who may tune the node.
func StartTuner(ctx context.Context, c *remote.Cluster, node, id string, progress io.Writer, extra ...remote.Permission) (*Run, error) {
	return start(ctx, c, node, id, progress, privilegedNamespace, append(extra, tunePermission(node))...)
}

// TuneResult is a tuner pod's end: its exit code and its log (its standard output and error,
// as the kubelet keeps them).
type TuneResult struct {
	Pod      string
	ExitCode int32
	Log      []byte
}

// Tune runs `nodectl tune <command> --host-root /host args...` on the node in a privileged pod
// named name (host network and PID namespaces, the node's root at /host), waits until it ends
// and returns its exit code and log. The pod is deleted afterwards unless keep (an apply's is
// kept as the mark that the node may hold the profile). An error is a tuner that did not run
// or whose end is unknown; a tuner that ran and failed is a non-zero ExitCode.
func (r *Run) Tune(ctx context.Context, name, command string, keep bool, args ...string) (*TuneResult, error) {
	if r.privateRoot {
		return r.tune(ctx, name, command, keep, corev1.MountPropagationNone, args)
	}
	res, err := r.tune(ctx, name, command, keep, corev1.MountPropagationBidirectional, args)
	if err != nil && strings.Contains(err.Error(), "not a shared mount") {
		r.privateRoot = true
		// The node's / is private (no systemd made it shared): the runtime refuses
		// Bidirectional. The tuner then runs without, and refuses the one setting that needs
		// it (the journal's storage, a bind mount the node must see).
		fmt.Fprintf(r.progress, "node %s: / is not a shared mount; the tuner pod runs without mount propagation\n", r.Node)
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if derr := r.DeletePodWait(dctx, name, 0); derr != nil {
			return nil, derr
		}
		res, err = r.tune(ctx, name, command, keep, corev1.MountPropagationNone, args)
	}
	return res, err
}

// TunerDeadline is how long a tuner pod may run before the kubelet stops it (SIGTERM: an
// interrupted apply restores what it changed, in its 30 s of grace), so that a tuner whose CLI
// was killed cannot hang on the node: twice what the CLI waits for a step.
const TunerDeadline = 10 * time.Minute

// tunerPod is the privileged pod that runs `nodectl tune command` on the node.
func (r *Run) tunerPod(name, command string, keep bool, propagation corev1.MountPropagationMode, args []string) *corev1.Pod {
	labels := r.labels()
	labels[LabelTune] = command
	if keep {
		labels[LabelKept] = "true"
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: r.Namespace, Labels: labels},
		Spec: corev1.PodSpec{
			NodeName:                      r.Node,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: new(int64(30)), // an interrupted apply restores what it changed
			ActiveDeadlineSeconds:         new(int64(TunerDeadline / time.Second)),
			Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			AutomountServiceAccountToken:  new(false),
			// The node's namespaces: net.* sysctls are the writer's network namespace's, and
			// the reserved CPUs' daemons are found by PID.
			HostNetwork: true,
			HostPID:     true,
			Containers: []corev1.Container{{
				Name: "tune", Image: r.Image, ImagePullPolicy: corev1.PullIfNotPresent,
				Args: append([]string{"tune", command, "--host-root", HostRoot}, args...),
				SecurityContext: &corev1.SecurityContext{
					Privileged: new(true),
					RunAsUser:  new(int64(0)),
				},
				// Bidirectional: a mount the tuner makes under /host (the journal's storage) is
				// the node's, not the pod's alone.
				VolumeMounts: []corev1.VolumeMount{{Name: "host", MountPath: HostRoot, MountPropagation: &propagation}},
			}},
			Volumes: []corev1.Volume{{Name: "host", VolumeSource: corev1.VolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: "/", Type: new(corev1.HostPathDirectory)}}}},
		},
	}
}

func (r *Run) tune(ctx context.Context, name, command string, keep bool, propagation corev1.MountPropagationMode, args []string) (*TuneResult, error) {
	pod := r.tunerPod(name, command, keep, propagation, args)
	if err := r.create(ctx, pod); err != nil {
		return nil, fmt.Errorf("creating the tuner pod %s/%s: %w", r.Namespace, name, err)
	}
	// A tuner that cannot run goes at once, whatever keep says: it marks nothing.
	code, err := r.waitEnded(ctx, name)
	if !keep || err != nil {
		defer func() {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			if err := r.DeletePod(dctx, name); err != nil {
				fmt.Fprintf(r.progress, "nodectl: %v\n", err)
			}
		}()
	}
	if err != nil {
		return nil, err
	}
	log, err := r.c.PodLog(ctx, r.Namespace, name, "tune", time.Time{})
	if err != nil {
		return nil, err
	}
	return &TuneResult{Pod: r.Namespace + "/" + name, ExitCode: code, Log: log}, nil
}

// waitEnded waits until the pod's container has ended and returns its exit code; a pod that
// cannot run is an error.
func (r *Run) waitEnded(ctx context.Context, name string) (int32, error) {
	for {
		pods, err := r.c.ListPods(ctx, r.Namespace)
		if err != nil {
			return 0, err
		}
		for _, p := range pods {
			if p.Name != name {
				continue
			}
			for _, cs := range p.Status.ContainerStatuses {
				if t := cs.State.Terminated; t != nil {
					return t.ExitCode, nil
				}
			}
			if p.Status.Phase == corev1.PodFailed {
				return 0, fmt.Errorf("tuner pod %s/%s failed: %s %s", p.Namespace, p.Name, p.Status.Reason, p.Status.Message)
			}
			if err := podFailed(&p); err != nil {
				return 0, err
			}
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("waiting for the tuner pod %s/%s: %w", r.Namespace, name, context.Cause(ctx))
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// rollbackLeft rolls back the profile a killed `tune validate --node` may have left applied:
// when the namespace holds a kept apply pod, a rollback pod of the same image restores the node
// (nothing applied is not an error). It says whether it rolled back.
func rollbackLeft(ctx context.Context, c *remote.Cluster, ns, node string, progress io.Writer) (bool, error) {
	pods, err := c.ListPods(ctx, ns)
	if err != nil {
		return false, err
	}
	for _, p := range pods {
		if p.Labels[LabelKept] != "true" || p.Spec.NodeName != node {
			continue
		}
		// The agent's image, not the kept pod's: whoever could label a pod must not choose
		// what runs privileged on the node with the caller's rights.
		image, err := agentImage(ctx, c, node)
		if err != nil {
			return false, err
		}
		r := &Run{ID: p.Labels[LabelRun], Namespace: ns, Node: node, Image: image, c: c, progress: progress}
		fmt.Fprintf(progress, "namespace %s applied a profile on node %s: rolling it back\n", ns, r.Node)
		res, err := r.Tune(ctx, "tune-rollback-clean", "rollback", false, "--missing-ok")
		if err != nil {
			return false, err
		}
		if res.ExitCode != 0 {
			return false, fmt.Errorf("rolling back on node %s (pod %s) exited %d: %s", r.Node, res.Pod, res.ExitCode, strings.TrimSpace(string(res.Log)))
		}
		fmt.Fprintf(progress, "%s", res.Log)
		return true, nil
	}
	return false, nil
}

// create creates pod, waiting a little for a new namespace's default ServiceAccount, which
// admission wants and a controller makes right after the namespace.
func (r *Run) create(ctx context.Context, pod *corev1.Pod) error {
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		err := r.c.CreatePod(ctx, pod)
		if err == nil || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "serviceaccount") || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
	}
}
