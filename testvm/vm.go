// Package testvm runs nodectl's kernel-facing tests inside virtual machines, on kernels and
// cgroup modes this machine does not run (`make test-vm`): Debian's packaged kernels booted under
// QEMU (software emulation: no KVM here) with pure cgroup v2, the root on an ext4 virtio disk as
// on a node. The guest is busybox, the kernel's own modules and our test binaries; its results
// come back on the serial console between markers (guest/run).
package testvm

import (
	"bufio"
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

//go:embed guest/init guest/run
var guestFiles embed.FS

// Kernel is a kernel package unpacked by fetch-kernel.sh: boot/vmlinuz-RELEASE and
// lib/modules/RELEASE below Dir.
type Kernel struct {
	Dir     string
	Release string
	Image   string
}

// OpenKernel finds the kernel image and its modules below dir.
func OpenKernel(dir string) (Kernel, error) {
	images, _ := filepath.Glob(filepath.Join(dir, "boot", "vmlinuz-*"))
	if len(images) != 1 {
		return Kernel{}, fmt.Errorf("%s: want one boot/vmlinuz-*, found %d (unpack it with testvm/fetch-kernel.sh)", dir, len(images))
	}
	release := strings.TrimPrefix(filepath.Base(images[0]), "vmlinuz-")
	if _, err := os.Stat(filepath.Join(dir, "lib", "modules", release, "modules.dep")); err != nil {
		return Kernel{}, fmt.Errorf("%s: no modules of %s: %w", dir, release, err)
	}
	return Kernel{Dir: dir, Release: release, Image: images[0]}, nil
}

func (k Kernel) modules() string { return filepath.Join(k.Dir, "lib", "modules", k.Release) }

// Boot-time modules (stage 1: the disk) and those loaded once the disk is root (loop devices
// and overlayfs for the tests that make them). Their dependencies come from modules.dep.
var (
	bootModules = []string{"virtio_pci", "virtio_blk"}
	lateModules = []string{"loop", "overlay"}
)

// moduleOrder is the modules' files (relative to the kernel's module directory) in an order
// insmod can load them: each after its dependencies. A module built into the kernel (absent
// from modules.dep) is skipped.
func (k Kernel) moduleOrder(names []string) ([]string, error) {
	dep, err := os.ReadFile(filepath.Join(k.modules(), "modules.dep"))
	if err != nil {
		return nil, err
	}
	deps := map[string][]string{}
	byName := map[string]string{}
	for _, line := range strings.Split(string(dep), "\n") {
		file, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		deps[file] = strings.Fields(rest)
		name := strings.TrimSuffix(filepath.Base(file), ".ko")
		byName[strings.ReplaceAll(name, "-", "_")] = file
	}
	var order []string
	seen := map[string]bool{}
	var visit func(file string)
	visit = func(file string) {
		if seen[file] {
			return
		}
		seen[file] = true
		for _, d := range deps[file] {
			visit(d)
		}
		order = append(order, file)
	}
	for _, n := range names {
		file, ok := byName[n]
		if !ok {
			continue
		}
		visit(file)
	}
	return order, nil
}

// GuestTest is one test binary the guest runs: the package it is built from, the tests it runs
// (a -test.run pattern, all when empty) and skips, and its time limit inside the guest.
type GuestTest struct {
	Pkg     string
	Run     string
	Skip    string // a -test.skip pattern: what needs what the guest has not (a browser)
	Timeout time.Duration
}

// Name is the binary's name in the guest and the subtest's on the host.
func (g GuestTest) Name() string {
	return strings.ReplaceAll(strings.TrimPrefix(g.Pkg, "./"), "/", "_")
}

// Build compiles each test binary (static, CGO off) into dir/bin and lays out the guest's root
// tree in dir: busybox and its applets, the host's tools (the container runtimes) with the
// libraries they load, the sources (tests read their package's files), the guest scripts and the
// test list.
func Build(ctx context.Context, repo, dir string, tests []GuestTest, busybox string, tools []string, log io.Writer) error {
	bin := filepath.Join(dir, "guest", "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return err
	}
	for _, g := range tests {
		cmd := exec.CommandContext(ctx, "go", "test", "-c", "-o", filepath.Join(bin, g.Name()), g.Pkg)
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		cmd.Stdout, cmd.Stderr = log, log
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("building %s: %w", g.Pkg, err)
		}
	}
	if err := copySources(ctx, repo, filepath.Join(dir, "src")); err != nil {
		return err
	}
	for _, d := range []string{"bin", "sbin", "usr/bin", "usr/sbin", "etc", "proc", "sys", "dev", "run", "tmp", "var/tmp", "root", "var/lib", "lib/modules"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(dir, "tmp"), 0o1777); err != nil {
		return err
	}
	if err := installBusybox(busybox, dir); err != nil {
		return err
	}
	for _, tool := range tools {
		if err := installWithLibraries(ctx, tool, dir); err != nil {
			return err
		}
	}
	files := map[string]string{
		"etc/passwd":   "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
		"etc/group":    "root:x:0:\nnogroup:x:65534:\n",
		"etc/hostname": "nodectl-vm\n",
	}
	files["guest/tests"] = testList(tests)
	run, err := guestFiles.ReadFile("guest/run")
	if err != nil {
		return err
	}
	files["guest/run"] = string(run)
	for name, content := range files {
		mode := os.FileMode(0o644)
		if name == "guest/run" {
			mode = 0o755
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), mode); err != nil {
			return err
		}
	}
	return nil
}

