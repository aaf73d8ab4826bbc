package cri

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodectl/nodectl/host/cgroup"
)

const (
	testImage  = "registry.nodectl.test/crtest/sleeper:1"
	pauseImage = "registry.nodectl.test/crtest/pause:1"
	// testCgroup holds the pods given a cgroup parent; removed with everything below it.
	testCgroup = cgroup.Parent + "/crtest"
)

// TestSnapshotNamesRealContainers runs a private containerd 1.6 with its CRI plugin, starts two
// pods through the CRI (one without a cgroup parent, one below /nodectl/crtest) and checks that
// a Snapshot names each container, its sandbox, pod and handler, and that the container's
// cgroup path, as the kernel shows it, holds the container id.
func TestSnapshotNamesRealContainers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: starting containerd and runc containers needs root")
	}
	for _, bin := range []string{"containerd", "ctr", "containerd-shim-runc-v2", "runc"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("skipping: %s not installed (Debian: apt-get install containerd runc)", bin)
		}
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	archive := filepath.Join(dir, "image.tar")
	writeImage(t, dir, archive)
	e := startContainerd(t, dir)
	sock := e.sock
	out, err := exec.CommandContext(ctx, "ctr", "--address", sock, "-n", "k8s.io", "images", "import", archive).CombinedOutput()
	if err != nil {
		t.Fatalf("importing the test image: %v: %s", err, out)
	}

	c, err := Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("closing: %v", err)
		}
		if err := c.Close(); err != nil { // twice on purpose
			t.Errorf("closing twice: %v", err)
		}
	})

	type pod struct {
		name, uid, parent string
		sandbox, ctr      string
	}
	pods := []*pod{
		{name: "no-parent", uid: "11111111-0000-4000-8000-000000000001"},
		{name: "with-parent", uid: "11111111-0000-4000-8000-000000000002"},
	}
	pods[1].parent = testCgroup + "/pod" + pods[1].uid
	for _, p := range pods {
		p.sandbox, p.ctr = runPod(ctx, t, c, e, p.name, p.uid, p.parent)
	}

	s, err := c.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if nc, ns := s.Len(); nc != 2 || ns != 2 {
		t.Errorf("snapshot holds %d containers and %d sandboxes, want 2 and 2", nc, ns)
	}
	for _, p := range pods {
		ct, sb, ok := s.Container(p.ctr)
		if !ok {
			t.Fatalf("container %s of pod %s not in the snapshot", p.ctr, p.name)
		}
		wantCt := Container{ID: p.ctr, Name: "sleeper", PodSandboxID: p.sandbox}
		wantSb := Sandbox{ID: p.sandbox, PodUID: p.uid, PodName: p.name, PodNamespace: "crtest", RuntimeHandler: "runc"}
		if ct != wantCt {
			t.Errorf("container = %+v, want %+v", ct, wantCt)
		}
		if sb != wantSb {
			t.Errorf("container's sandbox = %+v, want %+v", sb, wantSb)
		}
		if got, ok := s.Sandbox(p.sandbox); !ok || got != wantSb {
			t.Errorf("Sandbox(%s) = %+v, %v, want %+v", p.sandbox, got, ok, wantSb)
		}

		for id, what := range map[string]string{p.ctr: "container", p.sandbox: "sandbox"} {
			lines := cgroupLines(ctx, t, c, id, what)
			t.Logf("pod %s (cgroup parent %q): %s %s's /proc/<pid>/cgroup:\n%s", p.name, p.parent, what, id[:12], strings.Join(lines, "\n"))
			for _, l := range lines {
				if !strings.Contains(l, id) {
					t.Errorf("pod %s: %s cgroup line %q does not hold its id", p.name, what, l)
				}
				if p.parent != "" && !strings.Contains(l, p.parent+"/") {
					t.Errorf("pod %s: %s cgroup line %q is not below its parent %s", p.name, what, l, p.parent)
				}
			}
		}
	}
	if _, _, ok := s.Container("no-such-container"); ok {
		t.Error("an unknown container was found")
	}
	if _, ok := s.Sandbox(pods[0].ctr); ok {
		t.Error("a container id was found as a sandbox")
	}
}

func TestDialNamesTheSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "missing.sock")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	_, err := Dial(ctx, sock)
	if err == nil || !strings.Contains(err.Error(), sock) {
		t.Fatalf("Dial of a missing socket: %v, want an error naming %s", err, sock)
	}
	if d := time.Since(start); d > dialTimeout+2*time.Second {
		t.Errorf("Dial took %v, want it bounded by %v", d, dialTimeout)
	}
}

// runPod starts a sandbox on the node's network and one container in it, and removes both at
// cleanup.
func runPod(ctx context.Context, t *testing.T, c *Client, e *env, pod, uid, parent string) (sandboxID, containerID string) {
	t.Helper()
	cfg := &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: pod, Uid: uid, Namespace: "crtest"},
		Linux: &runtimeapi.LinuxPodSandboxConfig{
			CgroupParent: parent,
			SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
				// The node's network: no CNI needed.
				NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE},
			},
		},
	}
	sb, err := c.rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg, RuntimeHandler: "runc"})
	if err != nil {
		t.Fatalf("running sandbox %s: %v", pod, err)
	}
	sandboxID = sb.GetPodSandboxId()
	e.ids = append(e.ids, sandboxID)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := c.rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sandboxID}); err != nil {
			t.Errorf("stopping sandbox %s: %v", pod, err)
		}
		if _, err := c.rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sandboxID}); err != nil {
			t.Errorf("removing sandbox %s: %v", pod, err)
		}
	})
	ct, err := c.rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
		PodSandboxId: sandboxID,
		Config: &runtimeapi.ContainerConfig{
			Metadata: &runtimeapi.ContainerMetadata{Name: "sleeper"},
			Image:    &runtimeapi.ImageSpec{Image: testImage},
			Linux:    &runtimeapi.LinuxContainerConfig{},
		},
		SandboxConfig: cfg,
	})
	if err != nil {
		t.Fatalf("creating the container of %s: %v", pod, err)
	}
	containerID = ct.GetContainerId()
	e.ids = append(e.ids, containerID)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := c.rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: containerID, Timeout: 5}); err != nil {
			t.Errorf("stopping the container of %s: %v", pod, err)
		}
		if _, err := c.rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: containerID}); err != nil {
			t.Errorf("removing the container of %s: %v", pod, err)
		}
	})
	if _, err := c.rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: containerID}); err != nil {
		t.Fatalf("starting the container of %s: %v", pod, err)
	}
	return sandboxID, containerID
}

// cgroupLines is /proc/<pid>/cgroup of a container's or sandbox's process, as the kernel shows
// it to us, without the hierarchies it leaves in the root (v1's named ones, rdma, misc).
func cgroupLines(ctx context.Context, t *testing.T, c *Client, id, what string) []string {
	t.Helper()
	var info string
	if what == "sandbox" {
		st, err := c.rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id, Verbose: true})
		if err != nil {
			t.Fatalf("sandbox status: %v", err)
		}
		info = st.GetInfo()["info"]
	} else {
		st, err := c.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
		if err != nil {
			t.Fatalf("container status: %v", err)
		}
		info = st.GetInfo()["info"]
	}
	var v struct{ Pid int }
	if err := json.Unmarshal([]byte(info), &v); err != nil || v.Pid == 0 {
		t.Fatalf("no pid in the %s's verbose status (%v): %.200s", what, err, info)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", v.Pid))
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for l := range strings.Lines(string(b)) {
		l = strings.TrimSpace(l)
		if _, path, _ := strings.Cut(strings.SplitN(l, ":", 2)[1], ":"); path != "/" {
			lines = append(lines, l)
		}
	}
	if len(lines) == 0 {
		t.Fatalf("the %s's process %d is in no cgroup but the roots", what, v.Pid)
	}
	return lines
}

