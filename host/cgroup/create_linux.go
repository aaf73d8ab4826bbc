//go:build linux

package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

const defaultPeriodUs = 100000

// Create makes path, and its parents, in every hierarchy a workload joins and sets lim on it.
// Calling it again on an existing cgroup sets lim again.
func (l *Layout) Create(path string, lim Limits) error {
	if err := checkPath(path); err != nil {
		return err
	}
	period := lim.CPUPeriodUs
	if period == 0 {
		period = defaultPeriodUs
	}
	var quota *int64
	if lim.CPUMilli > 0 {
		q := lim.CPUMilli * int64(period) / 1000
		quota = &q
	}
	// Without a request the default weight is written, so a repeated Create lifts an old one.
	shares, weight := uint64(DefaultShares), uint64(DefaultWeight)
	if lim.CPURequestMilli > 0 {
		shares = CPUShares(lim.CPURequestMilli)
		weight = CPUWeight(shares)
	}
	var err error
	if l.V1 {
		err = l.createV1(path, quota, period, shares, lim.MemoryBytes, lim.CPUs)
	} else {
		err = l.createV2(path, quota, period, weight, lim.CPURequestMilli > 0, lim.MemoryBytes, lim.CPUs)
	}
	if err == nil {
		err = l.setSwap(path, lim)
	}
	if err != nil {
		return fmt.Errorf("creating cgroup %s: %w", path, err)
	}
	return nil
}

// setSwap writes the swap settings of lim, which the cgroups library cannot leave out where the
// host lacks their files.
func (l *Layout) setSwap(path string, lim Limits) error {
	if lim.NoSwap || lim.SwapBytes > 0 {
		swap := int64(0)
		if !lim.NoSwap {
			swap = lim.SwapBytes
		}
		file, v := filepath.Join(l.Dir(Unified, path), "memory.swap.max"), strconv.FormatInt(swap, 10)
		if l.V1 {
			if lim.MemoryBytes <= 0 {
				return errors.New("a swap limit: cgroup v1 needs a memory limit to bound memory+swap by")
			}
			file, v = filepath.Join(l.Dir(Memory, path), "memory.memsw.limit_in_bytes"), strconv.FormatInt(lim.MemoryBytes+swap, 10)
		}
		if err := os.WriteFile(file, []byte(v), 0o644); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("limiting its swap to %d bytes: %w", swap, err)
		}
	}
	if lim.Swappiness != nil && l.V1 {
		file := filepath.Join(l.Dir(Memory, path), "memory.swappiness")
		if err := os.WriteFile(file, []byte(strconv.Itoa(*lim.Swappiness)), 0o644); err != nil {
			return fmt.Errorf("setting its swappiness: %w", err)
		}
	}
	return nil
}

func (l *Layout) createV1(path string, quota *int64, period, shares uint64, memory int64, cpus string) error {
	// -1 lifts a limit a previous Create may have set.
	q, mem := int64(-1), int64(-1)
	if quota != nil {
		q = *quota
	}
	if memory > 0 {
		mem = memory
	}
	res := &specs.LinuxResources{
		CPU:    &specs.LinuxCPU{Quota: &q, Period: &period, Shares: &shares, Cpus: cpus},
		Memory: &specs.LinuxMemory{Limit: &mem},
	}
	subs := l.v1Subsystems(v1Controllers)
	if _, err := cgroup1.New(l.v1Path(path), res, cgroup1.WithHierarchy(fixed(subs))); err != nil {
		return err
	}
	// A hybrid host's v2 hierarchy has no controllers but gives per-cgroup pressure and the
	// ids BPF helpers return.
	if l.Unified != "" {
		if err := os.MkdirAll(filepath.Join(l.Unified, path), 0o755); err != nil {
			return err
		}
	}
	return nil
}

func (l *Layout) createV2(path string, quota *int64, period, weight uint64, requested bool, memory int64, cpus string) error {
	avail, err := l.controllers()
	if err != nil {
		return err
	}
	has := func(c string) bool { return slices.Contains(avail, c) }
	res := &cgroup2.Resources{}
	switch {
	case has("cpu"):
		res.CPU = &cgroup2.CPU{Max: cgroup2.NewCPUMax(quota, &period), Weight: &weight}
	case quota != nil:
		return errors.New("cpu limit: the cpu controller is not available")
	case requested:
		return errors.New("cpu request: the cpu controller is not available")
	}
	if cpus != "" {
		// The library enables cpuset only beside cpu.
		if !has("cpuset") || res.CPU == nil {
			return fmt.Errorf("cpus %s: the cpuset and cpu controllers are not both available", cpus)
		}
		res.CPU.Cpus = cpus
	}
	switch {
	case has("memory"):
		res.Memory = &cgroup2.Memory{}
		if memory > 0 {
			res.Memory.Max = &memory
		}
	case memory > 0:
		return errors.New("memory limit: the memory controller is not available")
	}
	// Enabled for accounting (io.stat, pids.current) without limits.
	if has("io") {
		res.IO = &cgroup2.IO{}
	}
	if has("pids") {
		res.Pids = &cgroup2.Pids{}
	}
	if _, err := cgroup2.NewManager(l.Unified, path, res); err != nil {
		return err
	}
	// cgroup2.Memory cannot say "max"; write it so a repeated Create lifts an old limit.
	if res.Memory != nil && memory <= 0 {
		return os.WriteFile(filepath.Join(l.Unified, path, "memory.max"), []byte("max"), 0o644)
	}
	return nil
}