// copySources copies the files git tracks: a test reads its package's own files (docs, testdata,
// the BPF sources) relative to its directory.
func copySources(ctx context.Context, repo, dst string) error {
	out, err := exec.CommandContext(ctx, "git", "-C", repo, "ls-files", "-z").Output()
	if err != nil {
		return fmt.Errorf("listing the sources: %w", err)
	}
	for _, f := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		info, err := os.Lstat(filepath.Join(repo, f))
		if err != nil || !info.Mode().IsRegular() {
			continue
		}
		if err := copyFile(filepath.Join(repo, f), filepath.Join(dst, f), info.Mode().Perm()); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// installBusybox puts the static busybox at /bin/busybox of root and a link for each applet it
// lists at the place it names.
func installBusybox(busybox, root string) error {
	if err := copyFile(busybox, filepath.Join(root, "bin", "busybox"), 0o755); err != nil {
		return err
	}
	out, err := exec.Command(busybox, "--list-full").Output()
	if err != nil {
		return fmt.Errorf("%s --list-full: %w", busybox, err)
	}
	for _, applet := range strings.Fields(string(out)) {
		link := filepath.Join(root, applet)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
			return err
		}
		if err := os.Symlink("/bin/busybox", link); err != nil {
			return err
		}
	}
	return nil
}

// installWithLibraries copies the host's binary at path into root at the same place, with the
// shared libraries and loader ldd names for it (none for a static one).
func installWithLibraries(ctx context.Context, path, root string) error {
	files := []string{path}
	out, err := exec.CommandContext(ctx, "ldd", path).Output()
	if err == nil { // ldd fails on a static binary: nothing more to copy
		for _, f := range strings.Fields(string(out)) {
			if strings.HasPrefix(f, "/") {
				files = append(files, f)
			}
		}
	}
	for _, f := range files {
		real, err := filepath.EvalSymlinks(f)
		if err != nil {
			return err
		}
		info, err := os.Stat(real)
		if err != nil {
			return err
		}
		if err := copyFile(real, filepath.Join(root, f), info.Mode().Perm()); err != nil {
			return err
		}
	}
	return nil
}

// testList is the guest's list of the tests to run, a line each.
func testList(tests []GuestTest) string {
	var list strings.Builder
	for _, g := range tests {
		// Fields apart by the unit separator: patterns hold "|".
		fmt.Fprintf(&list, "%s\x1f%s\x1f%s\x1f%s\x1f%s\n", g.Name(), strings.TrimPrefix(g.Pkg, "./"), g.Timeout, g.Run, g.Skip)
	}
	return list.String()
}

// SetTests makes the guest tree under root, which Build laid out, run tests: a boot runs a
// subset of the binaries built (their test list only is written).
func SetTests(root string, tests []GuestTest) error {
	return os.WriteFile(filepath.Join(root, "guest", "tests"), []byte(testList(tests)), 0o644)
}

// AddKernel copies the kernel's late modules into the root tree and names them in
// guest/modules.late.
func AddKernel(root string, k Kernel) error {
	late, err := k.moduleOrder(lateModules)
	if err != nil {
		return err
	}
	for _, m := range late {
		if err := copyFile(filepath.Join(k.modules(), m), filepath.Join(root, "lib", "modules", k.Release, m), 0o644); err != nil {
			return err
		}
	}
	return os.WriteFile(filepath.Join(root, "guest", "modules.late"), []byte(strings.Join(late, "\n")+"\n"), 0o644)
}

