// Package kubeid names the Kubernetes pod and container a cgroup belongs to: the forms the
// kubelet's cgroup drivers and the container runtimes give cgroup paths (path.go), and, through
// the container runtime's CRI and the API server, the names behind their ids (resolver.go).
package kubeid

import "strings"

// Level is how deep in the kubelet's tree a cgroup is.
type Level int

const (
	LevelNone      Level = iota // not a Kubernetes cgroup
	LevelRoot                   // kubepods itself
	LevelQoS                    // kubepods/burstable, kubepods/besteffort
	LevelPod                    // a pod's cgroup: pod<uid>
	LevelContainer              // a container's (or the pod sandbox's), or a cgroup below it
)

// Kubernetes QoS classes as the kubelet groups pod cgroups; guaranteed pods sit directly below
// kubepods.
const (
	QoSGuaranteed = "guaranteed"
	QoSBurstable  = "burstable"
	QoSBestEffort = "besteffort"
	kubepodsRoot  = "kubepods"
)

// Ref is what a cgroup's path alone says about its pod and container.
type Ref struct {
	Level Level
	// QoS is the class the path files the pod under; "" when the path has no kubepods level.
	QoS    string
	PodUID string // with dashes, whichever driver wrote it
	// ContainerID is the runtime's id of the container (or pod sandbox) the cgroup is, or is
	// below, in full.
	ContainerID string
}

// ParsePath reads a cgroup path (below the hierarchy root, v1 or v2) the way the kubelet and the
// container runtimes write them:
//   - cgroupfs driver: /kubepods[/burstable|/besteffort]/pod<uid>[/<container id>] (containerd),
//     .../pod<uid>/crio-<id> (CRI-O);
//   - systemd driver: /kubepods.slice[/kubepods-burstable.slice]/kubepods[-burstable]-pod<uid
//     with underscores>.slice[/cri-containerd-<id>.scope | crio-<id>.scope | docker-<id>.scope];
//   - kubepods nested below another cgroup (a kubelet --cgroup-root, kind nodes' prefixed
//     slices: kubelet-kubepods-besteffort.slice);
//   - a container outside kubepods (a kubelet without per-QoS cgroups leaves the runtime to
//     place containers, containerd at /k8s.io/<id>): a full 64-hex id, bare or with a runtime's
//     prefix, as the path's leaf or an ancestor. Only the CRI knows its pod then.
//
// A cgroup below a container's (runc's init, a systemd scope's sub-cgroups) is that container.
func ParsePath(cgroup string) Ref {
	elems := strings.Split(strings.Trim(cgroup, "/"), "/")
	i := kubepodsAt(elems)
	if i < 0 {
		return bareContainer(elems)
	}
	rest := elems[i+1:]
	r := Ref{Level: LevelRoot, QoS: QoSGuaranteed}
	if len(rest) > 0 {
		if q := kubeName(rest[0]); q == QoSBurstable || q == QoSBestEffort {
			r.QoS, r.Level, rest = q, LevelQoS, rest[1:]
		}
	}
	if len(rest) == 0 {
		return r
	}
	uid, isPod := strings.CutPrefix(kubeName(rest[0]), "pod")
	if !isPod || uid == "" {
		return Ref{}
	}
	r.Level, r.PodUID = LevelPod, strings.ReplaceAll(uid, "_", "-")
	if len(rest) > 1 {
		r.Level, r.ContainerID = LevelContainer, containerID(rest[1])
	}
	return r
}

// Kubepods is the kubelet's cgroup of every pod that cgroup is at or below (/kubepods,
// /kubepods.slice, a nested or prefixed one), as ParsePath finds it; "" outside kubepods.
func Kubepods(cgroup string) string {
	elems := strings.Split(strings.Trim(cgroup, "/"), "/")
	i := kubepodsAt(elems)
	if i < 0 {
		return ""
	}
	return "/" + strings.Join(elems[:i+1], "/")
}

// kubepodsAt is the index of the path's kubepods element, -1 when it has none.
func kubepodsAt(elems []string) int {
	for i, e := range elems {
		if kubeName(e) == kubepodsRoot {
			return i
		}
	}
	return -1
}

// bareContainer finds a container's cgroup outside kubepods: the first element, from the root,
// that is a runtime's full container id.
func bareContainer(elems []string) Ref {
	for _, e := range elems {
		if id := containerID(e); isFullID(id) {
			return Ref{Level: LevelContainer, ContainerID: id}
		}
	}
	return Ref{}
}

// isFullID: containerd, CRI-O and Docker ids are 64 lower-case hex digits.
func isFullID(id string) bool {
	if len(id) != 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// kubeName is the last part of a kubepods cgroup's name, as the cgroupfs driver writes it:
// kubepods, burstable, pod<uid>. The systemd driver's kubepods-burstable-pod<uid>.slice (the
// uid's dashes made underscores) reads as pod<uid> with underscores.
func kubeName(elem string) string {
	name, isSlice := strings.CutSuffix(elem, ".slice")
	if !isSlice {
		return elem
	}
	if i := strings.LastIndexByte(name, '-'); i >= 0 {
		return name[i+1:]
	}
	return name
}

// containerID is the container id a runtime names a container's cgroup after: <id> (cgroupfs),
// cri-containerd-<id>.scope, crio-<id>.scope, crio-<id> (CRI-O, cgroupfs), docker-<id>.scope.
func containerID(elem string) string {
	id := strings.TrimSuffix(elem, ".scope")
	if i := strings.LastIndexByte(id, '-'); i >= 0 {
		id = id[i+1:]
	}
	return id
}
