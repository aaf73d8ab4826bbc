// Package podrun runs a stress scenario's workloads as real pods on one node of a cluster,
// through the API server: a namespace of the run's own, pods pinned to the node with the
// requests, limits and RuntimeClass asked for, running the agent's own image (the workload
// bodies are in the nodectl binary), and everything deleted on every exit path. A run's
// namespace is labelled with the run and the node, so that Clean finds what a killed CLI left.
package podrun

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nodectl/nodectl/stress"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodectl/nodectl/cli/internal/remote"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/stress/workload"
)

// Labels of a run's namespace and pods.
const (
	LabelRun     = "nodectl.io/run"
	LabelNode    = "nodectl.io/node"
	LabelPartOf  = "app.kubernetes.io/part-of"
	LabelPartVal = "nodectl-stress"
	// WorkDir is each pod's emptyDir, where the victim and the disk hogs write: the node's
	// disk, as a pod's writable layer or emptyDir is.
	WorkDir = "/work"
)

// AnnotationCreatedBy names the user who made a run's namespace, the one its RoleBinding
// binds: deploy/base's admission policies hold both to the user making them.
const AnnotationCreatedBy = "nodectl.io/created-by"

// startPermissions are what starting a run needs outside its namespace, deploy/base's
// ClusterRole nodectl-stress: make the namespace, bind the run's rights in it, read the node.
func startPermissions() []remote.Permission {
	return []remote.Permission{
		{Verb: "create", Resource: "namespaces", Role: remote.RoleStress},
		{Verb: "get", Resource: "namespaces", Role: remote.RoleStress},
		{Verb: "create", Group: rbacv1.GroupName, Resource: "rolebindings", Role: remote.RoleStress},
		{Verb: "bind", Group: rbacv1.GroupName, Resource: "clusterroles", Name: remote.RoleStressRun, Role: remote.RoleStress},
		{Verb: "get", Resource: "nodes", Role: remote.RoleStress},
	}
}

// runPermissions are what a run does in its namespace ns, deploy/base's ClusterRole
// nodectl-stress-run, which the run binds to its creator there: its pods, their logs (the
// workloads' measurements) and standard input (a storm's go), and the namespace itself.
func runPermissions(ns string) []remote.Permission {
	in := func(verb, resource, sub, name string) remote.Permission {
		return remote.Permission{Verb: verb, Resource: resource, Subresource: sub, Namespace: ns, Name: name, Role: remote.RoleStressRun}
	}
	return append([]remote.Permission{in("create", "pods", "", ""), in("delete", "pods", "", ""), in("list", "pods", "", ""),
		in("get", "pods", "log", ""), in("delete", "namespaces", "", ns)},
		remote.AttachPermissions(ns)...)
}

// tunePermission is deploy/base's ClusterRole nodectl-tune's one right, a verb of nodectl's
// own: running privileged tuner pods on node. Its admission policy asks the authorizer for it.
func tunePermission(node string) remote.Permission {
	return remote.Permission{Verb: "tune", Group: "nodectl.io", Resource: "nodes", Name: node, Role: remote.RoleTune}
}

// PodSecurity's labels for a stress run's namespace: its workloads are restricted's (nobody,
// no capability, RuntimeDefault seccomp), and deploy/base's policy refuses a run's namespace
// with a laxer level unless its creator may tune the node.
var restrictedNamespace = map[string]string{
	"pod-security.kubernetes.io/enforce": "restricted",
	"pod-security.kubernetes.io/warn":    "restricted",
	"pod-security.kubernetes.io/audit":   "restricted",
}

// Spec is one workload pod.
type Spec struct {
	Name            string   // the pod's name and its container's
	Args            []string // the nodectl command line: workload <kind> ...
	CPULimitMilli   int64
	CPURequestMilli int64
	MemoryLimit     int64
	MemoryRequest   int64
	RuntimeClass    string // "" for the cluster's default runtime
	Stdin           bool   // its standard input open, for Attach
	// Image is the container's image when it is not the agent's (a density sandbox in the
	// user's image): an init container of the agent's image copies nodectl (a static binary,
	// which runs in any Linux image) into a volume the container runs it from.
	Image string
}

// nodectlDir is where a container of another image finds nodectl.
const nodectlDir = "/nodectl-bin"

// Run is a run's namespace on a node.
type Run struct {
	ID, Namespace, Node, Image string
	c                          *remote.Cluster
	progress                   io.Writer
	// privateRoot: the node's / is not a shared mount, so its tuner pods run without mount
	// propagation (learnt from the first one the runtime refused).
	privateRoot bool
	// deadline is when the run's workload pods are past any plan (SetSpan): the kubelet stops
	// them then even if the CLI that would delete them was killed. Zero: none.
	deadline time.Time
}