// Initramfs writes stage 1 (busybox, /init, the boot modules in load order) as a newc cpio
// archive at out.
func Initramfs(ctx context.Context, k Kernel, busybox, work, out string) error {
	root := filepath.Join(work, "initramfs")
	if err := copyFile(busybox, filepath.Join(root, "bin", "busybox"), 0o755); err != nil {
		return err
	}
	initScript, err := guestFiles.ReadFile("guest/init")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(root, "init"), initScript, 0o755); err != nil {
		return err
	}
	boot, err := k.moduleOrder(bootModules)
	if err != nil {
		return err
	}
	for _, m := range boot {
		if err := copyFile(filepath.Join(k.modules(), m), filepath.Join(root, "modules", m), 0o644); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(root, "modules.order"), []byte(strings.Join(boot, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	cmd := exec.CommandContext(ctx, "sh", "-c", "find . | cpio --quiet -o -H newc -R 0:0")
	cmd.Dir = root
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = f, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("cpio: %w: %s", err, stderr.String())
	}
	return f.Close()
}

// Disk makes the guest's root disk: an ext4 image of root with room to spare for what the tests
// write (swap files, flight recorders).
func Disk(ctx context.Context, root, out string, spare int64) error {
	var size int64
	err := filepath.Walk(root, func(_ string, info os.FileInfo, err error) error {
		if err == nil && info.Mode().IsRegular() {
			size += info.Size()
		}
		return err
	})
	if err != nil {
		return err
	}
	mib := (size+spare)>>20 + 64
	b, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-L", "nodectl-vm", "-d", root, out, strconv.FormatInt(mib, 10)+"M").CombinedOutput()
	if err != nil {
		return fmt.Errorf("mkfs.ext4: %w: %s", err, b)
	}
	return nil
}

// Machine is the emulated machine's size. MaxCPUs, when above CPUs, are possible CPUs that are
// not online (hot-pluggable): the kernel sizes per-CPU maps by the possible CPUs, so a machine
// of 2 online and 96 possible copies a per-CPU map as a 96-vCPU node does, at the cost of 2.
type Machine struct {
	CPUs      int
	MaxCPUs   int
	MemoryMiB int
}

// Result is what a guest test binary printed and how it ended.
type Result struct {
	Name     string
	Output   []string
	Code     int
	Seconds  int
	Ended    bool
	Leftover []string
}

// Boot is one boot of a kernel: its console's header line, each test's result in the order
// run, and whether the guest reached its end.
type Boot struct {
	Header  string
	Results []*Result
	Done    bool
	Tail    []string
}

var (
	markBegin = regexp.MustCompile(`^@@nodectl-vm begin (\S+)$`)
	markEnd   = regexp.MustCompile(`^@@nodectl-vm end (\S+) rc=(-?\d+) secs=(\d+)$`)
	markLeft  = regexp.MustCompile(`^@@nodectl-vm leftover (\S+) (.*)$`)
)

// Run boots the kernel with the initramfs and disk, under software emulation, and reads the
// console until the guest powers off or ctx ends. Every console line goes to console; progress
// (each test's end) is reported to progress.
func Run(ctx context.Context, k Kernel, m Machine, initramfs, disk string, console io.Writer, progress func(string)) (*Boot, error) {
	args := []string{
		"-machine", "q35", "-accel", accel(), "-cpu", "max",
		"-smp", fmt.Sprintf("%d,maxcpus=%d", m.CPUs, max(m.CPUs, m.MaxCPUs)), "-m", strconv.Itoa(m.MemoryMiB),
		"-nographic", "-no-reboot", "-nodefaults", "-serial", "stdio",
		"-kernel", k.Image, "-initrd", initramfs,
		"-drive", "file=" + disk + ",format=raw,if=virtio",
		// cgroup_no_v1=all: every controller on the unified hierarchy, as on GKE's nodes.
		// softlockup_panic: a CPU stuck in the kernel ends the boot at once, its stack on the console.
		"-append", "console=ttyS0 panic=-1 oops=panic softlockup_panic=1 softlockup_all_cpu_backtrace=1 cgroup_no_v1=all",
	}
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", args...)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = console
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting qemu-system-x86_64: %w", err)
	}
	b := &Boot{}
	var cur *Result
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		fmt.Fprintln(console, line)
		// The firmware's terminal codes may stand before the guest's first line.
		if i := strings.Index(line, "@@nodectl-vm "); i > 0 {
			line = line[i:]
		}
		b.Tail = append(b.Tail, line)
		if len(b.Tail) > 40 {
			b.Tail = b.Tail[1:]
		}
		switch mm := markBegin.FindStringSubmatch(line); {
		case mm != nil:
			cur = &Result{Name: mm[1]}
			b.Results = append(b.Results, cur)
			continue
		case strings.HasPrefix(line, "@@nodectl-vm kernel "):
			b.Header = strings.TrimPrefix(line, "@@nodectl-vm ")
			progress(b.Header)
		case line == "@@nodectl-vm done":
			b.Done = true
		}
		if mm := markEnd.FindStringSubmatch(line); mm != nil && cur != nil && cur.Name == mm[1] {
			cur.Code, _ = strconv.Atoi(mm[2])
			cur.Seconds, _ = strconv.Atoi(mm[3])
			cur.Ended = true
			progress(fmt.Sprintf("%s: exit %d in %d s (guest time)", cur.Name, cur.Code, cur.Seconds))
			continue
		}
		if mm := markLeft.FindStringSubmatch(line); mm != nil {
			for _, r := range b.Results {
				if r.Name == mm[1] {
					r.Leftover = append(r.Leftover, mm[2])
				}
			}
			continue
		}
		if cur != nil && !cur.Ended {
			cur.Output = append(cur.Output, line)
		}
	}
	werr := cmd.Wait()
	if ctx.Err() != nil {
		return b, fmt.Errorf("the guest did not finish in time: %w", ctx.Err())
	}
	if werr != nil && !b.Done {
		return b, fmt.Errorf("qemu: %w", werr)
	}
	return b, nil
}

