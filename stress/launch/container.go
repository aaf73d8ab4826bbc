package launch

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/nodectl/nodectl/internal/badvalue"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/nodectl/nodectl/stress/workload"
)

// containerExe is where the nodectl binary sits in a container's root filesystem.
const containerExe = "/nodectl"

// containers runs workloads with an OCI runtime (runc or runsc). Every container gets a bundle
// of its own but shares one read-only root filesystem that holds nothing but the static nodectl
// binary, so no image or registry is involved.
type containers struct {
	cfg      Config
	bin      string   // the runtime's binary
	global   []string // flags before the runtime's subcommand
	platform string   // gVisor platform; "" for runc
	rootfs   string
	bundles  string

	mu      sync.Mutex
	started []string // container ids, for close
}

func newContainers(cfg Config) (*containers, error) {
	bin, err := exec.LookPath(string(cfg.Runtime))
	if err != nil {
		return nil, badvalue.Errorf(FieldRuntime, string(cfg.Runtime), "%s is not installed (Debian: apt-get install %s)", cfg.Runtime, cfg.Runtime)
	}
	if cfg.StateDir == "" {
		return nil, errors.New("a container runtime needs a state directory")
	}
	if err := checkStatic(cfg.Exe); err != nil {
		return nil, badvalue.New(FieldRuntime, string(cfg.Runtime), err)
	}
	c := &containers{
		cfg:     cfg,
		bin:     bin,
		rootfs:  filepath.Join(cfg.StateDir, "rootfs"),
		bundles: filepath.Join(cfg.StateDir, "bundles"),
	}
	c.global = []string{"--root", RuntimeRoot(cfg.StateDir, cfg.Runtime)}
	if cfg.Runtime == RuntimeRunsc {
		c.platform = runscPlatform(bin, cfg.RunscPlatform)
		// The sandbox needs no network: loopback-free sandboxes start faster and need no
		// privileges for a network namespace of their own.
		c.global = append(c.global, "--platform="+c.platform, "--network=none")
	}
	if err := c.buildRootfs(); err != nil {
		os.RemoveAll(cfg.StateDir)
		return nil, err
	}
	return c, nil
}

// RuntimeRoot is the runtime's --root (its state directory) below a launcher's StateDir, where
// `nodectl stress clean` looks for containers a killed run left.
func RuntimeRoot(stateDir string, rt Runtime) string {
	return filepath.Join(stateDir, string(rt)+"-root")
}

// checkStatic refuses a dynamically linked binary: the root filesystem has no libraries.
func checkStatic(exe string) error {
	f, err := elf.Open(exe)
	if err != nil {
		return fmt.Errorf("reading the nodectl binary %s: %w", exe, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("the nodectl binary %s is dynamically linked; containers get only this binary, so build it static (CGO_ENABLED=0, as `make build` does)", exe)
		}
	}
	return nil
}

// containerEnv passes nodectl's own variables into containers (tests use them to make their
// binary act as nodectl), never the launcher's start descriptor.
func containerEnv(host []string) []string {
	env := []string{"PATH=/"}
	for _, kv := range host {
		if strings.HasPrefix(kv, "NODECTL_") && !strings.HasPrefix(kv, StartFDEnv+"=") {
			env = append(env, kv)
		}
	}
	return env
}

// runscPlatform picks the gVisor platform: the one asked for, else systrap where this runsc
// has it, else ptrace (slowest, but it works everywhere). KVM only when asked: a /dev/kvm that
// opens can still hang the sandbox in a nested VM, as it does on the development machines.
func runscPlatform(bin, asked string) string {
	if asked != "" {
		return asked
	}
	out, _ := exec.Command(bin, "flags").CombinedOutput()
	if bytes.Contains(out, []byte("systrap")) {
		return "systrap"
	}
	return "ptrace"
}

func (c *containers) describe() string {
	if c.platform != "" {
		return fmt.Sprintf("%s (platform %s, network none)", c.cfg.Runtime, c.platform)
	}
	return string(c.cfg.Runtime)
}

func (c *containers) buildRootfs() error {
	for _, d := range []string{"proc", "dev", "sys", "tmp"} {
		if err := os.MkdirAll(filepath.Join(c.rootfs, d), 0o755); err != nil {
			return fmt.Errorf("building the container root filesystem: %w", err)
		}
	}
	if err := copyFile(c.cfg.Exe, filepath.Join(c.rootfs, containerExe)); err != nil {
		return fmt.Errorf("building the container root filesystem: %w", err)
	}
	return nil
}

