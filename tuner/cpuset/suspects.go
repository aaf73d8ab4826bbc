package cpuset

import (
	"context"
	"fmt"
	"strings"

	"github.com/nodectl/nodectl/host/daemons"
	"github.com/nodectl/nodectl/tuner"
)

// Suspects names who may have moved the partition: the kubelet (its CPU manager writes the
// cpusets of pod cgroups), systemd (AllowedCPUs= of a slice rewrites its cpuset.cpus), and,
// for a daemon found outside, that it started after the partition was applied (a restart by
// its supervisor lands it where the supervisor runs, not in the system cgroup).
func (s *partition) Suspects(_ context.Context, got tuner.Value) []string {
	var out []string
	if strings.Contains(got.Text, " outside") {
		out = append(out, "a daemon outside the reserved CPUs started after the partition was applied (restarted by its supervisor, or new): apply again to confine it")
	}
	if s.h.Systemd() {
		out = append(out, "systemd: AllowedCPUs= on a slice or unit (systemctl set-property, a unit drop-in) rewrites the cgroup's cpuset.cpus")
	}
	kubelets, err := daemons.Procs(s.h.Procfs, "kubelet")
	if err != nil {
		return out
	}
	for _, k := range kubelets {
		out = append(out, fmt.Sprintf("kubelet[%d]: its CPU manager writes the cpusets of pod cgroups (cpuManagerPolicy static)", k.PID))
	}
	return out
}
