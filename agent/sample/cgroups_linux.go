//go:build linux

package sample

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nodectl/nodectl/agent/cgroup"
	"github.com/nodectl/nodectl/agent/record"
)

// retryAbsent: a file that was missing (its hierarchy lacks the cgroup, its controller is not
// enabled, the kernel has no such file) is looked for again every this many samples.
const retryAbsent = 16

// Cgroups samples per-cgroup counters.
//
// Each cgroup's files are opened once and re-read with pread at offset 0, which makes kernfs
// generate them anew: opening, registering with the poller and closing every file on every
// sample was most of the cost (BenchmarkCgroupSampling). A file whose cgroup was removed reads
// ENODEV; the cgroup's files are then closed, as are those of cgroups paths no longer lists.
type Cgroups struct {
	l     *cgroup.Layout
	paths func() []string
	files []cgFile

	mu    sync.Mutex
	open  *openFiles
	buf   []byte
	round uint64 // samples taken
	last  int    // records of the previous sample, to size the next
}

// openFiles are the descriptors held, apart from Cgroups so that a cleanup can close them.
type openFiles struct {
	by     map[string]*cgOpen
	held   int // descriptors open
	budget int // the most to hold: past it files are opened, read and closed each time
}

// cgOpen is one cgroup's descriptors, by index in Cgroups.files; -1 is not open.
type cgOpen struct {
	fd     []int
	absent []bool
	round  uint64 // the last sample that listed the cgroup
}

// cgFile is one file sampled in every cgroup: in controller's hierarchy, parsed by read.
type cgFile struct {
	controller, name string
	read             func(out []record.Record, now time.Time, path string, b []byte) ([]record.Record, error)
}

// NewCgroups samples CPU usage and throttling, memory usage, swap, faults, refaults, OOM kills
// and limit hits, and pressure of the cgroups paths returns, asked anew on every Sample. A
// cgroup that does not exist is skipped.
func NewCgroups(l *cgroup.Layout, paths func() []string) *Cgroups {
	s := &Cgroups{l: l, paths: paths, open: &openFiles{by: map[string]*cgOpen{}, budget: fdBudget()}, buf: make([]byte, 16<<10)}
	if l.V1 {
		s.files = v1Files(l)
	} else {
		s.files = v2Files(l)
	}
	if l.Unified != "" {
		// On a hybrid host the v2 cgroup exists only if its creator made one.
		for _, res := range pressureResources {
			s.files = append(s.files, cgFile{cgroup.Unified, res + ".pressure", readPressure(res)})
		}
	}
	runtime.AddCleanup(s, func(o *openFiles) { o.closeAll() }, s.open)
	return s
}

func v1Files(l *cgroup.Layout) []cgFile {
	var out []cgFile
	mounted := func(c string) bool { _, ok := l.Mounts[c]; return ok }
	if mounted("cpuacct") {
		out = append(out, cgFile{"cpuacct", "cpuacct.usage", readValue(record.MetricCPUUsage, 1e-9, nil)})
	}
	if mounted("cpu") {
		out = append(out, cgFile{"cpu", "cpu.stat", readFlat(v1CPUStat)})
	}
	if mounted("memory") {
		out = append(out,
			cgFile{"memory", "memory.usage_in_bytes", readValue(record.MetricMemoryUsage, 1, nil)},
			cgFile{"memory", "memory.stat", readFlat(v1MemoryStat)},
			cgFile{"memory", "memory.oom_control", readFlat(v1OOMControl)},
			cgFile{"memory", "memory.failcnt", readValue(record.MetricMemoryLimitEvents, 1, labelsMax)},
		)
	}
	return out
}

func v2Files(l *cgroup.Layout) []cgFile {
	if l.Unified == "" {
		return nil
	}
	// Memory files exist only where the memory controller is enabled; swap.current only with
	// swap accounting. cpu.stat always exists, its throttling keys only with the cpu controller.
	return []cgFile{
		{cgroup.Unified, "cpu.stat", readFlat(v2CPUStat)},
		{cgroup.Unified, "memory.current", readValue(record.MetricMemoryUsage, 1, nil)},
		{cgroup.Unified, "memory.swap.current", readValue(record.MetricMemorySwap, 1, nil)},
		{cgroup.Unified, "memory.stat", readFlat(v2MemoryStat)},
		{cgroup.Unified, "memory.events", readFlat(v2MemoryEvents)},
	}
}

