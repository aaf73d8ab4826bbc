//go:build linux

package sample

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/rundir"
)

// retryAbsent: a file that was missing (its hierarchy lacks the cgroup, its controller is not
// enabled, the kernel has no such file) is looked for again every this many samples.
const retryAbsent = 16

// slowBudget is about how many cgroups a Sample reads the slow tier of. At 1,000 cgroups on a
// v1 hybrid host, every file every second took 3.3-3.9% of a core, the fast tier alone about
// 0.45%, and each cgroup's slow tier read 30-40 µs more (BenchmarkCgroupSampling). 64 kept the
// sampler under 1%; once the agent read only the fast tier of the cgroups that ran (Active),
// the turns were most of what it read, and 32 halve them: a slow series of each of 1,000
// cgroups every 32 s (BenchmarkAgent1000Cgroups).
const slowBudget = 32

// With Active, an active cgroup that used less than lightCPU of a core since its previous read
// (a millisecond a second) is light: its fast tier is read again only lightEvery samples later (or on
// its turn), and after two light reads in a row lightMaxEvery samples later. A thousand
// sandboxes that wake now and then to do next to nothing were each read at every wake-up, and
// still at every one with a single lightEvery, as they woke every 5 s: two thirds of the agent's
// CPU time (BenchmarkAgent1000Cgroups); now mostly on their turns. Their CPU usage stays exact, as
// counters, over the longer span; a cgroup whose usage rises above a millisecond a second is read
// at every sample again from its next read, and one Busy names (on a CPU at the collection, or
// waiting for one) is read whether light or not: a sandbox that starts to spin shows within a
// sample or two, and one its neighbours starve at every sample.
const (
	lightCPU      = 1e-3 // of a core
	lightEvery    = 4
	lightMaxEvery = 32
)

// With Active, a cgroup whose turn comes while it stayed quiet since its last slow read (light
// over that span, and its memory usage within quietMem of what it was) has its slow tier read
// on one turn in quietEvery only: an idle sandbox's memory.stat and pressure do not move while
// it neither runs nor its memory changes, and were most of what the sampler read at 1,000 of
// them (BenchmarkAgent1000Cgroups). Counters stay exact over the longer span. A memory usage
// "the same" to the byte was never the same for a sandbox that woke now and then: the kernel
// charges a cgroup's memory through per-CPU stocks of 64 pages, so the usage read moves by up
// to 256 KiB a CPU the cgroup ran on without the sandbox using a page more, and the sleepers'
// turns were all read (by bpftrace on the agent's preads: 28 slow reads a second of each file,
// not 8).
const (
	quietEvery = 4
	quietMem   = 1 << 20 // bytes
)