// AddProc moves pid into path in every hierarchy a workload joins; Create must have made it.
func (l *Layout) AddProc(path string, pid int) error {
	if err := l.addProc(path, pid); err != nil {
		return fmt.Errorf("moving pid %d to cgroup %s: %w", pid, path, err)
	}
	return nil
}

func (l *Layout) addProc(path string, pid int) error {
	if err := checkPath(path); err != nil {
		return err
	}
	// The library skips hierarchies where the cgroup is missing; a half-placed workload
	// would be misattributed, so refuse it.
	for _, root := range l.workloadRoots() {
		if _, err := os.Stat(filepath.Join(root, path)); err != nil {
			return err
		}
	}
	if l.V1 {
		cg, err := l.LoadV1(path, v1Controllers...)
		if err != nil {
			return err
		}
		if err := cg.AddProc(uint64(pid)); err != nil {
			return err
		}
	}
	if l.Unified != "" {
		m, err := l.LoadV2(path)
		if err != nil {
			return err
		}
		if err := m.AddProc(uint64(pid)); err != nil {
			return err
		}
	}
	return nil
}

// LoadV1 opens path in the named v1 controllers' hierarchies with containerd/cgroups, one
// subsystem per hierarchy mount (the library's default hierarchy fails when path is missing
// in one controller). Controllers not mounted are left out; cgroup1.ErrCgroupDeleted means
// path exists in none.
func (l *Layout) LoadV1(path string, controllers ...string) (cgroup1.Cgroup, error) {
	subs := l.v1Subsystems(controllers)
	if len(subs) == 0 {
		return nil, fmt.Errorf("loading cgroup %s: none of %v is on a v1 hierarchy", path, controllers)
	}
	return cgroup1.Load(l.v1Path(path), cgroup1.WithHierarchy(fixed(subs)))
}

// LoadV2 opens path in the v2 hierarchy with containerd/cgroups.
func (l *Layout) LoadV2(path string) (*cgroup2.Manager, error) {
	if l.Unified == "" {
		return nil, fmt.Errorf("loading cgroup %s: no cgroup2 mount", path)
	}
	return cgroup2.Load(path, cgroup2.WithMountpoint(l.Unified))
}

// v1Subsystems builds the library's controllers for the named, mounted controllers. Each is
// rooted at its mount's parent because the library appends the controller's name.
func (l *Layout) v1Subsystems(names []string) []cgroup1.Subsystem {
	var out []cgroup1.Subsystem
	for _, n := range names {
		m, ok := l.Mounts[n]
		if !ok {
			continue
		}
		root := filepath.Dir(m)
		switch n {
		case "cpu":
			out = append(out, cgroup1.NewCpu(root))
		case "cpuacct":
			out = append(out, cgroup1.NewCpuacct(root))
		case "cpuset":
			// The library walks up to <root>/cpuset copying cpus and mems; it cannot
			// when cpuset is co-mounted under another name.
			if filepath.Base(m) == n {
				out = append(out, cgroup1.NewCpuset(root))
			}
		case "memory":
			// Usage and limit are all the samplers need; skipping the rest saves reads
			// and copes with kernels that dropped kmem files.
			out = append(out, cgroup1.NewMemory(root, cgroup1.IgnoreModules("memsw", "kmem", "kmem.tcp")))
		case "blkio":
			out = append(out, cgroup1.NewBlkio(root))
		case "pids":
			out = append(out, cgroup1.NewPids(root))
		case "freezer":
			out = append(out, cgroup1.NewFreezer(root))
		}
	}
	return out
}

// v1Path places path in each controller's mount. A controller co-mounted under another name
// without a symlink (e.g. only /sys/fs/cgroup/cpu,cpuacct) is reached by climbing out of
// <root>/<controller>, which the library joins lexically.
func (l *Layout) v1Path(path string) cgroup1.Path {
	return func(n cgroup1.Name) (string, error) {
		m, ok := l.Mounts[string(n)]
		if !ok {
			return "", cgroup1.ErrControllerNotActive
		}
		if filepath.Base(m) == string(n) {
			return path, nil
		}
		return filepath.Join("..", filepath.Base(m), path), nil
	}
}

func fixed(subs []cgroup1.Subsystem) cgroup1.Hierarchy {
	return func() ([]cgroup1.Subsystem, error) { return subs, nil }
}