// startMargin is what a run's pods may spend starting (an image pull, several waves of pods)
// beyond the phases' span before their deadline.
const startMargin = 2*podStartTimeout + 5*time.Minute

// SetSpan gives the run's workload pods created from now on a deadline (activeDeadlineSeconds)
// of span, the scenario's phases at their longest, plus startMargin.
func (r *Run) SetSpan(span time.Duration) { r.deadline = time.Now().Add(span + startMargin) }

// workloadSecurity is a workload pod's: nobody, no capability, no way to gain one, the
// runtime's default syscall filter. The workloads burn CPU, write and fsync their emptyDir and
// touch memory: nothing a privilege helps with.
func workloadSecurity() (*corev1.PodSecurityContext, *corev1.SecurityContext) {
	return &corev1.PodSecurityContext{RunAsNonRoot: new(true), RunAsUser: new(int64(65534)), RunAsGroup: new(int64(65534)),
			SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
		&corev1.SecurityContext{AllowPrivilegeEscalation: new(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}
}

// Progress is where the run tells what it does.
func (r *Run) Progress() io.Writer { return r.progress }

// Start checks the user's rights (those of every run, and extra outside its namespace), finds
// the node's agent pod (whose image the workloads run), creates the run's namespace and binds
// the user to nodectl-stress-run in it.
func Start(ctx context.Context, c *remote.Cluster, node, id string, progress io.Writer, extra ...remote.Permission) (*Run, error) {
	return start(ctx, c, node, id, progress, restrictedNamespace, extra...)
}

// start is Start with PodSecurity's labels on the namespace.
func start(ctx context.Context, c *remote.Cluster, node, id string, progress io.Writer, security map[string]string, extra ...remote.Permission) (*Run, error) {
	if err := c.Require(ctx, "a stress run through the API server", append(startPermissions(), extra...)...); err != nil {
		return nil, err
	}
	image, err := agentImage(ctx, c, node)
	if err != nil {
		return nil, err
	}
	user, err := c.WhoAmI(ctx)
	if err != nil {
		return nil, err
	}
	r := &Run{ID: id, Namespace: namespaceOf(id), Node: node, Image: image, c: c, progress: progress}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.Namespace, Labels: r.labels(),
		Annotations: map[string]string{AnnotationCreatedBy: user.Username}}}
	maps.Copy(ns.Labels, security)
	if err := c.CreateNamespace(ctx, ns); err != nil {
		return nil, err
	}
	if err := r.bind(ctx, user.Username); err != nil {
		// Its creator's rights in it were to come from the binding; an admin's reach further.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if derr := c.DeleteNamespace(dctx, r.Namespace); derr != nil && !apierrors.IsNotFound(derr) {
			return nil, fmt.Errorf("%w; namespace %s is left (deleting it: %v): a cluster admin removes it", err, r.Namespace, derr)
		}
		return nil, err
	}
	fmt.Fprintf(progress, "namespace %s on node %s, image %s\n", r.Namespace, node, image)
	return r, nil
}

// bind gives user the run's rights in its namespace (a RoleBinding to nodectl-stress-run) and
// waits until the API server's authorizer has them: its RBAC cache follows bindings shortly.
func (r *Run) bind(ctx context.Context, user string) error {
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: remote.RoleStressRun, Namespace: r.Namespace, Labels: r.labels()},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: remote.RoleStressRun},
		Subjects:   []rbacv1.Subject{subjectOf(user)},
	}
	if err := r.c.CreateRoleBinding(ctx, rb); err != nil {
		return err
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		err := r.c.Require(ctx, "a stress run's pods", runPermissions(r.Namespace)...)
		var denied *remote.DeniedError
		if err == nil || !errors.As(err, &denied) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// subjectOf is the RBAC subject of an authenticated user name: a ServiceAccount's
// (system:serviceaccount:NAMESPACE:NAME) or a user's.
func subjectOf(user string) rbacv1.Subject {
	if rest, ok := strings.CutPrefix(user, "system:serviceaccount:"); ok {
		if ns, name, ok := strings.Cut(rest, ":"); ok && ns != "" && name != "" && !strings.Contains(name, ":") {
			return rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}
		}
	}
	return rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}
}

func (r *Run) labels() map[string]string {
	return map[string]string{LabelRun: r.ID, LabelNode: r.Node, LabelPartOf: LabelPartVal}
}

