package testcluster

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// removeSandboxes stops and removes every pod sandbox through the CRI, so containerd tears
// down each one's containers, shim, mounts, network (CNI DEL) and namespace itself.
func removeSandboxes(ctx context.Context, socket string) error {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dialing containerd's CRI: %w", err)
	}
	defer conn.Close()
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	resp, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return fmt.Errorf("listing pod sandboxes: %w", err)
	}
	// Bounded: a gVisor sandbox never stops through the runc shim (it misses the sandbox's
	// exit); Clean kills what is left.
	var errs []error
	for _, sb := range resp.Items {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if _, err := rt.StopPodSandbox(sctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, fmt.Errorf("stopping sandbox %s: %w", sb.Id, err))
		} else if _, err := rt.RemovePodSandbox(sctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, fmt.Errorf("removing sandbox %s: %w", sb.Id, err))
		}
		cancel()
	}
	return errors.Join(errs...)
}

// stateDirs are the node's directories below dir that Clean removes (it keeps the logs and
// configuration files for a failed test to show).
var stateDirs = []string{"containerd", "kubelet", "runc-root", "runsc-root", "cni-ipam", "pod-logs", "volume-plugins"}

// Clean removes what a node in dir left on the host, whether it stopped cleanly or was
// killed: processes in the CgroupRoot cgroups or naming dir on their command line, mounts
// under dir, the bridge and its veths, the node's files outside dir (hostFiles), the
// cgroups, the shims' sockets and the state directories. StartNode calls it first, Stop last.
func Clean(dir string, log *slog.Logger) error {
	dir = filepath.Clean(dir)
	var errs []error
	if err := killAll(dir); err != nil {
		errs = append(errs, err)
	}
	if err := unmountUnder(dir); err != nil {
		errs = append(errs, err)
	}
	if err := removeBridge(); err != nil {
		errs = append(errs, err)
	}
	for _, f := range hostFiles(dir) {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing %s: %w", f, err))
		}
	}
	// The directories the kubelet and libcni made for them, when nothing else is in them.
	for _, d := range []string{kubeletDevicePlugins, filepath.Dir(kubeletDevicePlugins), podLogLinks, cniCache, filepath.Dir(cniCache)} {
		_ = os.Remove(d)
	}
	if err := removeCgroups(); err != nil {
		errs = append(errs, err)
	}
	if err := removeShimSockets(dir); err != nil {
		errs = append(errs, err)
	}
	for _, d := range stateDirs {
		if err := os.RemoveAll(filepath.Join(dir, d)); err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", d, err))
		}
	}
	if len(errs) > 0 {
		log.Warn("cleaning the node", "dir", dir, "err", errors.Join(errs...))
	}
	return errors.Join(errs...)
}

const (
	// kubeletDevicePlugins is where the kubelet listens for device plugins, whatever its
	// root directory.
	kubeletDevicePlugins = "/var/lib/kubelet/device-plugins"
	// podLogLinks is where the kubelet links each container's log, whatever podLogsDir.
	podLogLinks = "/var/log/containers"
)

// hostFiles lists the node's files outside dir: libcni's cached results of its sandboxes (the
// bridge network's and the loopback's: they name the network namespace, which is under dir),
// the kubelet's links to its containers' logs (under dir) and its device plugin socket.
func hostFiles(dir string) []string {
	var out []string
	results, _ := os.ReadDir(cniCache)
	for _, r := range results {
		p := filepath.Join(cniCache, r.Name())
		if b, err := os.ReadFile(p); err == nil && (strings.HasPrefix(r.Name(), cniNetwork+"-") || bytes.Contains(b, []byte(dir+"/"))) {
			out = append(out, p)
		}
	}
	links, _ := os.ReadDir(podLogLinks)
	for _, l := range links {
		p := filepath.Join(podLogLinks, l.Name())
		if target, err := os.Readlink(p); err == nil && strings.HasPrefix(target, dir+"/") {
			out = append(out, p)
		}
	}
	// Only a kubelet of ours runs here (StartNode refuses otherwise): its socket is ours.
	if _, err := os.Stat(filepath.Join(kubeletDevicePlugins, "kubelet.sock")); err == nil {
		out = append(out, filepath.Join(kubeletDevicePlugins, "kubelet.sock"))
	}
	return out
}