// Cgroups samples per-cgroup counters.
//
// Each cgroup's files are opened once and re-read with pread at offset 0, which makes kernfs
// generate them anew: opening, registering with the poller and closing every file on every
// sample was most of the cost (BenchmarkCgroupSampling). A file whose cgroup was removed reads
// ENODEV; the cgroup's files are then closed, as are those of cgroups paths no longer lists.
//
// The files are in two tiers. The fast tier (CPU usage and throttling, memory usage: what rules
// rate per second) is read at every Sample. The slow tier (memory.stat, swap, OOM kills, limit
// hits, pressure) is too, up to slowBudget cgroups; past that a Sample reads it for a staggered
// share of about slowBudget cgroups, each in turn, plus the priority ones. SampleFull reads
// everything, for the exact window edges.
//
// With an Active function, past slowBudget cgroups a Sample reads the fast tier only of the
// cgroups that may have changed: those Active names (the tracer saw them run since the last
// collection) and those whose turn of the slow tier it is. An idle cgroup's counters do not
// move, and its memory only by reclaim from outside, which its turn catches.
//
// Past slowBudget cgroups, with or without Active, a fast file that read all zeros after the
// cgroup had used CPU (cpu.stat without a CPU limit) is read on the cgroup's turns only, and
// not on those passed over (quietEvery): it moves only once a limit is set, and a limit on a
// cgroup that barely runs throttles next to nothing until it runs, when its turn is read. And
// without Active, off its turn, a cgroup whose CPU usage (the first fast file) is what it was
// at its previous read has the rest of its fast tier left unread: its throttling moves only
// while it runs, and its memory usage, which reclaim from outside may lower, is read on its
// turn. An idle cgroup then costs one read a Sample instead of three. With Active, a light
// cgroup (lightCPU) is read every lightEvery samples at most.
//
// Without Active, off its turn, a cgroup whose parent's CPU usage did not move since the
// previous Sample is not read at all: the usage counts the descendants', so none of them ran.
// The parent's usage is read before its children's (a parent not sampled itself is read for
// them first), so that a child's run after its own read shows in its parent's next one. A
// node of mostly idle sandboxes then costs a read per parent that moved and its children.
type Cgroups struct {
	l          *cgroup.Layout
	paths      func() []string
	files      []cgFile
	priority   func(path string) bool
	active     func(path string) bool
	busy       func(path string) bool
	slowBudget int

	mu    sync.Mutex
	open  *openFiles
	buf   []byte
	round uint64 // samples taken
	last  int    // records of the previous sample, to size the next
	// listed and scratch are readParents' and readUsage's, kept between samples.
	listed  map[string]bool
	scratch []rundir.Record
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
	absent []uint64 // the sample a file was found missing at; 0: not missing
	round  uint64   // the last sample that listed the cgroup
	quiet  []bool   // a fast file read all zeros at its last read, the cgroup having run
	// readAt is the sample the fast tier was last read at, and when; cpu the CPU usage (s)
	// it read then; light that it rose by less than lightCPU of a core since the read before.
	// lightRun counts the light reads in a row (see lightMaxEvery).
	readAt   uint64
	readTime time.Time
	cpu      float64
	light    bool
	lightRun int
	// usageRound is the last sample the CPU usage (cpu) was known at, read or inferred from
	// the parent's (0: never); moved that it differed from the sample's before, or was not
	// known then.
	usageRound uint64
	moved      bool
	// The CPU usage (s) and memory usage (bytes) at the last read of the slow tier, and when;
	// deferred counts the turns passed over since (quietEvery).
	slowCPU, slowMem float64
	slowTime         time.Time
	deferred         int
}

// cgFile is one file sampled in every cgroup: in controller's hierarchy, parsed by read; slow
// is its tier; usage that it holds the CPU or the memory usage, which tell a quiet turn.
type cgFile struct {
	controller, name string
	read             cgRead
	slow, usage      bool
}

// cgRead parses one cgroup's file b into records.
type cgRead func(out []rundir.Record, now time.Time, path string, b []byte) ([]rundir.Record, error)

// usageFile is a file of the fast tier that holds a usage (see cgFile).
func usageFile(controller, name string, read cgRead) cgFile {
	return cgFile{controller: controller, name: name, read: read, usage: true}
}

// fastFile is a file of the fast tier.
func fastFile(controller, name string, read cgRead) cgFile {
	return cgFile{controller: controller, name: name, read: read}
}

// slowFile is a file of the slow tier.
func slowFile(controller, name string, read cgRead) cgFile {
	return cgFile{controller: controller, name: name, read: read, slow: true}
}

// NewCgroups samples CPU usage and throttling, memory usage, swap, faults, refaults, OOM kills
// and limit hits, and pressure of the cgroups paths returns, asked anew on every Sample. A
// cgroup that does not exist is skipped.
func NewCgroups(l *cgroup.Layout, paths func() []string) *Cgroups {
	s := &Cgroups{l: l, paths: paths, slowBudget: slowBudget, open: &openFiles{by: map[string]*cgOpen{}, budget: fdBudget()}, buf: make([]byte, 16<<10)}
	if l.V1 {
		s.files = v1Files(l)
	} else {
		s.files = v2Files(l)
	}
	if l.Unified != "" {
		// On a hybrid host the v2 cgroup exists only if its creator made one.
		for _, res := range pressureResources {
			s.files = append(s.files, slowFile(cgroup.Unified, res+".pressure", readPressure(res)))
		}
	}
	runtime.AddCleanup(s, func(o *openFiles) { o.closeAll() }, s.open)
	return s
}

