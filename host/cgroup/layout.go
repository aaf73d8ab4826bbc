// Package cgroup finds the host's cgroup hierarchies, creates, fills and removes the cgroups of
// workloads, and maps kernfs ids (what BPF programs record) to cgroup paths. Hierarchy works on
// one controller's hierarchy alone: the tuner's CPU partition, the tracers' tests.
//
// A path is the cgroup's place below a hierarchy's root, e.g. /nodectl/<run>/victim; the same
// path names the cgroup in every hierarchy. On cgroup v1 each controller has its own hierarchy
// and a cgroup has a different id in each.
package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/prometheus/procfs"
)

// Parent is the cgroup nodectl makes all of its own below, in every hierarchy: stress runs, the
// tuner's system cgroup, the tests' cgroups.
const Parent = "/nodectl"

// Unified names the cgroup v2 hierarchy in Dir, ID and Resolver.Path. Any controller that is
// not on a v1 hierarchy maps to it too.
const Unified = "unified"

// v1Controllers are the v1 hierarchies a workload joins: limits and accounting (cpu, cpuacct,
// memory, blkio, pids), pinning (cpuset) and freezer, which Remove uses against fork races.
var v1Controllers = []string{CPU, CPUAcct, CPUSet, Memory, Blkio, Pids, Freezer}

// knownV1 are the controller names a v1 cgroup mount can carry in its super options.
var knownV1 = []string{
	"cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "net_cls", "net_prio",
	"blkio", "perf_event", "hugetlb", "pids", "rdma", "misc",
}

// Layout says where the hierarchies are mounted.
type Layout struct {
	Root    string            // cgroup filesystem root, e.g. /sys/fs/cgroup
	V1      bool              // the cpu controller is on a v1 hierarchy
	Unified string            // cgroup2 mount, "" if none
	Mounts  map[string]string // v1 controller (or name=X for named hierarchies) -> mount dir
}

// Detect finds the hierarchies mounted at or below root from /proc/self/mountinfo.
func Detect(root string) (*Layout, error) {
	return DetectProcfs(root, procfs.DefaultMountPoint)
}

// DetectProcfs is Detect reading <procfs>/self/mountinfo, for an agent that sees the host's
// procfs elsewhere.
func DetectProcfs(root, procfsDir string) (*Layout, error) {
	fs, err := procfs.NewFS(procfsDir)
	if err != nil {
		return nil, fmt.Errorf("opening procfs %s: %w", procfsDir, err)
	}
	mounts, err := fs.GetMounts()
	if err != nil {
		return nil, fmt.Errorf("reading mounts: %w", err)
	}
	root = filepath.Clean(root)
	l := &Layout{Root: root, Mounts: map[string]string{}}
	for _, m := range mounts {
		if m.MountPoint != root && !strings.HasPrefix(m.MountPoint, root+"/") {
			continue
		}
		switch m.FSType {
		case "cgroup2":
			if l.Unified == "" || len(m.MountPoint) < len(l.Unified) {
				l.Unified = m.MountPoint
			}
		case "cgroup":
			for opt, val := range m.SuperOptions {
				switch {
				case opt == "name":
					l.Mounts["name="+val] = m.MountPoint
				case slices.Contains(knownV1, opt):
					l.Mounts[opt] = m.MountPoint
				}
			}
		}
	}
	if l.Unified == "" && len(l.Mounts) == 0 {
		return nil, fmt.Errorf("detecting cgroups: no cgroup hierarchy mounted at %s", root)
	}
	_, l.V1 = l.Mounts["cpu"]
	return l, nil
}

// Dir is the directory of path in controller's hierarchy, "" when there is none.
func (l *Layout) Dir(controller, path string) string {
	if m, ok := l.Mounts[controller]; ok {
		if path == "/" { // a hierarchy's root, asked for on every id resolved
			return filepath.Clean(m)
		}
		return filepath.Join(m, path)
	}
	if l.Unified != "" {
		return filepath.Join(l.Unified, path)
	}
	return ""
}

// ID is the kernfs id of path in controller's hierarchy: the inode number of its directory.
func (l *Layout) ID(controller, path string) (uint64, error) {
	dir := l.Dir(controller, path)
	if dir == "" {
		return 0, fmt.Errorf("cgroup id of %s: no %s hierarchy", path, controller)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		return 0, fmt.Errorf("cgroup id of %s: %w", path, &os.PathError{Op: "stat", Path: dir, Err: err})
	}
	return st.Ino, nil
}

// Children lists the immediate child cgroups of path found in any hierarchy, sorted.
func (l *Layout) Children(path string) ([]string, error) {
	return children(l.roots(), path)
}