// writeImage builds a static Go binary that waits for SIGTERM and writes it as a one-layer
// image in a docker archive, tagged as the test image and as the CRI's sandbox image.
func writeImage(t *testing.T, dir, archive string) {
	t.Helper()
	src := filepath.Join(dir, "sleeper.go")
	if err := os.WriteFile(src, []byte(sleeperSource), 0o644); err != nil {
		t.Fatal(err)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(dir, "sleeper")
	cmd := exec.Command(goBin, "build", "-trimpath", "-ldflags=-s -w", "-o", bin, src)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GO111MODULE=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the sleeper: %v: %s", err, out)
	}
	exe, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "sleeper", Mode: 0o755, Size: int64(len(exe)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(exe); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(buf.Bytes())), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config.Entrypoint = []string{"/sleeper"}
	cf.Config.Env = []string{"PATH=/"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	refs := map[name.Reference]v1.Image{}
	for _, r := range []string{testImage, pauseImage} {
		tag, err := name.NewTag(r)
		if err != nil {
			t.Fatal(err)
		}
		refs[tag] = img
	}
	f, err := os.Create(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := tarball.MultiRefWrite(refs, f); err != nil {
		t.Fatalf("writing the image archive: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

const sleeperSource = `package main

import (
	"os"
	"os/signal"
	"syscall"
)

// Waits for SIGTERM: as a container's init it has no default action for it.
func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
	<-c
}
`

// containerdConfig is a private containerd: its own root, state and sockets below the test's
// directory, the CRI plugin with runc as its one handler and no CNI (pods use the node's
// network). restrict_oom_score_adj: root here lacks CAP_SYS_RESOURCE, and runc fails every
// sandbox that asks for a lower oom_score_adj than its own.
const containerdConfig = `version = 2
root = "{{dir}}/root"
state = "{{dir}}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{{dir}}/containerd.sock"
[ttrpc]
  address = "{{dir}}/containerd.sock.ttrpc"
[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{{dir}}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "` + pauseImage + `"
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "{{dir}}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{{dir}}/cni/bin"
    conf_dir = "{{dir}}/cni/conf"
`

const shimSocketDir = "/run/containerd"

// env is a private containerd and what the test made with it.
type env struct {
	dir, sock string
	// ids of the sandboxes and containers made: without a cgroup parent their cgroups are
	// containerd's default, /k8s.io/<id>.
	ids []string
	// madeK8sio: /k8s.io did not exist before, so its empty directories are ours to remove.
	madeK8sio bool
	// madeRun: nor did /run/containerd, where containerd 1.6 puts its shims' sockets whatever
	// its state directory.
	madeRun bool
}

// startContainerd starts the private containerd and registers its teardown: its shims and
// their processes killed, its mounts unmounted, its cgroups removed.
func startContainerd(t *testing.T, dir string) *env {
	t.Helper()
	cfg := filepath.Join(dir, "containerd.toml")
	if err := os.WriteFile(cfg, []byte(strings.ReplaceAll(containerdConfig, "{{dir}}", dir)), 0o644); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("containerd", "--config", cfg, "--log-level", "info")
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group: a signal to the test's group does not reach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting containerd: %v", err)
	}
	e := &env{dir: dir, sock: filepath.Join(dir, "containerd.sock")}
	_, err = os.Stat("/sys/fs/cgroup/cpu/k8s.io")
	e.madeK8sio = errors.Is(err, os.ErrNotExist)
	_, err = os.Stat(shimSocketDir)
	e.madeRun = errors.Is(err, os.ErrNotExist)
	t.Cleanup(func() { teardown(t, e, cmd, logf) })
	sock := e.sock

	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := Dial(ctx, sock)
		cancel()
		if err == nil {
			c.Close()
			return e
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logf.Name())
			t.Fatalf("containerd did not answer on %s within 30 s: %v\n%s", sock, err, tail(b, 4000))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// teardown runs after the pods' own cleanup through the CRI: whatever that left (a failed
// test, a stuck shim) is killed, unmounted and removed here.
func teardown(t *testing.T, e *env, containerd *exec.Cmd, logf *os.File) {
	dir, sock := e.dir, e.sock
	// The shims' sockets live outside dir (/run/containerd/s): note them before the shims go.
	shimSockets, _ := filepath.Glob(filepath.Join(dir, "state", "io.containerd.runtime.v2.task", "*", "*", "address"))
	// containerd first: it would start a shim's cleanup for every shim killed below.
	containerd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- containerd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		containerd.Process.Kill()
		<-done
	}
	logf.Close()
	for _, pid := range pids(t) {
		if isOurShim(pid, sock) || inOurCgroup(pid, dir) {
			t.Logf("killing leftover process %d", pid)
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if l, err := cgroup.Detect("/sys/fs/cgroup"); err == nil {
		for _, id := range e.ids {
			if err := l.Remove("/k8s.io/" + id); err != nil {
				t.Errorf("removing /k8s.io/%s: %v", id, err)
			}
		}
		if e.madeK8sio {
			if err := l.Prune("/k8s.io"); err != nil {
				t.Errorf("pruning /k8s.io: %v", err)
			}
		}
		if err := l.Remove(testCgroup); err != nil {
			t.Errorf("removing %s: %v", testCgroup, err)
		}
		if err := l.Prune(cgroup.Parent); err != nil {
			t.Logf("pruning %s: %v", cgroup.Parent, err)
		}
	} else {
		t.Errorf("finding the cgroups: %v", err)
	}
	if t.Failed() {
		b, _ := os.ReadFile(logf.Name())
		t.Logf("containerd's log:\n%s", tail(b, 6000))
	}
	for _, a := range shimSockets {
		b, err := os.ReadFile(a)
		if err != nil {
			continue
		}
		s := strings.TrimPrefix(strings.TrimSpace(string(b)), "unix://")
		if strings.HasPrefix(s, shimSocketDir+"/s/") {
			os.Remove(s)
		}
	}
	if e.madeRun { // only what is empty: another containerd may have started since
		os.Remove(shimSocketDir + "/s")
		os.Remove(shimSocketDir)
	}
	unmountBelow(t, dir)
}

func pids(t *testing.T) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Errorf("listing processes: %v", err)
		return nil
	}
	var out []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil && pid != os.Getpid() {
			out = append(out, pid)
		}
	}
	return out
}

// isOurShim: a containerd-shim-runc-v2 started by our containerd (its -address flag).
func isOurShim(pid int, sock string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	args := strings.Split(string(b), "\x00")
	return len(args) > 0 && strings.HasSuffix(args[0], "containerd-shim-runc-v2") && slices.Contains(args, sock)
}

// inOurCgroup: a process in a cgroup below testCgroup, or one whose root is a rootfs of ours.
func inOurCgroup(pid int, dir string) bool {
	if root, err := os.Readlink(fmt.Sprintf("/proc/%d/root", pid)); err == nil && strings.HasPrefix(root, dir+"/") {
		return true
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.Contains(sc.Text(), ":"+testCgroup+"/") {
			return true
		}
	}
	return false
}

// unmountBelow detaches every mount below dir, deepest first: snapshots, rootfs and shm.
func unmountBelow(t *testing.T, dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Errorf("reading mounts: %v", err)
		return
	}
	var mounts []string
	for l := range strings.Lines(string(b)) {
		f := strings.Fields(l)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			mounts = append(mounts, f[4])
		}
	}
	slices.SortFunc(mounts, func(a, b string) int { return len(b) - len(a) })
	for _, m := range mounts {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			t.Errorf("unmounting %s: %v", m, err)
		} else {
			t.Logf("unmounted leftover %s", m)
		}
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
