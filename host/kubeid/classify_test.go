package kubeid

import "testing"

func TestClassify(t *testing.T) {
	const (
		uid  = "0a1b2c3d-4e5f-6789-abcd-ef0123456789"
		usid = "0a1b2c3d_4e5f_6789_abcd_ef0123456789" // as the systemd driver writes it
		cid  = "3f2a9c0d1e4b5a6978877665544332211ffeeddccbbaa99887766554433221100"
	)
	for _, c := range []struct{ path, want, kind string }{
		{"/", "/", KindSystem},
		{"", "/", KindSystem},
		// systemd units, and cgroups below one.
		{"/system.slice/kubelet.service", "kubelet.service", KindSystem},
		{"/system.slice/containerd.service", "containerd.service", KindSystem},
		{"/system.slice/containerd.service/extra", "containerd.service", KindSystem},
		{"/system.slice", "system.slice", KindSystem},
		{"/init.scope", "init.scope", KindSystem},
		{"/user.slice/user-1000.slice/user@1000.service/app.slice/dbus.service", "dbus.service", KindSystem},
		// kubepods, systemd driver.
		{"/kubepods.slice", "kubepods", KindOther},
		{"/kubepods.slice/kubepods-burstable.slice", "kubepods/burstable", KindOther},
		{"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + usid + ".slice", "kubepods/burstable/pod" + uid, KindPod},
		{"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + usid + ".slice/cri-containerd-" + cid + ".scope",
			"kubepods/burstable/pod" + uid + "/" + cid[:12], KindContainer},
		{"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + usid + ".slice/crio-" + cid + ".scope",
			"kubepods/besteffort/pod" + uid + "/" + cid[:12], KindContainer},
		{"/kubepods.slice/kubepods-pod" + usid + ".slice", "kubepods/guaranteed/pod" + uid, KindPod},
		{"/kubepods.slice/kubepods-pod" + usid + ".slice/docker-" + cid + ".scope", "kubepods/guaranteed/pod" + uid + "/" + cid[:12], KindContainer},
		// A container's sub-cgroup is the container.
		{"/kubepods.slice/kubepods-pod" + usid + ".slice/cri-containerd-" + cid + ".scope/init", "kubepods/guaranteed/pod" + uid + "/" + cid[:12], KindContainer},
		// kubepods nested below another cgroup, prefixed slice names (kind nodes).
		{"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod" + usid + ".slice",
			"kubepods/besteffort/pod" + uid, KindPod},
		// kubepods, cgroupfs driver.
		{"/kubepods", "kubepods", KindOther},
		{"/kubepods/burstable", "kubepods/burstable", KindOther},
		{"/kubepods/burstable/pod" + uid, "kubepods/burstable/pod" + uid, KindPod},
		{"/kubepods/burstable/pod" + uid + "/" + cid, "kubepods/burstable/pod" + uid + "/" + cid[:12], KindContainer},
		{"/kubepods/besteffort/pod" + uid + "/" + cid, "kubepods/besteffort/pod" + uid + "/" + cid[:12], KindContainer},
		{"/kubepods/pod" + uid + "/" + cid, "kubepods/guaranteed/pod" + uid + "/" + cid[:12], KindContainer},
		// nodectl's own.
		{"/nodectl/r1/victim", "nodectl/victim", KindNodectl},
		{"/nodectl/20260101-120000-noisy/cpu-hog-0", "nodectl/cpu-hog-0", KindNodectl},
		{"/nodectl/r1/sandbox-3/inner", "nodectl/sandbox-3", KindNodectl},
		{"/nodectl/system", "nodectl/system", KindNodectl},
		{"/nodectl", "nodectl", KindNodectl},
		// Anything else: its last two elements.
		{"/docker/" + cid, "docker/" + cid, KindOther},
		{"/a/b/c", "b/c", KindOther},
		{"/lonely", "lonely", KindOther},
		{"/kubepods/not-a-pod", "kubepods/not-a-pod", KindOther},
	} {
		got, kind := Classify(c.path)
		if got != c.want || kind != c.kind {
			t.Errorf("Classify(%q) = %q, %q; want %q, %q", c.path, got, kind, c.want, c.kind)
		}
	}
}
