package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/procfs"
)

// Hierarchy is one controller's hierarchy: its v1 mount, or the unified one. Layout works on
// every hierarchy a workload joins at once; the tuner's CPU partition works on the cpuset one
// alone, and the tracers' tests on one controller's. Its methods only read and write files, so
// a tree of plain files stands in for cgroupfs in tests.
type Hierarchy struct {
	Root       string // mount dir
	Controller string // e.g. cpuset
	V2         bool   // Root is the unified hierarchy
}

// Hierarchy is controller's hierarchy: its v1 mount or, when it is on none, the unified one if
// the controller is available there.
func (l *Layout) Hierarchy(controller string) (Hierarchy, error) {
	if m, ok := l.Mounts[controller]; ok {
		return Hierarchy{Root: m, Controller: controller}, nil
	}
	if l.Unified == "" {
		return Hierarchy{}, fmt.Errorf("no %s hierarchy below %s", controller, l.Root)
	}
	avail, err := l.controllers()
	if err != nil {
		return Hierarchy{}, err
	}
	if !slices.Contains(avail, controller) {
		return Hierarchy{}, fmt.Errorf("the %s controller is neither on a v1 hierarchy nor available in %s", controller, l.Unified)
	}
	return Hierarchy{Root: l.Unified, Controller: controller, V2: true}, nil
}

// controllers are the controllers the unified hierarchy's root offers.
func (l *Layout) controllers() ([]string, error) {
	b, err := os.ReadFile(filepath.Join(l.Unified, "cgroup.controllers"))
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(b)), nil
}

// Dir is the directory of path.
func (h Hierarchy) Dir(path string) string { return filepath.Join(h.Root, path) }

// Exists says whether path is there.
func (h Hierarchy) Exists(path string) bool {
	fi, err := os.Stat(h.Dir(path))
	return err == nil && fi.IsDir()
}

func (h Hierarchy) read(path, file string) (string, error) {
	b, err := os.ReadFile(filepath.Join(h.Dir(path), file))
	return strings.TrimSpace(string(b)), err
}

func (h Hierarchy) write(path, file, v string) error {
	f := filepath.Join(h.Dir(path), file)
	if err := os.WriteFile(f, []byte(v), 0o644); err != nil {
		return fmt.Errorf("writing %q to %s: %w", v, f, err)
	}
	return nil
}

// CPUs is path's cpuset.cpus as written: "" when empty or, on v2, when path's parent does not
// hand the cpuset controller down (the file is missing).
func (h Hierarchy) CPUs(path string) (string, error) {
	s, err := h.read(path, "cpuset.cpus")
	if errors.Is(err, fs.ErrNotExist) && h.V2 {
		return "", nil
	}
	return s, err
}

// SetCPUs writes path's cpuset.cpus.
func (h Hierarchy) SetCPUs(path, cpus string) error { return h.write(path, "cpuset.cpus", cpus) }

// EffectiveCPUs is path's cpuset.cpus.effective: the CPUs it gets, the root's being every
// online one.
func (h Hierarchy) EffectiveCPUs(path string) (string, error) {
	return h.read(path, "cpuset.cpus.effective")
}

// Enabled says whether path hands the controller down to its children (v2 subtree_control); a
// v1 hierarchy's cgroups all have it. A tree of plain files keeps the last "+cpuset" written,
// which counts too.
func (h Hierarchy) Enabled(path string) (bool, error) {
	if !h.V2 {
		return true, nil
	}
	s, err := h.read(path, "cgroup.subtree_control")
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(strings.Fields(s), func(c string) bool { return strings.TrimPrefix(c, "+") == h.Controller }), nil
}

// Enable makes path hand the controller down to its children, unless it does already.
func (h Hierarchy) Enable(path string) error {
	if on, err := h.Enabled(path); err != nil || on {
		return err
	}
	return h.write(path, "cgroup.subtree_control", "+"+h.Controller)
}

// Disable stops path handing the controller down (v2); its children lose the controller's files.
func (h Hierarchy) Disable(path string) error {
	if !h.V2 {
		return nil
	}
	return h.write(path, "cgroup.subtree_control", "-"+h.Controller)
}

// Create makes path below its existing parent; one that exists is left as it is. A v1 cpuset
// starts with no CPUs or memory nodes, so that it can take processes it gets its parent's; on
// v2 the parent must hand the controller down (Enable) for path to have its files.
func (h Hierarchy) Create(path string) error {
	if err := checkPath(path); err != nil {
		return err
	}
	err := os.Mkdir(h.Dir(path), 0o755)
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("making cgroup %s: %w", path, err)
	}
	if h.V2 || h.Controller != CPUSet {
		return nil
	}
	for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
		v, err := h.read(filepath.Dir(path), f)
		if err != nil {
			return fmt.Errorf("making cgroup %s: %w", path, err)
		}
		if err := h.write(path, f, v); err != nil {
			return fmt.Errorf("making cgroup %s: %w", path, err)
		}
	}
	return nil
}

// Remove removes path, which must hold no process and no cgroup.
func (h Hierarchy) Remove(path string) error {
	if err := checkPath(path); err != nil {
		return err
	}
	if err := os.Remove(h.Dir(path)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing cgroup %s: %w", path, err)
	}
	return nil
}

// Prune removes path when it is an empty leaf, as Layout.Prune does in every hierarchy.
func (h Hierarchy) Prune(path string) error {
	if err := checkPath(path); err != nil {
		return err
	}
	if err := prune(h.Dir(path)); err != nil {
		return fmt.Errorf("pruning cgroup %s: %w", path, err)
	}
	return nil
}

// Children lists the immediate child cgroups of path, sorted; none when path is missing.
func (h Hierarchy) Children(path string) ([]string, error) {
	return children([]string{h.Root}, path)
}

// Procs lists the processes in path itself, not below.
func (h Hierarchy) Procs(path string) ([]int, error) {
	pids, err := readProcs(h.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("listing processes of cgroup %s: %w", path, err)
	}
	return pids, nil
}

// AddProc moves pid into path, the root included. A pid that exited meanwhile fails with
// syscall.ESRCH.
func (h Hierarchy) AddProc(path string, pid int) error {
	if err := h.write(path, "cgroup.procs", strconv.Itoa(pid)); err != nil {
		return fmt.Errorf("moving pid %d to cgroup %s: %w", pid, path, err)
	}
	return nil
}

// Walk calls fn with top and every cgroup below it, parents first; fn returning
// filepath.SkipDir skips what is below. A cgroup removed meanwhile is skipped.
func (h Hierarchy) Walk(top string, fn func(path string) error) error {
	return filepath.WalkDir(h.Dir(top), func(d string, e fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if !e.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(h.Root, d)
		if err != nil {
			return err
		}
		return fn(filepath.Join("/", rel))
	})
}

// ProcPath is the cgroup of process p in controller's hierarchy: with v1, the v1 hierarchy that
// carries the controller; otherwise the unified one (hierarchy 0).
func ProcPath(p procfs.Proc, controller string, v1 bool) (string, error) {
	cgs, err := p.Cgroups()
	if err != nil {
		return "", err
	}
	for _, c := range cgs {
		if v1 && slices.Contains(c.Controllers, controller) || !v1 && c.HierarchyID == 0 {
			return c.Path, nil
		}
	}
	if v1 {
		return "", fmt.Errorf("pid %d: no %s controller in its cgroups", p.PID, controller)
	}
	return "", fmt.Errorf("pid %d: no unified hierarchy in its cgroups", p.PID)
}
