//go:build linux

package sample

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"

	"github.com/nodectl/nodectl/agent/cgroup"
	"github.com/nodectl/nodectl/agent/record"
)

// Cgroups samples per-cgroup counters.
type Cgroups struct {
	l     *cgroup.Layout
	paths func() []string
}

// NewCgroups samples CPU usage and throttling, memory usage and pressure of the cgroups paths
// returns, asked anew on every Sample. A cgroup that does not exist is skipped.
func NewCgroups(l *cgroup.Layout, paths func() []string) *Cgroups {
	return &Cgroups{l: l, paths: paths}
}

// Sample reads every cgroup; the records of those that could be read come back with the
// errors of those that could not.
func (s *Cgroups) Sample(now time.Time) ([]record.Record, error) {
	var out []record.Record
	var errs []error
	for _, p := range s.paths() {
		var err error
		if s.l.V1 {
			out, err = s.v1(out, now, p)
		} else {
			out, err = s.v2(out, now, p)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("sampling cgroup %s: %w", p, err))
		}
	}
	return out, errors.Join(errs...)
}

func (s *Cgroups) v1(out []record.Record, now time.Time, path string) ([]record.Record, error) {
	cg, err := s.l.LoadV1(path, "cpu", "cpuacct")
	if errors.Is(err, cgroup1.ErrCgroupDeleted) {
		return out, nil
	}
	if err != nil {
		return out, err
	}
	m, err := cg.Stat()
	if vanished(err) {
		return out, nil
	}
	if err != nil {
		return out, err
	}
	// Load leaves out hierarchies where the cgroup is missing; their fields read zero.
	var loaded []cgroup1.Name
	for _, sub := range cg.Subsystems() {
		loaded = append(loaded, sub.Name())
	}
	if slices.Contains(loaded, cgroup1.Cpuacct) {
		out = append(out, sample(now, path, record.MetricCPUUsage, float64(m.CPU.Usage.Total)/1e9, nil))
	}
	if slices.Contains(loaded, cgroup1.Cpu) {
		th := m.CPU.Throttling
		out = append(out,
			sample(now, path, record.MetricCPUPeriods, float64(th.Periods), nil),
			sample(now, path, record.MetricCPUThrottled, float64(th.ThrottledPeriods), nil),
			sample(now, path, record.MetricCPUThrottledTime, float64(th.ThrottledTime)/1e9, nil),
		)
	}
	// One file instead of the library's memory Stat, which parses memory.stat and five more
	// files and was half the cost of a sample (BenchmarkCgroupSampler).
	if _, ok := s.l.Mounts["memory"]; ok {
		b, err := os.ReadFile(filepath.Join(s.l.Dir("memory", path), "memory.usage_in_bytes"))
		switch {
		case vanished(err):
		case err != nil:
			return out, err
		default:
			v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
			if err != nil {
				return out, fmt.Errorf("parsing memory.usage_in_bytes: %w", err)
			}
			out = append(out, sample(now, path, record.MetricMemoryUsage, float64(v), nil))
		}
	}
	return pressure(out, now, s.l, path)
}

func (s *Cgroups) v2(out []record.Record, now time.Time, path string) ([]record.Record, error) {
	dir := s.l.Dir(cgroup.Unified, path)
	// The library reads a missing cgroup as zeros, so look before and after.
	if _, err := os.Stat(dir); vanished(err) {
		return out, nil
	}
	mgr, err := s.l.LoadV2(path)
	if err != nil {
		return out, err
	}
	st, err := mgr.StatFiltered(cgroup2.StatCPU | cgroup2.StatMemory)
	if err != nil {
		return out, err
	}
	ctrls, err := mgr.Controllers()
	if err != nil {
		if vanished(err) {
			return out, nil
		}
		return out, err
	}
	n := len(out)
	// usage_usec is there without the cpu controller; the throttling fields and memory
	// files only with their controllers enabled.
	out = append(out, sample(now, path, record.MetricCPUUsage, float64(st.CPU.UsageUsec)/1e6, nil))
	if slices.Contains(ctrls, "cpu") {
		out = append(out,
			sample(now, path, record.MetricCPUPeriods, float64(st.CPU.NrPeriods), nil),
			sample(now, path, record.MetricCPUThrottled, float64(st.CPU.NrThrottled), nil),
			sample(now, path, record.MetricCPUThrottledTime, float64(st.CPU.ThrottledUsec)/1e6, nil),
		)
	}
	if slices.Contains(ctrls, "memory") {
		out = append(out, sample(now, path, record.MetricMemoryUsage, float64(st.Memory.Usage), nil))
	}
	out, err = pressure(out, now, s.l, path)
	if _, serr := os.Stat(dir); vanished(serr) {
		return out[:n], nil
	}
	return out, err
}
