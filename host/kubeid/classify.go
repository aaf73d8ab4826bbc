package kubeid

import (
	"strings"
)

// Kinds of a workload named by its path alone (Classify), besides KindPod and KindContainer:
// the kind label of every per-cgroup series the agent exports.
const (
	KindSystem  = "system" //rundir:other: a systemd unit, not the heartbeat's cgroup
	KindNodectl = "nodectl"
	KindOther   = "other" //rundir:other: not the block op
)

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
	if id, kind, ok := kubepods(path); ok {
		return id, kind
	}
	elems := strings.Split(path, "/")
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

// kubepods identifies a cgroup at or below the kubelet's kubepods cgroup (ParsePath).
func kubepods(cgroup string) (id, kind string, ok bool) {
	r := ParsePath(cgroup)
	switch r.Level {
	case LevelRoot:
		return kubepodsRoot, KindOther, true
	case LevelQoS:
		return kubepodsRoot + "/" + r.QoS, KindOther, true
	case LevelPod:
		return kubepodsRoot + "/" + r.QoS + "/pod" + r.PodUID, KindPod, true
	case LevelContainer:
		if r.PodUID == "" {
			return "", "", false // a bare container id: named by its path
		}
		return kubepodsRoot + "/" + r.QoS + "/pod" + r.PodUID + "/" + r.ContainerID[:min(len(r.ContainerID), 12)], KindContainer, true
	}
	return "", "", false
}
