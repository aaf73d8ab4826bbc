//go:build linux

package features

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// kernelVersion is the running kernel's major and minor version.
func kernelVersion(t *testing.T) (major, minor int) {
	t.Helper()
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &major, &minor); err != nil {
		t.Fatalf("parsing kernel release: %v", err)
	}
	return major, minor
}

// The allocator came with Linux 6.1: the probe must find it there and after, and say absent,
// not fail, before.
func TestHaveBPFMemAlloc(t *testing.T) {
	major, minor := kernelVersion(t)
	err := HaveBPFMemAlloc()
	t.Logf("kernel %d.%d, bpf_mem_alloc: %v", major, minor, err)
	switch newer := major > 6 || major == 6 && minor >= 1; {
	case newer && err != nil:
		t.Errorf("kernel %d.%d: %v, want present", major, minor, err)
	case !newer && !errors.Is(err, ebpf.ErrNotSupported):
		t.Errorf("kernel %d.%d: %v, want ErrNotSupported", major, minor, err)
	}
	if again := HaveBPFMemAlloc(); again != err {
		t.Errorf("second probe gave %v, first %v: not cached", again, err)
	}
}

// The enqueue time is there exactly when the kernel shows its per-task run delays
// (/proc/self/schedstat, CONFIG_SCHED_INFO) and has the cpu cgroup controller (whose CFS
// queues are grouped, CONFIG_FAIR_GROUP_SCHED).
func TestHaveSchedInfo(t *testing.T) {
	_, statErr := os.Stat("/proc/self/schedstat")
	controllers, err := os.ReadFile("/proc/cgroups")
	if err != nil {
		t.Fatal(err)
	}
	cpu := regexp.MustCompile(`(?m)^cpu\s`).Match(controllers)
	err = HaveSchedInfo()
	t.Logf("schedstat: %v, cpu controller: %v, probe: %v", statErr, cpu, err)
	switch want := statErr == nil && cpu; {
	case want && err != nil:
		t.Errorf("probe: %v, want present", err)
	case !want && !errors.Is(err, ebpf.ErrNotSupported):
		t.Errorf("probe: %v, want ErrNotSupported", err)
	}
}

// The kernel's stamps of every wait come with task-based throttling (Linux 6.18) on a kernel
// with the enqueue time; without the enqueue time there are none.
func TestHaveKernelStamps(t *testing.T) {
	major, minor := kernelVersion(t)
	info, err := HaveSchedInfo(), HaveKernelStamps()
	t.Logf("kernel %d.%d: enqueue time %v, all stamps %v", major, minor, info, err)
	switch newer := major > 6 || major == 6 && minor >= 18; {
	case info != nil && !errors.Is(err, ebpf.ErrNotSupported):
		t.Errorf("no enqueue time (%v) but stamps: %v", info, err)
	case info == nil && newer && err != nil:
		t.Errorf("kernel %d.%d with the enqueue time: %v, want the stamps", major, minor, err)
	case !newer && !errors.Is(err, ebpf.ErrNotSupported):
		t.Errorf("kernel %d.%d: %v, want ErrNotSupported (no task-based throttling)", major, minor, err)
	}
}

func TestHaveSlotHelpers(t *testing.T) {
	major, minor := kernelVersion(t)
	err := HaveSlotHelpers()
	t.Logf("kernel %d.%d: %v", major, minor, err)
	if newer := major > 5 || major == 5 && minor >= 19; newer != (err == nil) {
		t.Errorf("kernel %d.%d: slot helpers %v", major, minor, err)
	}
}
