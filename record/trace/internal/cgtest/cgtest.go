//go:build linux

// Package cgtest makes real cgroups and processes for the tracers' tests: cgroups under
// <mount>/nodectl/test-<random>/ in the hierarchy of one controller (the unified one on v2
// hosts), removed with their processes when the test ends.
package cgtest

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nodectl/nodectl/host/blockdev"
	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/record/trace/tracefs"
	"github.com/nodectl/nodectl/rundir/hist"
)

const root = "/sys/fs/cgroup"

// V1 reports whether the host uses v1 hierarchies (a hybrid or legacy layout).
func V1() bool {
	_, err := os.Stat(filepath.Join(root, "cgroup.controllers"))
	return err != nil
}

// Mount returns the directory of controller's hierarchy: its v1 mount, or the unified root.
func Mount(controller string) string {
	if V1() {
		return filepath.Join(root, controller)
	}
	return root
}

// RequireRoot skips the test when it cannot make cgroups or load BPF programs.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes cgroups and loads BPF programs")
	}
}

// Group is a cgroup made for a test.
type Group struct {
	Dir  string // absolute directory
	Path string // below the hierarchy's mount, e.g. /nodectl/test-ab12/a
	ID   uint64 // kernfs id: the directory's inode number
	h    cgroup.Hierarchy
}

// Make creates <mount>/nodectl/test-<random>/<name> for each name in controller's hierarchy
// and removes them, killing their processes first, when the test ends.
func Make(t testing.TB, controller string, names ...string) map[string]*Group {
	t.Helper()
	h := cgroup.Hierarchy{Root: Mount(controller), Controller: controller, V2: !V1()}
	suffix := make([]byte, 4)
	if _, err := rand.Read(suffix); err != nil {
		t.Fatalf("random suffix: %v", err)
	}
	parent := cgroup.Parent + "/test-" + hex.EncodeToString(suffix)
	for _, p := range []string{cgroup.Parent, parent} {
		if err := h.Create(p); err != nil {
			t.Fatal(err)
		}
	}
	// Controllers must be enabled on the way down for the children's interface files.
	for _, p := range []string{cgroup.Parent, parent} {
		_ = h.Enable(p)
	}
	groups := map[string]*Group{}
	t.Cleanup(func() {
		for _, g := range groups {
			g.remove(t)
		}
		if err := h.Remove(parent); err != nil {
			t.Error(err)
		}
		// The shared nodectl parent goes too unless another test or run still uses it.
		_ = h.Prune(cgroup.Parent)
	})
	for _, n := range names {
		path := parent + "/" + n
		if err := h.Create(path); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(h.Dir(path))
		if err != nil {
			t.Fatalf("stat %s: %v", h.Dir(path), err)
		}
		groups[n] = &Group{Dir: h.Dir(path), Path: path, ID: fi.Sys().(*syscall.Stat_t).Ino, h: h}
	}
	return groups
}

// Write writes an interface file of the group.
func (g *Group) Write(t testing.TB, file, value string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(g.Dir, file), []byte(value), 0); err != nil {
		t.Fatalf("writing %s to %s/%s: %v", value, g.Dir, file, err)
	}
}

