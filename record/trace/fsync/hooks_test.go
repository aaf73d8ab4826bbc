package fsync

import (
	"strings"
	"testing"

	"github.com/prometheus/procfs"
)

func TestChooseHooks(t *testing.T) {
	mount := func(dev, point, fstype string, opts ...string) *procfs.MountInfo {
		m := &procfs.MountInfo{MajorMinorVer: dev, MountPoint: point, FSType: fstype, Source: "/dev/x", Options: map[string]string{}}
		for _, o := range opts {
			m.Options[o] = ""
		}
		return m
	}
	base := []*procfs.MountInfo{mount("254:0", "/", "ext4", "rw"), mount("0:25", "/proc", "proc", "rw"),
		mount("0:40", "/run/containerd/rootfs", "overlay", "rw"), mount("7:0", "/snap/core", "squashfs", "ro")}
	for _, c := range []struct {
		name   string
		mounts []*procfs.MountInfo
		want   Hooks
		why    string
	}{
		{"ext4 only", base, HooksExt4, "ext4"},
		{"writable xfs", append(base[:len(base):len(base)], mount("259:1", "/data", "xfs", "rw")), HooksSyscalls, "/data (xfs)"},
		{"read-only xfs", append(base[:len(base):len(base)], mount("259:1", "/data", "xfs", "ro")), HooksExt4, "ext4"},
		{"vfat", append(base[:len(base):len(base)], mount("8:1", "/boot/efi", "vfat", "rw")), HooksSyscalls, "/boot/efi (vfat)"},
	} {
		h, why, err := chooseHooks(c.mounts)
		if err != nil || h != c.want || !strings.Contains(why, c.why) {
			t.Errorf("%s: %q %q %v, want %q and a reason naming %q", c.name, h, why, err, c.want, c.why)
		}
	}
	if _, _, err := chooseHooks([]*procfs.MountInfo{mount("bad", "/x", "ext4")}); err == nil {
		t.Error("a device without MAJ:MIN: no error")
	}
	h, why, err := ChooseHooks("")
	if err != nil {
		t.Fatalf("ChooseHooks on this host: %v", err)
	}
	t.Logf("this host: %s (%s)", h, why)
}