// Launch creates s's pod on the node.
func (r *Run) Launch(ctx context.Context, s Spec) error { return r.create(ctx, r.podOf(s)) }

// podOf is s's pod.
func (r *Run) podOf(s Spec) *corev1.Pod {
	res := corev1.ResourceRequirements{Limits: corev1.ResourceList{}, Requests: corev1.ResourceList{}}
	if s.CPULimitMilli > 0 {
		res.Limits[corev1.ResourceCPU] = *resource.NewMilliQuantity(s.CPULimitMilli, resource.DecimalSI)
	}
	if s.CPURequestMilli > 0 {
		res.Requests[corev1.ResourceCPU] = *resource.NewMilliQuantity(s.CPURequestMilli, resource.DecimalSI)
	}
	if s.MemoryLimit > 0 {
		res.Limits[corev1.ResourceMemory] = *resource.NewQuantity(s.MemoryLimit, resource.BinarySI)
	}
	if s.MemoryRequest > 0 {
		res.Requests[corev1.ResourceMemory] = *resource.NewQuantity(s.MemoryRequest, resource.BinarySI)
	}
	podSec, sec := workloadSecurity()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: r.Namespace, Labels: r.labels()},
		Spec: corev1.PodSpec{
			// Pinned: the scheduler is not asked (the node is the one under test, full or not).
			NodeName:      r.Node,
			RestartPolicy: corev1.RestartPolicyNever,
			// A deleted workload has nothing to save.
			TerminationGracePeriodSeconds: new(int64(1)),
			Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			AutomountServiceAccountToken:  new(false),
			SecurityContext:               podSec,
			Containers: []corev1.Container{{
				Name: s.Name, Image: r.Image, ImagePullPolicy: corev1.PullIfNotPresent,
				Args: s.Args, Resources: res, Stdin: s.Stdin, SecurityContext: sec,
				VolumeMounts: []corev1.VolumeMount{{Name: "work", MountPath: WorkDir}},
			}},
			Volumes: []corev1.Volume{{Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		},
	}
	if !r.deadline.IsZero() {
		pod.Spec.ActiveDeadlineSeconds = new(max(int64(time.Until(r.deadline).Seconds()), 60))
	}
	if s.RuntimeClass != "" {
		pod.Spec.RuntimeClassName = &s.RuntimeClass
	}
	if s.Image != "" {
		bin := corev1.VolumeMount{Name: "nodectl", MountPath: nodectlDir}
		pod.Spec.InitContainers = []corev1.Container{{
			Name: "nodectl", Image: r.Image, ImagePullPolicy: corev1.PullIfNotPresent,
			Args: workload.InstallArgs(nodectlDir), VolumeMounts: []corev1.VolumeMount{bin}, SecurityContext: sec,
		}}
		bin.ReadOnly = true
		c := &pod.Spec.Containers[0]
		c.Image, c.Command = s.Image, []string{nodectlDir + "/nodectl"}
		c.VolumeMounts = append(c.VolumeMounts, bin)
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "nodectl", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	}
	return pod
}

// Measurements reads the measurements a workload pod wrote on its standard output (the
// workload bodies' JSON lines, as a local run's launcher reads them), since a time if one is
// given (to the second: the caller drops what it already has); other lines are skipped.
func (r *Run) Measurements(ctx context.Context, pod string, since time.Time) ([]workload.Measurement, error) {
	b, err := r.c.PodLog(ctx, r.Namespace, pod, pod, since)
	if err != nil {
		return nil, err
	}
	var out []workload.Measurement
	for line := range bytes.Lines(b) {
		var m workload.Measurement
		if json.Unmarshal(line, &m) == nil && m.Metric != "" && !m.T.IsZero() {
			out = append(out, m)
		}
	}
	return out, nil
}

// WaitRunning waits until every pod named is running, and fails as soon as one cannot: it
// failed, or its container waits for a reason that will not pass (an image that cannot be
// pulled, a RuntimeClass the node lacks).
func (r *Run) WaitRunning(ctx context.Context, names ...string) error {
	for {
		pods, err := r.c.ListPods(ctx, r.Namespace)
		if err != nil {
			return err
		}
		running := 0
		for _, p := range pods {
			if !slices.Contains(names, p.Name) {
				continue
			}
			if err := podFailed(&p); err != nil {
				return err
			}
			if p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		if running == len(names) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for pods %s to run: %w", strings.Join(names, ", "), context.Cause(ctx))
		case <-time.After(time.Second):
		}
	}
}