// Sample reads every cgroup; the records of those that could be read come back with the
// errors of those that could not.
func (s *Cgroups) Sample(now time.Time) ([]record.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.round++
	out := make([]record.Record, 0, s.last)
	var errs []error
	for _, p := range s.paths() {
		var err error
		// A cgroup removed and made again under the same path reads ENODEV through the old
		// descriptors: forget them and read the new one.
		for range 2 {
			var gone bool
			out, gone, err = s.read(out, now, p)
			if !gone {
				break
			}
			s.open.forget(p)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("sampling cgroup %s: %w", p, err))
		}
	}
	for p, o := range s.open.by {
		if o.round != s.round {
			s.open.forget(p)
		}
	}
	s.last = len(out)
	return out, errors.Join(errs...)
}

// read appends path's records; gone says the cgroup vanished while it was read, and then
// nothing of it is appended.
func (s *Cgroups) read(out []record.Record, now time.Time, path string) (_ []record.Record, gone bool, err error) {
	o := s.open.by[path]
	if o == nil {
		o = &cgOpen{fd: make([]int, len(s.files)), absent: make([]bool, len(s.files))}
		for i := range o.fd {
			o.fd[i] = -1
		}
		s.open.by[path] = o
	}
	o.round = s.round
	n := len(out)
	for i, f := range s.files {
		fd, transient := o.fd[i], false
		if fd < 0 {
			if o.absent[i] && s.round%retryAbsent != 0 {
				continue
			}
			var err error
			fd, err = unix.Open(s.l.Dir(f.controller, path)+"/"+f.name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if vanished(err) || errors.Is(err, syscall.EOPNOTSUPP) {
				o.absent[i] = true
				continue
			}
			if err != nil {
				return out[:n], false, fmt.Errorf("opening %s: %w", f.name, err)
			}
			o.absent[i] = false
			if s.open.held < s.open.budget {
				o.fd[i] = fd
				s.open.held++
			} else {
				transient = true
			}
		}
		b, err := s.pread(fd)
		if transient {
			unix.Close(fd)
		}
		switch {
		case vanished(err):
			return out[:n], true, nil
		case errors.Is(err, syscall.EOPNOTSUPP):
			// PSI turned off for this cgroup (cgroup.pressure 0).
			s.open.close(o, i)
			o.absent[i] = true
			continue
		case err != nil:
			return out[:n], false, fmt.Errorf("reading %s: %w", f.name, err)
		}
		if out, err = f.read(out, now, path, b); err != nil {
			return out[:n], false, fmt.Errorf("parsing %s: %w", f.name, err)
		}
	}
	return out, false, nil
}

// pread reads the whole file at fd from its start into s.buf, growing it if needed.
func (s *Cgroups) pread(fd int) ([]byte, error) {
	for {
		n, err := unix.Pread(fd, s.buf, 0)
		if err != nil {
			return nil, err
		}
		if n < len(s.buf) {
			return s.buf[:n], nil
		}
		s.buf = make([]byte, 2*len(s.buf))
	}
}

func (o *openFiles) forget(path string) {
	if c := o.by[path]; c != nil {
		for i := range c.fd {
			o.close(c, i)
		}
		delete(o.by, path)
	}
}

// close closes c's i-th file if it is held.
func (o *openFiles) close(c *cgOpen, i int) {
	if c.fd[i] >= 0 {
		unix.Close(c.fd[i])
		c.fd[i] = -1
		o.held--
	}
}

// fdBudget is how many descriptors the sampler may hold: half the soft limit on open files
// (which Go raises to the hard limit at start), so the tracer, the recorder and the workloads'
// pipes keep the rest. A thousand cgroups hold about nine thousand on v1.
func fdBudget() int {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return 0
	}
	return int(min(lim.Cur/2, 1<<20))
}

func (o *openFiles) closeAll() {
	for p := range o.by {
		o.forget(p)
	}
}