// Active makes a Sample of many cgroups read the fast tier of a cgroup only when f names it or
// its slow tier is read (see Cgroups); it returns s.
func (s *Cgroups) Active(f func(path string) bool) *Cgroups {
	s.active = f
	return s
}

// Busy names the cgroups whose fast tier, with Active, is read even when they were light (see
// lightMaxEvery): those on a CPU at the collection, or starved (a task that waits for a CPU
// uses next to none, as an idle one does); it returns s.
func (s *Cgroups) Busy(f func(path string) bool) *Cgroups {
	s.busy = f
	return s
}

// Priority makes every Sample read all files of the cgroups f accepts (a node whose memory an
// analysis rates over short spans); it returns s.
func (s *Cgroups) Priority(f func(path string) bool) *Cgroups {
	s.priority = f
	return s
}

func v1Files(l *cgroup.Layout) []cgFile {
	var out []cgFile
	mounted := func(c string) bool { _, ok := l.Mounts[c]; return ok }
	if mounted(cgroup.CPUAcct) {
		out = append(out, usageFile(cgroup.CPUAcct, "cpuacct.usage", readValue(rundir.MetricCPUUsage, 1e-9, nil)))
	}
	// The usages come before cpu.stat, which reads all zeros without a CPU limit: a turn
	// passed over (quietTurn) is told by them, and leaves that file unread too.
	if mounted(cgroup.Memory) {
		out = append(out, usageFile(cgroup.Memory, "memory.usage_in_bytes", readValue(rundir.MetricMemoryUsage, 1, nil)))
	}
	if mounted(cgroup.CPU) {
		out = append(out, fastFile(cgroup.CPU, "cpu.stat", readFlat(v1CPUStat)))
	}
	if mounted(cgroup.Memory) {
		out = append(out,
			slowFile(cgroup.Memory, "memory.stat", readV1MemoryStat),
			slowFile(cgroup.Memory, "memory.oom_control", readFlat(v1OOMControl)),
			slowFile(cgroup.Memory, "memory.failcnt", readValue(rundir.MetricMemoryLimitEvents, 1, labelsMax)),
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
		usageFile(cgroup.Unified, "cpu.stat", readFlat(v2CPUStat)),
		usageFile(cgroup.Unified, "memory.current", readValue(rundir.MetricMemoryUsage, 1, nil)),
		slowFile(cgroup.Unified, "memory.swap.current", readValue(rundir.MetricMemorySwap, 1, nil)),
		slowFile(cgroup.Unified, "memory.swap.max", readLimit(rundir.MetricMemorySwapLimit)),
		slowFile(cgroup.Unified, "memory.stat", readFlat(v2MemoryStat)),
		slowFile(cgroup.Unified, "memory.events", readFlat(v2MemoryEvents)),
		slowFile(cgroup.Unified, "memory.swap.events", readFlat(v2SwapEvents)),
		slowFile(cgroup.Unified, "io.stat", readIOStat),
	}
}

// Sample reads every cgroup's fast tier and a rotating share's slow tier; the records of those
// that could be read come back with the errors of those that could not.
func (s *Cgroups) Sample(now time.Time) ([]rundir.Record, error) { return s.sample(now, false) }

// SampleFull reads every file of every cgroup, as Sample does with few cgroups.
func (s *Cgroups) SampleFull(now time.Time) ([]rundir.Record, error) { return s.sample(now, true) }

func (s *Cgroups) sample(now time.Time, full bool) ([]rundir.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.round++
	out := make([]rundir.Record, 0, s.last)
	var errs []error
	paths := s.paths()
	// Cgroup i reads its slow tier when (round+i) % every is 0: once in every samples, and
	// about len(paths)/every of them at each.
	every := uint64(max(1, (len(paths)+s.slowBudget-1)/s.slowBudget))
	prune := !full && every > 1 && s.active == nil && s.usageFirst()
	if prune {
		s.readParents(paths, now)
	}
	for i, p := range paths {
		slow := full || (s.round+uint64(i))%every == 0 || s.priority != nil && s.priority(p)
		if !slow && s.active != nil && every > 1 && (!s.active(p) || s.open.light(p, s.round) && (s.busy == nil || !s.busy(p))) && s.open.keep(p, s.round) {
			continue
		}
		if prune && !slow && (s.priority == nil || !s.priority(p)) && s.open.still(parentOf(p), s.round) && s.open.unmoved(p, s.round) {
			continue
		}
		// A quiet cgroup's turn may be passed over, once its fast tier shows it quiet.
		mayDefer := slow && !full && s.active != nil && every > 1 && (s.priority == nil || !s.priority(p))
		// Off its turn, a cgroup whose CPU usage did not move has the rest of its fast tier
		// left unread (see Cgroups); with Active, the tracer already said which ran.
		stillSkips := !slow && every > 1 && s.active == nil
		var err error
		// A cgroup removed and made again under the same path reads ENODEV through the old
		// descriptors: forget them and read the new one.
		for range 2 {
			var gone bool
			out, gone, err = s.read(out, now, p, slow, mayDefer, stillSkips)
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

// read appends path's records, of the slow tier too if slow, unless mayDefer and the fast
// tier shows the cgroup quiet (see quietEvery); with stillSkips, a CPU usage the same as at
// the previous read ends the read there. gone says the cgroup vanished while it was read, and
// then nothing of it is appended.
func (s *Cgroups) read(out []rundir.Record, now time.Time, path string, slow, mayDefer, stillSkips bool) (_ []rundir.Record, gone bool, err error) {
	o := s.open.entry(path, len(s.files))
	o.round = s.round
	n := len(out)
	slowRead := false
	defer func() {
		if !gone && err == nil {
			o.noteCPU(out[n:], s.round, now, slowRead)
		}
	}()
	ran := false     // the first fast file (CPU usage) is not all zeros
	decided := false // whether a turn is passed over, known from the usages read first
	for i, f := range s.files {
		if slow && !decided && !f.usage && (f.slow || o.quiet[i]) {
			decided = true
			if mayDefer && o.quietTurn(out[n:], now) {
				slow = false
			}
		}
		if f.slow && !slow || !slow && o.quiet[i] {
			continue
		}
		slowRead = slowRead || f.slow
		fd, transient := o.fd[i], false
		if fd < 0 {
			// Counted from when it went missing, not as round%retryAbsent: a slow file read in
			// rotation might never be read at such a round.
			if o.absent[i] != 0 && s.round-o.absent[i] < retryAbsent {
				continue
			}
			var err error
			fd, err = unix.Open(s.l.Dir(f.controller, path)+"/"+f.name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if vanished(err) || errors.Is(err, syscall.EOPNOTSUPP) {
				o.absent[i] = s.round
				continue
			}
			if err != nil {
				return out[:n], false, fmt.Errorf("opening %s: %w", f.name, err)
			}
			o.absent[i] = 0
			transient = !s.open.hold(o, i, fd)
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
			o.absent[i] = s.round
			continue
		case err != nil:
			return out[:n], false, fmt.Errorf("reading %s: %w", f.name, err)
		}
		if !f.slow {
			if i == 0 {
				ran = !zeros(b)
			} else {
				o.quiet[i] = ran && zeros(b)
			}
		}
		if out, err = f.read(out, now, path, b); err != nil {
			return out[:n], false, fmt.Errorf("parsing %s: %w", f.name, err)
		}
		if i == 0 && stillSkips && o.readAt > 0 {
			if cpu, _ := usages(out[n:]); cpu == o.cpu {
				break
			}
		}
	}
	return out, false, nil
}

// usageFirst says whether the first file sampled is the CPU usage, which counts the
// descendants' (cpuacct.usage on v1, cpu.stat on v2): the parents' usage tells which ran.
func (s *Cgroups) usageFirst() bool {
	return len(s.files) > 0 && (s.files[0].name == "cpuacct.usage" || s.files[0].name == "cpu.stat" && !s.l.V1)
}

// parentOf is the path of path's parent, "" for a top-level cgroup or the root.
func parentOf(path string) string {
	if i := strings.LastIndexByte(path, '/'); i > 0 {
		return path[:i]
	}
	return ""
}

// readParents reads, before the cgroups, the CPU usage of their parents that are not sampled
// themselves (once a round), for the cgroups whose parent's usage did not move.
func (s *Cgroups) readParents(paths []string, now time.Time) {
	if s.listed == nil {
		s.listed = map[string]bool{}
	}
	clear(s.listed)
	for _, p := range paths {
		s.listed[p] = true
	}
	for _, p := range paths {
		q := parentOf(p)
		if q == "" || s.listed[q] {
			continue
		}
		if c := s.open.by[q]; c != nil && c.round == s.round {
			continue
		}
		// A parent that cannot be read leaves its usage unknown: its children are read.
		if gone := s.readUsage(q, now); gone {
			s.open.forget(q)
		}
	}
}

// readUsage reads the CPU usage of path alone (the first file), for its children. gone says
// the cgroup vanished.
func (s *Cgroups) readUsage(path string, now time.Time) (gone bool) {
	o := s.open.entry(path, len(s.files))
	o.round = s.round
	f := s.files[0]
	fd, transient := o.fd[0], false
	if fd < 0 {
		var err error
		fd, err = unix.Open(s.l.Dir(f.controller, path)+"/"+f.name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return vanished(err)
		}
		transient = !s.open.hold(o, 0, fd)
	}
	b, err := s.pread(fd)
	if transient {
		unix.Close(fd)
	}
	if err != nil {
		return vanished(err)
	}
	recs, err := f.read(s.scratch[:0], now, path, b)
	s.scratch = recs[:0]
	if err != nil {
		return false
	}
	if cpu, _ := usages(recs); !math.IsNaN(cpu) {
		o.noteUsage(cpu, s.round)
		o.cpu = cpu
	}
	return false
}

// pread reads the whole file at fd from its start into s.buf, growing it if needed.
func (s *Cgroups) pread(fd int) ([]byte, error) { return preadWhole(fd, &s.buf) }

// light says whether path is a light cgroup (see lightCPU) read fewer samples before round than
// its light reads in a row allow: lightEvery after one, lightMaxEvery after two or more.
func (o *openFiles) light(path string, round uint64) bool {
	c := o.by[path]
	if c == nil || !c.light {
		return false
	}
	every := uint64(lightEvery)
	if c.lightRun > 1 {
		every = lightMaxEvery
	}
	return round-c.readAt < every
}

// noteCPU notes the CPU usage among recs, a fast-tier read at round and now, and whether the
// cgroup was light since the previous one; with slowRead, the usages at a read of the slow
// tier.
func (c *cgOpen) noteCPU(recs []rundir.Record, round uint64, now time.Time, slowRead bool) {
	cpu, mem := usages(recs)
	if slowRead {
		c.slowCPU, c.slowMem, c.slowTime, c.deferred = cpu, mem, now, 0
	}
	if math.IsNaN(cpu) {
		return
	}
	c.noteUsage(cpu, round)
	if c.readAt > 0 {
		c.light = cpu-c.cpu < lightCPU*now.Sub(c.readTime).Seconds()
		if c.light {
			c.lightRun++
		} else {
			c.lightRun = 0
		}
	}
	c.readAt, c.readTime, c.cpu = round, now, cpu
}

// noteUsage notes the CPU usage cpu, read at round.
func (c *cgOpen) noteUsage(cpu float64, round uint64) {
	c.moved = c.usageRound == 0 || c.usageRound != round-1 || cpu != c.cpu
	c.usageRound = round
}

// quietTurn says whether the cgroup whose fast tier recs are was quiet since its last read of
// the slow tier (light, its memory usage within quietMem), and then counts the turn passed
// over, at most quietEvery-1 in a row.
func (c *cgOpen) quietTurn(recs []rundir.Record, now time.Time) bool {
	if c.slowTime.IsZero() || c.deferred >= quietEvery-1 {
		return false
	}
	cpu, mem := usages(recs)
	if math.IsNaN(cpu) || cpu-c.slowCPU >= lightCPU*now.Sub(c.slowTime).Seconds() || !sameMem(mem, c.slowMem) {
		return false
	}
	c.deferred++
	return true
}

// sameMem says whether memory usages a and b (bytes, NaN where not read) are within quietMem.
func sameMem(a, b float64) bool {
	if math.IsNaN(a) || math.IsNaN(b) {
		return math.IsNaN(a) && math.IsNaN(b)
	}
	return math.Abs(a-b) < quietMem
}

// usages returns the CPU usage (s) and memory usage (bytes) among recs, NaN where absent.
func usages(recs []rundir.Record) (cpu, mem float64) {
	cpu, mem = math.NaN(), math.NaN()
	for _, r := range recs {
		switch {
		case r.Value == nil:
		case r.Metric == rundir.MetricCPUUsage:
			cpu = *r.Value
		case r.Metric == rundir.MetricMemoryUsage:
			mem = *r.Value
		}
	}
	return cpu, mem
}

// entry is path's descriptors of files files, none open for a path new to o.
func (o *openFiles) entry(path string, files int) *cgOpen {
	c := o.by[path]
	if c == nil {
		c = &cgOpen{fd: make([]int, files), absent: make([]uint64, files), quiet: make([]bool, files)}
		for i := range c.fd {
			c.fd[i] = -1
		}
		o.by[path] = c
	}
	return c
}

// still says whether the CPU usage of path is known at round and did not move since the round
// before.
func (o *openFiles) still(path string, round uint64) bool {
	c := o.by[path]
	return c != nil && c.usageRound == round && !c.moved
}

// unmoved marks path as listed and its usage known at round, though not read, if it was known
// at the round before (its parent's did not move since: see Cgroups); it reports false for a
// cgroup that is to be read now.
func (o *openFiles) unmoved(path string, round uint64) bool {
	c := o.by[path]
	if c == nil || c.usageRound == 0 || c.usageRound != round-1 {
		return false
	}
	c.round, c.usageRound, c.moved = round, round, false
	return true
}

// keep marks path as listed at round, though not read, so that its descriptors stay open; it
// reports false for a cgroup never read, which is to be read now.
func (o *openFiles) keep(path string, round uint64) bool {
	c := o.by[path]
	if c == nil {
		return false
	}
	c.round = round
	return true
}

func (o *openFiles) forget(path string) {
	if c := o.by[path]; c != nil {
		for i := range c.fd {
			o.close(c, i)
		}
		delete(o.by, path)
	}
}

// hold keeps fd as c's i-th file while the budget allows; false: the caller closes it after
// its read.
func (o *openFiles) hold(c *cgOpen, i, fd int) bool {
	if o.held >= o.budget {
		return false
	}
	c.fd[i] = fd
	o.held++
	return true
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

// zeros says whether every number in a cgroup file's text is 0.
func zeros(b []byte) bool {
	for i, c := range b {
		if c >= '1' && c <= '9' && (i == 0 || !isWordByte(b[i-1])) {
			return false
		}
	}
	return true
}

// isWordByte says whether c may be in a key (nr_periods, pgpgin): a digit after one is part
// of the key, not a number.
func isWordByte(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}
