// Package daemons finds a node's system daemons (kubelet, the container runtime, journald) in
// procfs by their command name and maps each to the cgroup the tracer attributes its run-queue
// waits to, so a run can follow them as workloads.
package daemons

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/prometheus/procfs"
)

// Default are the daemons followed unless configured otherwise: the kubelet, the two CRI
// runtimes in the kubelet's path (containerd, CRI-O) and journald, which every daemon's logs go
// through. dockerd is left out: since dockershim's removal it is no longer in the kubelet's path.
var Default = []string{"kubelet", "containerd", "crio", "systemd-journald"}

// commLen is how much of a command name the kernel keeps (TASK_COMM_LEN less the NUL), so
// systemd-journald's comm is "systemd-journal".
const commLen = 15

// Daemon is a daemon's processes in one cgroup.
type Daemon struct {
	// Name is the configured name (systemd-journald, not its comm); a daemon found in several
	// cgroups is <name>, <name>-1, ... in the order of their lowest pid, and daemons sharing a
	// cgroup are one Daemon named <a>+<b>.
	Name string
	// Cgroup is the path below the hierarchy root in the cpu controller's v1 hierarchy, or the
	// unified one on v2: where the run-queue tracer charges the daemon's waits.
	Cgroup string
	PIDs   []int // ascending
}

// Parse reads a --daemons list: comma-separated command names; "" or "none" is no daemon.
func Parse(list string) ([]string, error) {
	list = strings.TrimSpace(list)
	if list == "" || list == "none" {
		return nil, nil
	}
	var names []string
	for n := range strings.SplitSeq(list, ",") {
		n = strings.TrimSpace(n)
		switch {
		case n == "":
			return nil, fmt.Errorf("--daemons %q: an empty name; want command names separated by commas, or none", list)
		case strings.ContainsAny(n, "/+ \t"):
			return nil, fmt.Errorf("--daemons %q: %q is not a command name (no '/', '+' or spaces)", list, n)
		case slices.Contains(names, n):
			return nil, fmt.Errorf("--daemons %q: %s is listed twice", list, n)
		}
		names = append(names, n)
	}
	return names, nil
}

// Find lists the processes under procfsDir whose comm is one of names (compared on the first 15
// characters, as the kernel keeps them), one Daemon per cgroup, ordered as names then by lowest
// pid. v1 says the cpu controller is on a v1 hierarchy (cgroup.Layout.V1). Processes in the
// root cgroup are left out and their daemons named in inRoot: there every other task of the
// root would be charged to them.
func Find(procfsDir string, v1 bool, names []string) (found []Daemon, inRoot []string, err error) {
	pfs, err := procfs.NewFS(procfsDir)
	if err != nil {
		return nil, nil, fmt.Errorf("finding daemons: opening procfs %s: %w", procfsDir, err)
	}
	procs, err := pfs.AllProcs()
	if err != nil {
		return nil, nil, fmt.Errorf("finding daemons: listing processes: %w", err)
	}
	byComm := map[string]string{} // comm -> configured name
	for _, n := range names {
		c := n[:min(len(n), commLen)]
		if _, dup := byComm[c]; !dup {
			byComm[c] = n
		}
	}
	type group struct {
		names []string
		pids  []int
	}
	groups := map[string]*group{} // by cgroup
	for _, p := range procs {
		comm, err := p.Comm()
		if err != nil {
			if gone(err) {
				continue
			}
			return nil, nil, fmt.Errorf("finding daemons: reading comm of %d: %w", p.PID, err)
		}
		name, ok := byComm[comm]
		if !ok {
			continue
		}
		cg, err := cgroupOf(p, v1)
		if gone(err) {
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("finding daemons: %s (pid %d): %w", name, p.PID, err)
		}
		g := groups[cg]
		if g == nil {
			g = &group{}
			groups[cg] = g
		}
		if !slices.Contains(g.names, name) {
			g.names = append(g.names, name)
		}
		g.pids = append(g.pids, p.PID)
	}
	rank := func(n string) int { return slices.Index(names, n) }
	for cg, g := range groups {
		slices.Sort(g.pids)
		slices.SortFunc(g.names, func(a, b string) int { return cmp.Compare(rank(a), rank(b)) })
		if cg == "/" {
			inRoot = g.names
			continue
		}
		found = append(found, Daemon{Name: strings.Join(g.names, "+"), Cgroup: cg, PIDs: g.pids})
	}
	slices.SortFunc(found, func(a, b Daemon) int {
		first := func(d Daemon) string { n, _, _ := strings.Cut(d.Name, "+"); return n }
		return cmp.Or(cmp.Compare(rank(first(a)), rank(first(b))), cmp.Compare(a.PIDs[0], b.PIDs[0]))
	})
	seen := map[string]int{}
	for i := range found {
		n := found[i].Name
		if k := seen[n]; k > 0 {
			found[i].Name = n + "-" + strconv.Itoa(k)
		}
		seen[n]++
	}
	return found, inRoot, nil
}

// cgroupOf is p's cgroup in the hierarchy the run-queue tracer keys: the one carrying the cpu
// controller on v1, the unified one (hierarchy 0) on v2.
func cgroupOf(p procfs.Proc, v1 bool) (string, error) {
	cgs, err := p.Cgroups()
	if err != nil {
		return "", err
	}
	for _, c := range cgs {
		if v1 && slices.Contains(c.Controllers, "cpu") || !v1 && c.HierarchyID == 0 {
			return c.Path, nil
		}
	}
	if v1 {
		return "", errors.New("no cpu controller in its /proc/<pid>/cgroup")
	}
	return "", errors.New("no unified hierarchy in its /proc/<pid>/cgroup")
}

// gone says a process exited while it was being read.
func gone(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH)
}