// Start runs argv inside the group, pinned to cpu when cpu >= 0. The command only starts
// once it is in the group and pinned. It is killed when the test ends.
func (g *Group) Start(t testing.TB, cpu int, argv ...string) *exec.Cmd {
	t.Helper()
	// The shell waits for a line on stdin before it execs the command.
	cmd := exec.Command("sh", append([]string{"-c", `read x && exec "$@"`, "sh"}, argv...)...)
	gate, err := cmd.StdinPipe()
	if err != nil {
		t.Fatalf("stdin pipe: %v", err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %v: %v", argv, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	if err := g.h.AddProc(g.Path, cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if cpu >= 0 {
		var set unix.CPUSet
		set.Set(cpu)
		if err := unix.SchedSetaffinity(cmd.Process.Pid, &set); err != nil {
			t.Fatalf("pinning %d to cpu %d: %v", cmd.Process.Pid, cpu, err)
		}
	}
	if _, err := gate.Write([]byte("go\n")); err != nil {
		t.Fatalf("releasing %v: %v", argv, err)
	}
	return cmd
}

// Busy starts a shell busy loop in the group, pinned to cpu.
func (g *Group) Busy(t testing.TB, cpu int) *exec.Cmd {
	t.Helper()
	return g.Start(t, cpu, "sh", "-c", "while :; do :; done")
}

// Remove kills the group's processes and removes it; the test's cleanup then skips it.
func (g *Group) Remove(t testing.TB) {
	t.Helper()
	g.remove(t)
}

func (g *Group) remove(t testing.TB) {
	if _, err := os.Stat(g.Dir); errors.Is(err, os.ErrNotExist) {
		return
	}
	// rmdir fails while a killed process is still exiting, which under the VM lane's emulation
	// next to busy loops can take seconds: retry for a while, then say what is still there.
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		g.kill()
		if err = g.h.Remove(g.Path); err == nil {
			return
		}
	}
	pids, _ := g.h.Procs(g.Path)
	events, _ := os.ReadFile(filepath.Join(g.Dir, "cgroup.events"))
	t.Errorf("%v after 10 s; processes %v; cgroup.events %q", err, pids, events)
}

func (g *Group) kill() {
	pids, _ := g.h.Procs(g.Path)
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// LastCPU returns the highest CPU this process may run on, where tests pin their load.
func LastCPU(t testing.TB) int {
	t.Helper()
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Fatalf("reading affinity: %v", err)
	}
	for c := 1023; c >= 0; c-- {
		if set.IsSet(c) {
			return c
		}
	}
	t.Fatal("no cpu in affinity mask")
	return -1
}

// Tracer is what every concern's tracer offers.
type Tracer[S any] interface {
	Read() (S, error)
	Forget(live func(id uint64) bool) (int, error)
	Close() error
}

// CheckClose closes tr twice, which must succeed, and checks that Read and Forget then fail
// rather than touch closed maps.
func CheckClose[S any](t testing.TB, tr Tracer[S]) {
	t.Helper()
	for i := range 2 {
		if err := tr.Close(); err != nil {
			t.Fatalf("Close #%d: %v", i+1, err)
		}
	}
	if _, err := tr.Read(); err == nil {
		t.Error("Read after Close succeeded")
	}
	if _, err := tr.Forget(func(uint64) bool { return false }); err == nil {
		t.Error("Forget after Close succeeded")
	}
}

// DiskDir makes an empty directory on a block device, removed when the test ends, and returns
// its absolute path and its disk ("MAJ:MIN"). It is made in the working directory, the
// package's in a checkout: /tmp may be tmpfs, which syncs without I/O. It skips the test when
// that is not on a block device.
func DiskDir(t testing.TB) (dir, disk string) {
	t.Helper()
	dir, err := os.MkdirTemp(".", "nodectl-test-")
	if err != nil {
		t.Fatalf("making a directory: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if disk, err = blockdev.ForPath("/sys", dir); err != nil {
		t.Skipf("the working directory is not on a block device: %v", err)
	}
	if dir, err = filepath.Abs(dir); err != nil {
		t.Fatal(err)
	}
	return dir, disk
}

// WithTracefs runs run (a TestMain's m.Run) with tracefs available, as the composite tracer
// makes it for the loaders it runs: mounted at /sys/kernel/tracing if the host has not, and
// unmounted afterwards.
func WithTracefs(run func() int) int {
	if os.Geteuid() != 0 {
		return run()
	}
	m, err := tracefs.Ensure(tracefs.DefaultDir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return run()
	}
	defer func() {
		if err := m.Release(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}()
	return run()
}

// noTracefsEnv names, in the child WithoutTracefs starts, the test it runs.
const noTracefsEnv = "NODECTL_TEST_WITHOUT_TRACEFS"

// WithoutTracefs runs the calling test in a mount namespace of its own with no tracefs or
// debugfs mounted, as on a host that mounts neither, whatever this host has: the test binary
// runs again for that test alone, in a child process that unshares its mounts (made private,
// so nothing it does reaches the host) and detaches those filesystems. It returns true in the
// child, where the test goes on, and false in the parent, which reports the child's outcome
// and where the test must return.
func WithoutTracefs(t *testing.T) bool {
	t.Helper()
	RequireRoot(t)
	if os.Getenv(noTracefsEnv) == t.Name() {
		if err := detachTracefs(); err != nil {
			t.Fatalf("detaching tracefs and debugfs: %v", err)
		}
		if dir, ok := tracefs.Find(); ok {
			t.Fatalf("tracefs still found at %s after detaching every tracefs and debugfs", dir)
		}
		return true
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+regexp.QuoteMeta(t.Name())+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), noTracefsEnv+"="+t.Name())
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	t.Logf("in a mount namespace without tracefs:\n%s", out)
	switch {
	case err != nil:
		t.Fatalf("test in a mount namespace without tracefs: %v", err)
	case strings.Contains(string(out), "--- SKIP: "+t.Name()):
		t.Skip("skipped in a mount namespace without tracefs")
	case !strings.Contains(string(out), "--- PASS: "+t.Name()):
		t.Fatal("the test did not run in a mount namespace without tracefs")
	}
	return false
}

// detachTracefs lazily unmounts every tracefs and debugfs of this mount namespace, the deepest
// first, until none is left.
func detachTracefs() error {
	for range 10 {
		var points []string
		for _, m := range mounts() {
			if m.fstype == "tracefs" || m.fstype == "debugfs" {
				points = append(points, m.point)
			}
		}
		if len(points) == 0 {
			return nil
		}
		for _, p := range slices.Backward(points) {
			if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
				return fmt.Errorf("unmounting %s: %w", p, err)
			}
		}
	}
	return errors.New("tracefs or debugfs mounts keep coming back")
}