// DeletePod deletes one pod of the run (a second's grace); Delete at the run's end waits for
// every pod to be gone.
func (r *Run) DeletePod(ctx context.Context, name string) error {
	if err := r.c.DeletePod(ctx, r.Namespace, name, 1); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting pod %s/%s: %w", r.Namespace, name, err)
	}
	return nil
}

// DeletePodWait deletes one pod of the run and waits until it is gone from the API server: the
// kubelet has stopped it and no longer counts its requests, and its name is free again.
func (r *Run) DeletePodWait(ctx context.Context, name string, grace int64) error {
	if err := r.c.DeletePod(ctx, r.Namespace, name, grace); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting pod %s/%s: %w", r.Namespace, name, err)
	}
	for {
		pods, err := r.c.ListPods(ctx, r.Namespace)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(pods, func(p corev1.Pod) bool { return p.Name == name }) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("deleting pod %s/%s: %w", r.Namespace, name, context.Cause(ctx))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Pods lists the run's pods.
func (r *Run) Pods(ctx context.Context) ([]corev1.Pod, error) {
	return r.c.ListPods(ctx, r.Namespace)
}

// Ending says whether and how a pod ended (rundir.PodEnd*, "" if it has not), with the reason
// and message the kubelet gave.
func Ending(p *corev1.Pod) (end, reason, message string) {
	for _, cs := range p.Status.ContainerStatuses {
		for _, t := range []*corev1.ContainerStateTerminated{cs.State.Terminated, cs.LastTerminationState.Terminated} {
			if t != nil && t.Reason == "OOMKilled" {
				return rundir.PodEndOOM, t.Reason, t.Message
			}
		}
	}
	switch {
	case p.Status.Phase == corev1.PodFailed && (strings.HasPrefix(p.Status.Reason, "OutOf") || p.Status.Reason == "UnexpectedAdmissionError"):
		return rundir.PodEndRefused, p.Status.Reason, p.Status.Message
	case p.Status.Phase == corev1.PodFailed && p.Status.Reason == "Evicted":
		return rundir.PodEndEvicted, p.Status.Reason, p.Status.Message
	case p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded:
		return rundir.PodEndFailed, p.Status.Reason, p.Status.Message
	}
	if err := podFailed(p); err != nil {
		return rundir.PodEndFailed, "", err.Error()
	}
	return "", "", ""
}

// Ready says whether the pod runs with every container ready.
func Ready(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Check fails when a pod of the run stopped running.
func (r *Run) Check(ctx context.Context) error {
	pods, err := r.c.ListPods(ctx, r.Namespace)
	if err != nil {
		return err
	}
	for _, p := range pods {
		if err := podFailed(&p); err != nil {
			return err
		}
		if p.Status.Phase == corev1.PodSucceeded {
			return fmt.Errorf("pod %s/%s exited", p.Namespace, p.Name)
		}
	}
	return nil
}

// stuckReasons are container waiting reasons that do not pass by waiting.
var stuckReasons = []string{"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName", "CreateContainerConfigError", "CreateContainerError", "RunContainerError", "CrashLoopBackOff"}

func podFailed(p *corev1.Pod) error {
	if p.Status.Phase == corev1.PodFailed {
		return fmt.Errorf("pod %s/%s failed: %s %s", p.Namespace, p.Name, p.Status.Reason, p.Status.Message)
	}
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil && slices.Contains(stuckReasons, w.Reason) {
			return fmt.Errorf("pod %s/%s cannot run: %s: %s", p.Namespace, p.Name, w.Reason, w.Message)
		}
		if t := cs.State.Terminated; t != nil && t.ExitCode != 0 {
			return fmt.Errorf("pod %s/%s exited with %d: %s %s", p.Namespace, p.Name, t.ExitCode, t.Reason, t.Message)
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return fmt.Errorf("pod %s/%s cannot be placed: %s", p.Namespace, p.Name, c.Message)
		}
	}
	return nil
}

// Delete removes the run's pods and namespace, and waits until the pods are gone. It is meant
// for a context of its own: the run's may be the one that ended.
func (r *Run) Delete(ctx context.Context) error {
	return deleteNamespace(ctx, r.c, r.Namespace, r.progress)
}

// deleteNamespace deletes the pods of a run's namespace (a second grace, then at once), waits
// until they are gone, then deletes the namespace. Deleting the pods first does not wait for
// the namespace's controller, and tells when they are gone.
func deleteNamespace(ctx context.Context, c *remote.Cluster, ns string, progress io.Writer) error {
	fmt.Fprintf(progress, "deleting namespace %s\n", ns)
	grace := int64(1)
	forcedAt := time.Now().Add(30 * time.Second)
	for {
		pods, err := c.ListPods(ctx, ns)
		if err != nil {
			return err
		}
		if len(pods) == 0 {
			break
		}
		if time.Now().After(forcedAt) {
			grace = 0
		}
		for _, p := range pods {
			if p.DeletionTimestamp == nil || grace == 0 {
				if err := c.DeletePod(ctx, ns, p.Name, grace); err != nil && !apierrors.IsNotFound(err) {
					return fmt.Errorf("deleting pod %s/%s: %w", ns, p.Name, err)
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("deleting the pods of namespace %s: %w (run: nodectl stress clean --node NODE)", ns, ctx.Err())
		case <-time.After(time.Second):
		}
	}
	if err := c.DeleteNamespace(ctx, ns); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting namespace %s: %w", ns, err)
	}
	// The namespace's controller finishes it; a short wait says when it did.
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
		if _, err := c.GetNamespace(ctx, ns); apierrors.IsNotFound(err) {
			return nil
		}
	}
	fmt.Fprintf(progress, "namespace %s is terminating (its pods are gone; the namespace controller removes it)\n", ns)
	return nil
}

// agentImage is the image of the node's agent, which every pod of a run runs: the only image
// nodectl runs with its users' rights, whatever a namespace or pod found on the cluster says.
func agentImage(ctx context.Context, c *remote.Cluster, node string) (string, error) {
	agent, err := c.AgentPod(ctx, node)
	if err != nil {
		return "", err
	}
	for _, ctr := range agent.Spec.Containers {
		if ctr.Name == "agent" && ctr.Image != "" {
			return ctr.Image, nil
		}
	}
	return "", fmt.Errorf("agent pod %s/%s has no container named agent: deploy it from deploy/base", agent.Namespace, agent.Name)
}

// namespaceOf is the namespace of run id.
func namespaceOf(id string) string { return "nodectl-" + id }

// ownRun says whether ns is a run's namespace as nodectl makes them, not only labelled so:
// named after its run label, a run id, on the node its label says. Labels are anyone's to set
// who may create a namespace; what clean does to a namespace (delete it, start a privileged
// rollback there) must need more than them.
func ownRun(ns corev1.Namespace, node string) bool {
	id := ns.Labels[LabelRun]
	return stress.IsRunID(id) && ns.Name == namespaceOf(id) && ns.Labels[LabelNode] != "" && (node == "" || ns.Labels[LabelNode] == node)
}

// Clean deletes every run's namespace left on node (all nodes when node is "") that the user's
// rights reach (the runs they made, or every run for an admin), and returns their names. A
// namespace where `tune validate --node` applied a profile is rolled back first, and kept when
// the rollback fails. A namespace labelled as a run's but not named as one, or another user's
// run, is left alone, and said.
func Clean(ctx context.Context, c *remote.Cluster, node string, progress io.Writer) ([]string, error) {
	if err := c.Require(ctx, "cleaning stress runs through the API server", remote.Permission{Verb: "list", Resource: "namespaces", Role: remote.RoleStress}); err != nil {
		return nil, err
	}
	sel := LabelPartOf + "=" + LabelPartVal
	if node != "" {
		sel += "," + LabelNode + "=" + node
	}
	list, err := c.ListNamespaces(ctx, sel)
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, ns := range list {
		if !ownRun(ns, node) {
			fmt.Fprintf(progress, "namespace %s carries nodectl's labels but is not a run's (%s=%q): left alone\n", ns.Name, LabelRun, ns.Labels[LabelRun])
			continue
		}
		if err := c.Require(ctx, "cleaning run "+ns.Name, runPermissions(ns.Name)...); err != nil {
			var denied *remote.DeniedError
			if !errors.As(err, &denied) {
				return removed, err
			}
			fmt.Fprintf(progress, "namespace %s is a run of %q: your rights do not reach it (a run's are its creator's): left alone\n", ns.Name, ns.Annotations[AnnotationCreatedBy])
			continue
		}
		if _, err := rollbackLeft(ctx, c, ns.Name, ns.Labels[LabelNode], progress); err != nil {
			errs = append(errs, fmt.Errorf("namespace %s kept: %w", ns.Name, err))
			continue
		}
		if err := deleteNamespace(ctx, c, ns.Name, progress); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, ns.Name)
	}
	return removed, errors.Join(errs...)
}
