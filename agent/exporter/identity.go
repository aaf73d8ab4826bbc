package exporter

import "strings"

// Workload kinds: the kind label of every per-cgroup series.
const (
	KindSystem    = "system" //rundir:other: a systemd unit, not the heartbeat's cgroup
	KindPod       = "pod"
	KindContainer = "container"
	KindNodectl   = "nodectl"
	KindOther     = "other" //rundir:other: not the block op
)

// Identity is the workload a cgroup path stands for, a label value that outlives the cgroup's
// id and its runtime's naming: see Classify.
func Identity(cgroup string) string {
	id, _ := Classify(cgroup)
	return id
}

// Classify names the workload a cgroup (a path below the hierarchy root) belongs to, and its
// kind:
//   - a kubepods cgroup, cgroupfs driver (/kubepods/burstable/pod<uid>/<id>) or systemd driver
//     (/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope):
//     kubepods/<qos>/pod<uid> (KindPod), with /<first 12 of the container id> below it
//     (KindContainer); a guaranteed pod has no QoS level in its path and reads as guaranteed;
//     the kubepods and QoS cgroups themselves are kubepods and kubepods/<qos> (KindOther);
//   - nodectl's own, /nodectl/<run>/<workload>: nodectl/<workload>; /nodectl/<x> (a run's own
//     cgroup, the tuner's system cgroup): nodectl/<x> (KindNodectl);
//   - a systemd unit's cgroup, or one below it: the deepest unit's name, kubelet.service
//     (KindSystem);
//   - the root: / (KindSystem: kernel threads and whatever nobody placed);
//   - anything else: its last two path elements (KindOther).
//
// Cgroups below a container, a nodectl workload or a unit share its identity.
func Classify(cgroup string) (workload, kind string) {
	path := strings.Trim(cgroup, "/")
	if path == "" {
		return "/", KindSystem
	}
	elems := strings.Split(path, "/")
	if id, kind, ok := kubepods(elems); ok {
		return id, kind
	}
	if elems[0] == KindNodectl {
		switch len(elems) {
		case 1:
			return KindNodectl, KindNodectl
		case 2:
			return KindNodectl + "/" + elems[1], KindNodectl
		}
		return KindNodectl + "/" + elems[2], KindNodectl
	}
	for i := len(elems) - 1; i >= 0; i-- {
		if isUnit(elems[i]) {
			return elems[i], KindSystem
		}
	}
	if n := len(elems); n > 1 {
		return elems[n-2] + "/" + elems[n-1], KindOther
	}
	return elems[0], KindOther
}

// unitSuffixes are the systemd unit types that have cgroups.
var unitSuffixes = []string{".service", ".scope", ".slice", ".socket", ".mount", ".swap"}

func isUnit(elem string) bool {
	for _, s := range unitSuffixes {
		if strings.HasSuffix(elem, s) && len(elem) > len(s) {
			return true
		}
	}
	return false
}

// Kubernetes QoS classes as pod cgroups are grouped; guaranteed pods sit directly below
// kubepods.
const (
	qosBurstable  = "burstable"
	qosBestEffort = "besteffort"
	qosGuaranteed = "guaranteed"
	kubepodsRoot  = "kubepods"
)

// kubepods identifies a cgroup at or below the kubelet's kubepods cgroup, wherever that sits
// (a kind node nests it below another cgroup; the systemd driver may prefix the slices' names,
// kubelet-kubepods-burstable.slice).
func kubepods(elems []string) (id, kind string, ok bool) {
	i := 0
	for i < len(elems) && kubeName(elems[i]) != kubepodsRoot {
		i++
	}
	if i == len(elems) {
		return "", "", false
	}
	rest := elems[i+1:]
	qos := qosGuaranteed
	if len(rest) > 0 {
		if q := kubeName(rest[0]); q == qosBurstable || q == qosBestEffort {
			qos, rest = q, rest[1:]
		}
	}
	if len(rest) == 0 {
		if qos == qosGuaranteed {
			return kubepodsRoot, KindOther, true
		}
		return kubepodsRoot + "/" + qos, KindOther, true
	}
	pod, isPod := strings.CutPrefix(kubeName(rest[0]), "pod")
	if !isPod || pod == "" {
		return "", "", false
	}
	id = kubepodsRoot + "/" + qos + "/pod" + strings.ReplaceAll(pod, "_", "-")
	if len(rest) == 1 {
		return id, KindPod, true
	}
	return id + "/" + containerID(rest[1]), KindContainer, true
}

// kubeName is the last part of a kubepods cgroup's name, as the cgroupfs driver writes it:
// kubepods, burstable, pod<uid>. The systemd driver's kubepods-burstable-pod<uid>.slice (the uid's
// dashes made underscores) reads as pod<uid> with underscores.
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

// containerID is the first 12 characters of the container id a runtime names a container's
// cgroup after: <id> (cgroupfs), cri-containerd-<id>.scope, crio-<id>.scope, docker-<id>.scope.
func containerID(elem string) string {
	id := strings.TrimSuffix(elem, ".scope")
	if i := strings.LastIndexByte(id, '-'); i >= 0 {
		id = id[i+1:]
	}
	if len(id) > 12 {
		id = id[:12]
	}
	return id
}
