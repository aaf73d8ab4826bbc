// Package privilege says which capabilities a command lacks, and for what.
package privilege

import (
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// Capabilities a command may need, by number (linux/capability.h).
const (
	CapSysAdmin = 21
	CapPerfmon  = 38
	CapBPF      = 39
)

var capNames = map[int]string{CapSysAdmin: "CAP_SYS_ADMIN", CapPerfmon: "CAP_PERFMON", CapBPF: "CAP_BPF"}

// Need returns an error naming each missing capability and what needs it, or nil. why maps a
// capability to the reason it is needed.
func Need(cmd string, why map[int]string) error {
	var hdr unix.CapUserHeader
	hdr.Version = unix.LINUX_CAPABILITY_VERSION_3
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("reading this process's capabilities: %w", err)
	}
	var missing []string
	for c, reason := range why {
		word, bit := c/32, uint(c%32)
		if data[word].Effective&(1<<bit) == 0 {
			missing = append(missing, fmt.Sprintf("%s (%s)", capNames[c], reason))
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("%s needs root: missing %s; run it with sudo", cmd, strings.Join(missing, ", "))
}