// mountEntry is a line of /proc/self/mountinfo.
type mountEntry struct {
	id, root, point, fstype string
}

// mounts lists this mount namespace's mounts in mountinfo order; mount points with spaces and
// the like come escaped, which test directories do not have.
func mounts() []mountEntry {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []mountEntry
	for _, line := range strings.Split(string(b), "\n") {
		// id parent dev root point options [optional...] - fstype source super-options
		l, r, ok := strings.Cut(line, " - ")
		lf, rf := strings.Fields(l), strings.Fields(r)
		if ok && len(lf) >= 5 && len(rf) >= 1 {
			out = append(out, mountEntry{id: lf[0], root: lf[3], point: lf[4], fstype: rf[0]})
		}
	}
	return out
}

// MountsUnder lists the mount points at or below dir, deepest last.
func MountsUnder(dir string) []string {
	var out []string
	for _, m := range mounts() {
		if m.point == dir || strings.HasPrefix(m.point, dir+"/") {
			out = append(out, m.point)
		}
	}
	return out
}

// TracefsMounts lists this mount namespace's tracefs mounts: mount point by mount id.
func TracefsMounts(t testing.TB) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, m := range mounts() {
		if m.fstype == "tracefs" {
			out[m.id] = m.point
		}
	}
	return out
}

// CheckHist checks that h is self-consistent: its buckets hold Count values, and its mean
// lies between the lower edge of its lowest non-empty bucket and the upper edge of its
// highest, which ties SumNs to the buckets.
func CheckHist(t testing.TB, what string, h hist.Log2) {
	t.Helper()
	var inBuckets uint64
	lo, hi := -1, -1
	for i, c := range h.Buckets {
		inBuckets += c
		if c > 0 {
			if lo < 0 {
				lo = i
			}
			hi = i
		}
	}
	if inBuckets != h.Count {
		t.Errorf("%s: buckets hold %d values, count is %d", what, inBuckets, h.Count)
	}
	if h.Count == 0 {
		return
	}
	low, high := BucketLow(lo), BucketLow(hi+1)
	if mean := float64(h.SumNs) / float64(h.Count); mean < low || mean >= high {
		t.Errorf("%s: mean %.0fns outside its buckets' range [%.0f, %.0f)ns", what, mean, low, high)
	}
}

// BucketLow is the lower edge of log2 bucket i in nanoseconds: bucket 0 also holds 0.
func BucketLow(i int) float64 {
	if i == 0 {
		return 0
	}
	return math.Ldexp(1, i)
}