// copyFile links src to dst, or copies it when they are on different filesystems.
func copyFile(src, dst string) error {
	if os.Link(src, dst) == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func (c *containers) start(spec Spec, onMeasure func(string, workload.Measurement)) (*Process, error) {
	id := spec.Name
	bundle := filepath.Join(c.bundles, id)
	if err := c.writeBundle(bundle, spec); err != nil {
		return nil, fmt.Errorf("starting %s: %w", spec.Name, err)
	}
	args := append(append([]string{}, c.global...), "run", "--bundle", bundle, id)
	c.mu.Lock()
	c.started = append(c.started, id)
	c.mu.Unlock()
	after := func() {
		c.delete(id, spec.Log)
		os.RemoveAll(bundle)
	}
	var (
		proc *Process
		err  error
	)
	if spec.RuntimeCgroup != "" {
		// nodectl enters the cgroup first and then becomes the runtime (`workload exec`).
		shim := Spec{Name: spec.Name, Cgroup: spec.RuntimeCgroup, Args: append([]string{"workload", "exec", "--", c.bin}, args...),
			Stdin: spec.Stdin, Log: spec.Log}
		proc, err = startPlaced(c.cfg.Exe, c.cfg.Cgroups, shim, onMeasure, after)
	} else {
		cmd := exec.Command(c.bin, args...)
		cmd.Stdin = spec.Stdin
		cmd.Stderr = spec.Log
		// The runtime forwards signals to the container; if nodectl dies the runtime is killed
		// and the container outlives it, which close (or `stress clean`) deletes through the
		// runtime.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
		proc, err = run(cmd, spec, onMeasure, after)
	}
	if err != nil {
		c.delete(id, spec.Log)
		os.RemoveAll(bundle)
		return nil, err
	}
	proc.terminate = func() {
		args := append(append([]string{}, c.global...), "kill", id, "TERM")
		if exec.Command(c.bin, args...).Run() != nil {
			// Not running yet or any more: the runtime process is all there is to stop.
			_ = proc.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	return proc, nil
}

// delete removes a container from the runtime, killing what is left of it.
func (c *containers) delete(id string, log io.Writer) {
	args := append(append([]string{}, c.global...), "delete", "--force", id)
	out, err := exec.Command(c.bin, args...).CombinedOutput()
	if err != nil && !bytes.Contains(out, []byte("not exist")) && !bytes.Contains(out, []byte("not found")) && log != nil {
		fmt.Fprintf(log, "nodectl: %s delete %s: %v: %s\n", c.cfg.Runtime, id, err, bytes.TrimSpace(out))
	}
}

func (c *containers) close() error {
	c.mu.Lock()
	ids := c.started
	c.started = nil
	c.mu.Unlock()
	for _, id := range ids {
		c.delete(id, nil)
	}
	return CleanRuntimeState(c.cfg.StateDir)
}

// CleanRuntimeState deletes every container the runtimes still know under a launcher's state
// directory, then removes the directory. `nodectl stress clean` calls it for killed runs.
func CleanRuntimeState(stateDir string) error {
	for _, rt := range []Runtime{RuntimeRunc, RuntimeRunsc} {
		root := RuntimeRoot(stateDir, rt)
		if _, err := os.Stat(root); err != nil {
			continue
		}
		bin, err := exec.LookPath(string(rt))
		if err != nil {
			continue
		}
		out, _ := exec.Command(bin, "--root", root, "list", "-q").Output()
		for _, id := range strings.Fields(string(out)) {
			_ = exec.Command(bin, "--root", root, "delete", "--force", id).Run()
		}
	}
	if err := os.RemoveAll(stateDir); err != nil {
		return fmt.Errorf("removing runtime state %s: %w", stateDir, err)
	}
	return nil
}

func (c *containers) writeBundle(dir string, spec Spec) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, m := range spec.Mounts {
		if err := os.MkdirAll(m, 0o755); err != nil {
			return fmt.Errorf("making mount source %s: %w", m, err)
		}
	}
	b, err := json.MarshalIndent(ociSpec(c.rootfs, containerEnv(os.Environ()), spec), "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644)
}

// ociSpec is a minimal, unprivileged container: its own pid, mount, ipc, uts and network
// namespaces, the default capability set of container runtimes, a read-only root with the
// nodectl binary, and the workload's directories bound read-write at their host paths.
func ociSpec(rootfs string, env []string, spec Spec) *specs.Spec {
	caps := []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
		"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
		"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"}
	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777"}},
	}
	for _, m := range spec.Mounts {
		mounts = append(mounts, specs.Mount{Destination: m, Type: "bind", Source: m, Options: []string{"rbind", "rw"}})
	}
	return &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			User:            specs.User{UID: 0, GID: 0},
			Args:            append([]string{containerExe}, spec.Args...),
			Env:             env,
			Cwd:             "/",
			Capabilities:    &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps},
			NoNewPrivileges: true,
		},
		Root:     &specs.Root{Path: rootfs, Readonly: true},
		Hostname: spec.Name,
		Mounts:   mounts,
		Linux: &specs.Linux{
			CgroupsPath: spec.Cgroup,
			// Limits are already set on the cgroup (Layout.Create): the runtime joins it and
			// leaves them as they are. Devices are denied but for the runtime's defaults.
			Resources: &specs.LinuxResources{Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}},
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace},
				{Type: specs.MountNamespace}, {Type: specs.NetworkNamespace},
			},
			MaskedPaths:   []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"},
			ReadonlyPaths: []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		},
	}
}
