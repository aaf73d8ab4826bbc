package sample

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/rundir"
)

// Memory is a cgroup's memory in bytes, its descendants' included.
type Memory struct {
	Usage int64
	// Limit is as the kernel prints it on v1 (a page-rounded 2^63 when there is none) and -1
	// for v2's max.
	Limit        int64
	Anon         int64
	File         int64 // page cache
	InactiveFile int64
	Swap         int64 // -1 where the kernel does not account the cgroup's swap
}

// WorkingSet is usage less inactive file, as the kubelet counts it.
func (m Memory) WorkingSet() int64 { return max(0, m.Usage-m.InactiveFile) }

// CgroupMemory reads cg's memory: its memory.stat and its usage, limit and swap files. On v1
// memory.stat's total_* keys count the descendants; v2's keys do anyway.
func CgroupMemory(l *cgroup.Layout, cg string) (Memory, error) {
	m := Memory{Swap: -1}
	if l.V1 {
		dir := l.Dir(cgroup.Memory, cg)
		b, err := os.ReadFile(filepath.Join(dir, "memory.stat"))
		if err != nil {
			return m, err
		}
		if err := statValues(b, map[string]*int64{"total_rss": &m.Anon, "total_cache": &m.File, "total_inactive_file": &m.InactiveFile}); err != nil {
			return m, fmt.Errorf("memory.stat of %s: %w", cg, err)
		}
		// Only with swap accounting.
		if n, ok, err := flatUint(b, "total_swap"); err != nil {
			return m, fmt.Errorf("memory.stat of %s: %w", cg, err)
		} else if ok {
			m.Swap = int64(n)
		}
		if m.Usage, err = readInt(filepath.Join(dir, "memory.usage_in_bytes")); err != nil {
			return m, err
		}
		m.Limit, err = readInt(filepath.Join(dir, "memory.limit_in_bytes"))
		return m, err
	}
	dir := l.Dir(cgroup.Unified, cg)
	b, err := os.ReadFile(filepath.Join(dir, "memory.stat"))
	if err != nil {
		return m, err
	}
	if err := statValues(b, map[string]*int64{"anon": &m.Anon, "file": &m.File, "inactive_file": &m.InactiveFile}); err != nil { //rundir:other: the kernel's keys
		return m, fmt.Errorf("memory.stat of %s: %w", cg, err)
	}
	if m.Usage, err = readInt(filepath.Join(dir, "memory.current")); err != nil {
		return m, err
	}
	if m.Limit, err = readInt(filepath.Join(dir, "memory.max")); err != nil {
		return m, err
	}
	// Only with swap accounting.
	if m.Swap, err = readInt(filepath.Join(dir, "memory.swap.current")); errors.Is(err, os.ErrNotExist) {
		m.Swap, err = -1, nil
	}
	return m, err
}

// statValues sets each of keys' targets to the key's value in the flat-keyed file b; a key it
// lacks is an error.
func statValues(b []byte, keys map[string]*int64) error {
	for key, v := range keys {
		n, ok, err := flatUint(b, key)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("no %s", key)
		}
		*v = int64(n)
	}
	return nil
}

// readInt reads a one-number cgroup file; v2's "max" reads as -1.
func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := bytes.TrimSpace(b)
	if string(s) == "max" { //rundir:other: the kernel's "no limit"
		return -1, nil
	}
	n, err := strconv.ParseInt(string(s), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parsing %s: %w", path, err)
	}
	return n, nil
}

// OOMKills is how many processes the OOM killer killed in cg: on v2 (memory.events) in cg and
// below, on v1 (memory.oom_control, which does not propagate) in cg alone. It fails with
// errors.ErrUnsupported where the kernel does not count them.
func OOMKills(l *cgroup.Layout, cg string) (int64, error) {
	path := filepath.Join(l.Dir(cgroup.Unified, cg), "memory.events")
	if l.V1 {
		path = filepath.Join(l.Dir(cgroup.Memory, cg), "memory.oom_control")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n, ok, err := flatUint(b, keyOOMKill)
	switch {
	case err != nil:
		return 0, fmt.Errorf("parsing %s: %w", path, err)
	case !ok:
		return 0, fmt.Errorf("%s has no %s: %w", path, keyOOMKill, errors.ErrUnsupported)
	}
	return int64(n), nil
}

// Pressure is a PSI file's totals: how long some, and all, of the non-idle tasks stalled.
type Pressure struct {
	Some, Full time.Duration
}

// CgroupPressure reads cg's PSI file of resource (rundir.ResourceCPU, ResourceMemory,
// ResourceIO), which only the v2 hierarchy has: on a v1-only host it fails with
// errors.ErrUnsupported.
func CgroupPressure(l *cgroup.Layout, cg, resource string) (Pressure, error) {
	if l.Unified == "" {
		return Pressure{}, fmt.Errorf("%s pressure of %s: no cgroup v2 hierarchy: %w", resource, cg, errors.ErrUnsupported)
	}
	path := filepath.Join(l.Dir(cgroup.Unified, cg), resource+".pressure")
	b, err := os.ReadFile(path)
	if err != nil {
		return Pressure{}, err
	}
	var p Pressure
	for len(b) > 0 {
		var kind, total []byte
		var ok bool
		if kind, total, b, ok = cutPressure(b); !ok {
			continue
		}
		us, err := strconv.ParseUint(string(total), 10, 64)
		if err != nil {
			return Pressure{}, fmt.Errorf("parsing %s: %s total: %w", path, kind, err)
		}
		switch string(kind) {
		case rundir.PressureSome:
			p.Some = time.Duration(us) * time.Microsecond
		case rundir.PressureFull:
			p.Full = time.Duration(us) * time.Microsecond
		}
	}
	return p, nil
}