// killAll kills every process in the CgroupRoot cgroups and every one naming dir on its
// command line (shims, runsc sandboxes and gofers), until none is left.
func killAll(dir string) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		pids := ownPIDs(dir)
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes still alive after SIGKILL: %v", pids)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ownPIDs lists the processes the node made that are still there (zombies excluded).
func ownPIDs(dir string) []int {
	self := os.Getpid()
	seen := map[int]bool{}
	for _, cg := range cgroupDirs() {
		_ = filepath.WalkDir(cg, func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			b, _ := os.ReadFile(filepath.Join(path, "cgroup.procs"))
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && pid != self {
					seen[pid] = true
				}
			}
			return nil
		})
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid == self {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if strings.Contains(string(cmdline), dir+"/") {
			seen[pid] = true
		}
	}
	var pids []int
	for pid := range seen {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			continue
		}
		// The state follows the command's closing parenthesis.
		if i := strings.LastIndexByte(string(stat), ')'); i > 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
			continue
		}
		pids = append(pids, pid)
	}
	slices.Sort(pids)
	return pids
}

// cgroupDirs lists CgroupRoot in every mounted cgroup hierarchy where it exists.
func cgroupDirs() []string {
	var dirs []string
	for _, m := range cgroupMounts() {
		d := filepath.Join(m, CgroupRoot)
		if _, err := os.Stat(d); err == nil {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// cgroupMounts lists the mount points of the cgroup hierarchies (v1 and v2).
func cgroupMounts() []string {
	var out []string
	for _, m := range mounts() {
		if m.fstype == "cgroup" || m.fstype == "cgroup2" {
			out = append(out, m.point)
		}
	}
	return out
}

// removeCgroups removes the CgroupRoot cgroups, deepest first, and the shared /nodectl parent
// when nothing else of nodectl's is in it.
func removeCgroups() error {
	var errs []error
	for _, root := range cgroupDirs() {
		var dirs []string
		_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		slices.Reverse(dirs)
		for _, d := range dirs {
			if err := rmdirRetry(d); err != nil {
				errs = append(errs, err)
			}
		}
		_ = os.Remove(filepath.Dir(root)) // the /nodectl parent, when empty
	}
	return errors.Join(errs...)
}

// rmdirRetry removes a cgroup, retrying while its last processes finish exiting.
func rmdirRetry(d string) error {
	var err error
	for range 50 {
		if err = os.Remove(d); err == nil || errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("removing the cgroup %s: %w", d, err)
}

// makeCgroupRoot makes CgroupRoot in every v1 hierarchy (the kubelet refuses a cgroupRoot
// that does not exist) with the parent's cpus and memory nodes in the cpuset one.
func makeCgroupRoot() error {
	for _, m := range cgroupMounts() {
		path := m
		for _, part := range strings.Split(strings.Trim(CgroupRoot, "/"), "/") {
			parent := path
			path = filepath.Join(path, part)
			if err := os.Mkdir(path, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("making the cgroup %s: %w", path, err)
			}
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				if cur, err := os.ReadFile(filepath.Join(path, f)); err == nil && strings.TrimSpace(string(cur)) == "" {
					val, _ := os.ReadFile(filepath.Join(parent, f))
					if err := os.WriteFile(filepath.Join(path, f), val, 0o644); err != nil {
						return fmt.Errorf("setting %s of %s: %w", f, path, err)
					}
				}
			}
		}
	}
	return nil
}

// joinCgroup moves pid into the cgroup path (below every hierarchy's root).
func joinCgroup(pid int, path string) error {
	for _, m := range cgroupMounts() {
		d := filepath.Join(m, path)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("making the cgroup %s: %w", d, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if cur, err := os.ReadFile(filepath.Join(d, f)); err == nil && strings.TrimSpace(string(cur)) == "" {
				val, _ := os.ReadFile(filepath.Join(filepath.Dir(d), f))
				_ = os.WriteFile(filepath.Join(d, f), val, 0o644)
			}
		}
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
			return fmt.Errorf("moving %d into %s: %w", pid, d, err)
		}
	}
	return nil
}

type mount struct{ point, fstype string }

// mounts reads this mount namespace's mount table.
func mounts() []mount {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []mount
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent maj:min root point options [optional...] - fstype source super
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if len(fields) < 5 || sep < 0 || sep+1 >= len(fields) {
			continue
		}
		out = append(out, mount{point: unescapeMount(fields[4]), fstype: fields[sep+1]})
	}
	return out
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// mountsUnder lists the mount points below dir, deepest first.
func mountsUnder(dir string) []string {
	var out []string
	for _, m := range mounts() {
		if strings.HasPrefix(m.point, dir+"/") {
			out = append(out, m.point)
		}
	}
	slices.SortFunc(out, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	return slices.Compact(out)
}

// unmountUnder unmounts everything below dir (the kubelet's volumes and its rshared root,
// containerd's rootfs overlays, shm and network namespace mounts), lazily when busy.
func unmountUnder(dir string) error {
	for range 5 {
		points := mountsUnder(dir)
		if len(points) == 0 {
			return nil
		}
		for _, p := range points {
			if err := unix.Unmount(p, 0); err != nil {
				_ = unix.Unmount(p, unix.MNT_DETACH)
			}
		}
	}
	if left := mountsUnder(dir); len(left) > 0 {
		return fmt.Errorf("mounts left under %s: %v", dir, left)
	}
	return nil
}

// shimSockets is where containerd 1.6's shims listen, whatever containerd's own state
// directory: one socket per shim, named by the hash of containerd's address, the namespace and
// the shim's id (containerd's runtime/v2/shim.SocketAddress). A killed shim leaves its socket.
const shimSockets = "/run/containerd/s"

// shimSocketsOf lists the sockets of the shims of the containerd in dir, from the task
// directories in its state.
func shimSocketsOf(dir string) []string {
	var out []string
	tasks := filepath.Join(dir, "containerd", "state", "io.containerd.runtime.v2.task")
	nss, _ := os.ReadDir(tasks)
	for _, ns := range nss {
		ids, _ := os.ReadDir(filepath.Join(tasks, ns.Name()))
		for _, id := range ids {
			sum := sha256.Sum256([]byte(filepath.Join(dir, "containerd.sock", ns.Name(), id.Name())))
			out = append(out, filepath.Join(shimSockets, hex.EncodeToString(sum[:])))
		}
	}
	return out
}

// removeShimSockets removes the sockets of the node's shims, and the directories when empty
// (containerd made them).
func removeShimSockets(dir string) error {
	var errs []error
	for _, s := range shimSocketsOf(dir) {
		if err := os.Remove(s); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing the shim socket %s: %w", s, err))
		}
	}
	// containerd and the shims also make these (empty, the runtimes' roots being in dir).
	for _, d := range []string{shimSockets, "/run/containerd/fifo", "/run/containerd/runc/k8s.io", "/run/containerd/runc", "/run/containerd"} {
		_ = os.Remove(d)
	}
	return errors.Join(errs...)
}

// removeBridge deletes the veths on BridgeName and the bridge.
func removeBridge() error {
	if _, err := os.Stat("/sys/class/net/" + BridgeName); err != nil {
		return nil
	}
	ports, _ := os.ReadDir("/sys/class/net/" + BridgeName + "/brif")
	var errs []error
	for _, p := range ports {
		// A veth goes by itself with its network namespace, maybe meanwhile.
		if out, err := exec.Command("ip", "link", "delete", p.Name()).CombinedOutput(); err != nil && !bytes.Contains(out, []byte("Cannot find device")) {
			errs = append(errs, fmt.Errorf("deleting the veth %s: %w: %s", p.Name(), err, out))
		}
	}
	if out, err := exec.Command("ip", "link", "delete", BridgeName).CombinedOutput(); err != nil {
		errs = append(errs, fmt.Errorf("deleting the bridge %s: %w: %s", BridgeName, err, out))
	}
	return errors.Join(errs...)
}

// Leftovers lists what a node in dir left on the host after Stop: processes, mounts under
// dir, CgroupRoot cgroups, the bridge, network namespaces in /var/run/netns named cni-*,
// libcni results of the network, state directories. Empty when all is clean.
func Leftovers(dir string) []string {
	dir = filepath.Clean(dir)
	var left []string
	for _, pid := range ownPIDs(dir) {
		cmd, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		left = append(left, fmt.Sprintf("process %d: %s", pid, strings.ReplaceAll(string(cmd), "\x00", " ")))
	}
	for _, m := range mountsUnder(dir) {
		left = append(left, "mount "+m)
	}
	for _, d := range cgroupDirs() {
		left = append(left, "cgroup "+d)
	}
	if _, err := os.Stat("/sys/class/net/" + BridgeName); err == nil {
		left = append(left, "bridge "+BridgeName)
	}
	if ns, _ := filepath.Glob("/var/run/netns/cni-*"); len(ns) > 0 {
		left = append(left, "network namespaces "+strings.Join(ns, " "))
	}
	for _, f := range hostFiles(dir) {
		left = append(left, "file "+f)
	}
	if out, err := exec.Command("iptables-save").Output(); err == nil && bytes.Contains(out, []byte("KUBE-")) {
		left = append(left, "iptables chains KUBE-*")
	}
	// Any shim socket nobody listens on is stale (the node's state, which names its own, is
	// gone by now).
	socks, _ := os.ReadDir(shimSockets)
	for _, s := range socks {
		p := filepath.Join(shimSockets, s.Name())
		if c, err := net.Dial("unix", p); err == nil {
			c.Close()
			continue
		}
		left = append(left, "stale shim socket "+p)
	}
	for _, d := range stateDirs {
		if _, err := os.Stat(filepath.Join(dir, d)); err == nil {
			left = append(left, "state directory "+filepath.Join(dir, d))
		}
	}
	return left
}