// children lists the immediate child cgroups of path below any of roots, sorted.
func children(roots []string, path string) ([]string, error) {
	seen := map[string]bool{}
	for _, root := range roots {
		ents, err := os.ReadDir(filepath.Join(root, path))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("listing cgroups below %s: %w", path, err)
		}
		for _, e := range ents {
			if e.IsDir() {
				seen[filepath.Join(path, e.Name())] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for p := range seen {
		out = append(out, p)
	}
	slices.Sort(out)
	return out, nil
}

// Hierarchies maps the kernel's hierarchy ids (/proc/self/cgroup's first field, the id BPF
// reads from a cgroup's root) to the mount dirs Dir gives for them; v2's is 0.
func (l *Layout) Hierarchies() (map[int]string, error) {
	self, err := procfs.Self()
	if err != nil {
		return nil, fmt.Errorf("reading this process's cgroups: %w", err)
	}
	cgs, err := self.Cgroups()
	if err != nil {
		return nil, fmt.Errorf("reading this process's cgroups: %w", err)
	}
	out := map[int]string{}
	for _, cg := range cgs {
		switch {
		case cg.HierarchyID == 0 && l.Unified != "":
			out[0] = filepath.Clean(l.Unified)
		case len(cg.Controllers) > 0:
			if m, ok := l.Mounts[cg.Controllers[0]]; ok {
				out[cg.HierarchyID] = filepath.Clean(m)
			}
		}
	}
	return out, nil
}

// roots are the mount dirs of every hierarchy, each once (v1 controllers may share one).
func (l *Layout) roots() []string {
	var out []string
	for _, m := range l.Mounts {
		if !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	if l.Unified != "" && !slices.Contains(out, l.Unified) {
		out = append(out, l.Unified)
	}
	slices.Sort(out)
	return out
}

// workloadRoots are the mount dirs of the hierarchies a workload joins: on v1 the controllers
// in v1Controllers plus the v2 mount of a hybrid host (its pressure files and the v2 id
// bpf_get_current_cgroup_id returns work without controllers); on v2 the unified mount.
func (l *Layout) workloadRoots() []string {
	var out []string
	if l.V1 {
		for _, c := range v1Controllers {
			if m, ok := l.Mounts[c]; ok && !slices.Contains(out, m) {
				out = append(out, m)
			}
		}
	}
	if l.Unified != "" {
		out = append(out, l.Unified)
	}
	return out
}

// Limits are a workload's resource limits, and its CPU request, which like the kubelet's
// becomes the cgroup's CPU weight: what it gets when the CPUs are contended, below any limit.
type Limits struct {
	CPUMilli        int64  // CPU quota in millicores, 0 = unlimited
	CPURequestMilli int64  // CPU request in millicores, 0 = the kernel's default weight
	CPUPeriodUs     uint64 // CFS period, 0 = 100000
	MemoryBytes     int64  // 0 = unlimited
	// CPUs is the cpuset.cpus CPU list, as a kubelet with reserved system CPUs confines pods;
	// "" = the parent's.
	CPUs string
	// NoSwap keeps the cgroup's memory out of swap: memory+swap limited to MemoryBytes on v1
	// (which it needs), swap.max 0 on v2. A host without swap accounting has nothing to set,
	// and no swap to charge either.
	NoSwap bool
	// SwapBytes, when more than 0, is the swap the cgroup may use, as the kubelet's LimitedSwap
	// bounds a container: swap.max on v2, memory+swap limited to MemoryBytes + SwapBytes on v1
	// (which needs MemoryBytes). A host without swap accounting has nothing to set.
	SwapBytes int64
	// Swappiness is the v1 memcg's own swappiness, which the cgroups made below it copy; nil
	// keeps the parent's. v2 has none (the node's vm.swappiness rules).
	Swappiness *int
}

// Bounds and defaults of cgroup v1 cpu.shares and v2 cpu.weight.
const (
	minShares, maxShares, DefaultShares = 2, 262144, 1024
	maxWeight, DefaultWeight            = 10000, 100
)

// CPUShares is the v1 cpu.shares the kubelet gives a CPU request of milli millicores
// (MilliCPUToShares: 1024 per CPU, at least 2).
func CPUShares(milli int64) uint64 {
	return uint64(min(max(milli*DefaultShares/1000, minShares), maxShares))
}

// CPUWeight is the v2 cpu.weight the kubelet writes for cpu.shares (KEP-2254's linear map of
// [2, 262144] onto [1, 10000]). It keeps the ratios of shares, so a 1-CPU request is 39, not
// the kernel's default of 100.
func CPUWeight(shares uint64) uint64 {
	shares = min(max(shares, minShares), maxShares)
	return 1 + (shares-minShares)*(maxWeight-1)/(maxShares-minShares)
}

// checkPath refuses paths that are relative, unclean or the root.
func checkPath(path string) error {
	if !filepath.IsAbs(path) || filepath.Clean(path) != path || path == "/" {
		return fmt.Errorf("cgroup path %q: want an absolute, clean path below the root", path)
	}
	return nil
}