// Failures are the lines of a test binary's output that say what failed: up to 30 lines before
// each failure line, each line once, or the tail when the binary died without saying.
func (r *Result) Failures() string {
	var keep []string
	next := 0 // the first line not kept yet
	for i, l := range r.Output {
		if strings.Contains(l, "--- FAIL") || strings.HasPrefix(l, "panic:") || strings.HasPrefix(l, "FAIL") {
			from := max(next, i-30)
			keep = append(keep, r.Output[from:i+1]...)
			next = i + 1
		}
	}
	if len(keep) == 0 {
		keep = r.Output[max(0, len(r.Output)-60):]
	}
	return strings.Join(keep, "\n")
}

// logLine is what testing.T's Log and Error print: the file and line of the call, then the
// message.
var logLine = regexp.MustCompile(`^[\w.-]+\.go:\d+: `)

// FailedTests names each test that failed with the last line it logged before it failed (a
// Fatal's message, mostly, which a helper outside the test's files may have written, as a
// cgroup's cleanup does): a summary short enough to survive a CI log's tail.
func (r *Result) FailedTests() []string {
	var out []string
	for i, l := range r.Output {
		name, ok := strings.CutPrefix(strings.TrimSpace(l), "--- FAIL: ")
		if !ok {
			continue
		}
		name, _, _ = strings.Cut(name, " ")
		last := ""
		for j := i - 1; j >= 0; j-- {
			lj := strings.TrimSpace(r.Output[j])
			if lj == "=== RUN   "+name {
				break
			}
			if logLine.MatchString(lj) {
				last = lj
				break
			}
		}
		out = append(out, name+": "+last)
	}
	return out
}

// Skipped are the tests the binary skipped, each with the reason it logged (the line above its
// "--- SKIP").
func (r *Result) Skipped() []string {
	var out []string
	for i, l := range r.Output {
		t := strings.TrimSpace(l)
		if !strings.HasPrefix(t, "--- SKIP: ") {
			continue
		}
		why := ""
		if i > 0 && strings.HasPrefix(r.Output[i-1], " ") {
			why = ": " + strings.TrimSpace(r.Output[i-1])
		}
		out = append(out, strings.TrimPrefix(t, "--- SKIP: ")+why)
	}
	sort.Strings(out)
	return out
}

// Lines are the output lines that contain s, trimmed.
func (r *Result) Lines(s string) []string {
	var out []string
	for _, l := range r.Output {
		if strings.Contains(l, s) {
			out = append(out, strings.TrimSpace(l))
		}
	}
	return out
}

// ErrNoKernel is returned when no kernel is given to boot.
var ErrNoKernel = errors.New("no kernel to boot: make test-vm unpacks them (testvm/fetch-kernel.sh) and names them in NODECTL_VM_KERNELS")

// accel is QEMU's accelerator: single-threaded TCG (both vCPUs on one host thread, taking
// turns). Multi-threaded TCG hung 6.1 guests while a tracer attached next to busy loops: one
// vCPU waited in text_poke_bp for the other to answer its IPI while that one spun in __schedule
// with interrupts off, at the very instruction being patched (make test-vm, three runs of
// record/trace/runq, at different tests); the same tests passed whole single-threaded.
// NODECTL_VM_ACCEL overrides it.
func accel() string {
	if a := os.Getenv("NODECTL_VM_ACCEL"); a != "" {
		return a
	}
	return "tcg,thread=single"
}
