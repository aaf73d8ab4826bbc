//go:build linux

package features

import (
	"errors"
	"fmt"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// The allocator came with Linux 6.1: the probe must find it there and after, and say absent,
// not fail, before.
func TestHaveBPFMemAlloc(t *testing.T) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	var major, minor int
	if _, err := fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &major, &minor); err != nil {
		t.Fatalf("parsing kernel release: %v", err)
	}
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
