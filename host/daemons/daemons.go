// Package daemons finds a node's system daemons (kubelet, the container runtime, journald): the
// host's processes running a named program. A stress run follows them as workloads by their
// cgroups (Find); the tuner moves them onto reserved CPUs and tells whether one has started
// since a change it reads only at start-up (Procs, Pending).
package daemons

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nodectl/nodectl/internal/badvalue"

	"github.com/prometheus/procfs"

	"github.com/nodectl/nodectl/host/cgroup"
)

// Default are the daemons followed unless configured otherwise: the kubelet, the two CRI
// runtimes in the kubelet's path (containerd, CRI-O) and journald, which every daemon's logs go
// through. dockerd is left out: since dockershim's removal it is no longer in the kubelet's path.
var Default = []string{"kubelet", "containerd", "crio", "systemd-journald"}

// commLen is how much of a program's name the kernel keeps as its comm (TASK_COMM_LEN less the
// NUL), so systemd-journald's comm is "systemd-journal".
const commLen = 15

// userHZ is the unit of a process's start time in /proc/<pid>/stat; Linux fixes it at 100.
const userHZ = 100

// ticks is a duration in userHZ ticks.
func ticks(n uint64) time.Duration { return time.Duration(n) * (time.Second / userHZ) }

// settledAge: a process at least this old when a Walker first reads it is past its fork's
// exec (systemd's "(kubelet)" lasts milliseconds), and its comm is taken from that one read. A
// younger one is read again at the next walk. Each process was read at two walks before: at
// 1,000 sandboxes, the agent's second walk read every comm again (3,000 syscalls).
const settledAge = 10 * time.Second

// Proc is a running daemon process.
type Proc struct {
	procfs.Proc
	Name    string // the name it was found by
	Started time.Time
}

// Procs returns the processes of the procfs at procfsDir that run one of names, by pid. A
// process runs name when all of these hold:
//   - its comm is name cut to 15 bytes, as the kernel keeps it;
//   - its executable's or argv[0]'s base name is name itself, so systemd-journal-upload (comm
//     systemd-journal too) is not systemd-journald, and a kubelet run through a symlink
//     (/usr/bin/kubelet -> kubelet-v1.34) is the kubelet;
//   - it runs in the PID namespace of that procfs's PID 1, so a nested node's kubelet or a
//     container's journald is not the host's. PID 1's rather than the reader's own, so an agent
//     in a pod of its own PID namespace that reads the host's procfs (--procfs /host/proc)
//     still finds the host's.
//
// Processes that exit while being read are left out.
func Procs(procfsDir string, names ...string) ([]Proc, error) { return scan(procfsDir, names, nil) }

// scan is Procs; with seen, a process whose /proc directory is the one of the last scan keeps
// the comm two scans in a row read in it (see Walker), and seen is left holding this scan's.
func scan(procfsDir string, names []string, seen *comms) ([]Proc, error) {
	pfs, err := procfs.NewFS(procfsDir)
	if err != nil {
		return nil, fmt.Errorf("finding daemons: opening procfs %s: %w", procfsDir, err)
	}
	entries, err := pidEntries(procfsDir)
	if err != nil {
		return nil, fmt.Errorf("finding daemons: listing processes: %w", err)
	}
	byComm := map[string][]string{}
	for _, n := range names {
		c := n[:min(len(n), commLen)]
		if !slices.Contains(byComm[c], n) {
			byComm[c] = append(byComm[c], n)
		}
	}
	hostNS := pidNS(procfsDir, 1)
	var boot time.Time
	var out []Proc
	buf := make([]byte, 512)
	for _, e := range entries {
		comm, known := seen.lookup(e)
		settled := false
		switch {
		case known:
		case seen.isNew(e):
			// Its start time says whether it is past its fork's exec: then one read is enough.
			var start uint64
			comm, start, err = readStat(procfsDir, e.pid, buf)
			if err == nil && boot.IsZero() {
				var berr error
				if boot, berr = bootTime(procfsDir); berr != nil {
					return nil, fmt.Errorf("finding daemons: %w", berr)
				}
			}
			settled = err == nil && time.Since(boot.Add(ticks(start))) >= settledAge
		default:
			comm, err = readComm(procfsDir, e.pid, buf)
		}
		if gone(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("finding daemons: reading comm of %d: %w", e.pid, err)
		}
		seen.note(e, comm, !known, settled)
		if len(byComm[comm]) == 0 {
			continue
		}
		p, err := pfs.Proc(e.pid)
		if gone(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("finding daemons: %d: %w", e.pid, err)
		}
		name, ok := program(p, byComm[comm])
		if !ok {
			continue
		}
		if ns := pidNS(procfsDir, p.PID); hostNS != "" && ns != "" && ns != hostNS {
			continue
		}
		st, err := p.Stat()
		if gone(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("finding daemons: %s (pid %d): %w", name, p.PID, err)
		}
		if boot.IsZero() {
			if boot, err = bootTime(procfsDir); err != nil {
				return nil, fmt.Errorf("finding daemons: %w", err)
			}
		}
		started := boot.Add(ticks(uint64(st.Starttime)))
		out = append(out, Proc{Proc: p, Name: name, Started: started})
	}
	slices.SortFunc(out, func(a, b Proc) int { return a.PID - b.PID })
	seen.swap()
	return out, nil
}

// A Walker finds the daemons again and again, as the agent does every minute, on a node of
// thousands of processes: reading each one's comm every time is three syscalls a process.
// Between two walks, a process whose /proc directory has the same inode number is the same
// process (procfs gives a new process, and a pid reused, a new inode; it may also give a live
// process a new one when its dentry was reclaimed, which costs a read), so its comm is taken
// from the last walk once confirmed: read (with its start time, from its stat) when it was
// settledAge old already, or read the same by two walks in a row: a process caught between its
// fork and its exec (systemd's "(kubelet)") is read again at the next. A comm also changes in
// place at a later exec (a wrapper script's) or by prctl(PR_SET_NAME): every rereadEvery-th
// walk reads every comm again, and confirms those unchanged for the walks after it. A Walker
// is not safe for concurrent use.
type Walker struct {
	procfs string
	names  []string
	seen   comms
	walks  int
}

// rereadEvery is how many walks pass between two that read every process's comm.
const rereadEvery = 10

// NewWalker returns a Walker of the procfs at procfsDir for names (as Procs matches them).
func NewWalker(procfsDir string, names []string) *Walker {
	return &Walker{procfs: procfsDir, names: names}
}

// Find is Find of the Walker's procfs and names, reading the comms of new processes only.
func (w *Walker) Find(l *cgroup.Layout) (found []Daemon, inRoot []string, err error) {
	w.seen.force = w.walks%rereadEvery == 0
	w.walks++
	procs, err := scan(w.procfs, w.names, &w.seen)
	if err != nil {
		w.seen.last, w.seen.next = nil, nil // a walk cut short: the next reads all
		return nil, nil, err
	}
	return group(procs, l, w.names)
}

// comms are the processes' comms of the last scan, by pid with their /proc inode number, and
// those of the scan under way: only the processes still there are kept. A nil *comms knows
// none and keeps none.
type comms struct {
	last, next map[int]procEntry
	force      bool // read every comm this scan, still confirming those the last one read
	reads      int  // comms read from procfs since the first scan, for tests
}

// procEntry is a process's /proc directory: its pid and inode number, and (as a value of
// comms) the comm found in it and whether two scans in a row found it.
type procEntry struct {
	pid       int
	ino       uint64
	comm      string
	confirmed bool
}

// isNew says whether e is a process the last scan did not see (a nil *comms sees none, and
// confirms nothing: false).
func (c *comms) isNew(e procEntry) bool {
	if c == nil || e.ino == 0 {
		return false
	}
	was, ok := c.last[e.pid]
	return !ok || was.ino != e.ino
}

func (c *comms) lookup(e procEntry) (string, bool) {
	if c == nil || c.force || e.ino == 0 {
		return "", false
	}
	if was, ok := c.last[e.pid]; ok && was.ino == e.ino && was.confirmed {
		return was.comm, true
	}
	return "", false
}

// note keeps comm as e's, read or looked up; settled confirms it at once.
func (c *comms) note(e procEntry, comm string, read, settled bool) {
	if c == nil {
		return
	}
	if read {
		c.reads++
	}
	if c.next == nil {
		c.next = map[int]procEntry{}
	}
	was, ok := c.last[e.pid]
	e.comm, e.confirmed = comm, settled || ok && e.ino != 0 && was.ino == e.ino && was.comm == comm
	c.next[e.pid] = e
}

// swap makes the scan just done the last one; the map of the one before is cleared for the
// next.
func (c *comms) swap() {
	if c != nil {
		c.last, c.next = c.next, c.last
		clear(c.next)
	}
}

// readComm is the comm of process pid, read into buf. Procs reads every process's (thousands
// on a node of sandboxes), a Walker those of new processes: procfs.Proc.Comm, through os.Open,
// took nine syscalls each (the poller's fcntls and epoll_ctl) where this takes three.
func readComm(procfsDir string, pid int, buf []byte) (string, error) {
	b, err := readProcFile(procfsDir, pid, "comm", buf)
	return strings.TrimSuffix(string(b), "\n"), err
}

// readStat is the comm and start time (in ticks since boot) of process pid, from its stat file
// read into buf: "pid (comm) state ..." with the start time the 22nd field.
func readStat(procfsDir string, pid int, buf []byte) (comm string, start uint64, err error) {
	b, err := readProcFile(procfsDir, pid, "stat", buf)
	if err != nil {
		return "", 0, err
	}
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return "", 0, fmt.Errorf("stat %q: no (comm)", b)
	}
	f := strings.Fields(string(b[end+1:]))
	if len(f) < 20 {
		return "", 0, fmt.Errorf("stat %q: %d fields after the comm, want the start time's 20th", b, len(f))
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return "", 0, fmt.Errorf("stat of %d: start time: %w", pid, err)
	}
	return string(b[open+1 : end]), start, nil
}

// readProcFile reads file of process pid into buf, in three syscalls.
func readProcFile(procfsDir string, pid int, file string, buf []byte) ([]byte, error) {
	fd, err := syscall.Open(filepath.Join(procfsDir, strconv.Itoa(pid), file), syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer syscall.Close(fd)
	n, err := syscall.Read(fd, buf)
	if err != nil {
		return nil, err
	}
	return buf[:max(n, 0)], nil
}

// program is which of names p's program is called: its executable's base name, or that of the
// name it was run by (argv[0]).
func program(p procfs.Proc, names []string) (string, bool) {
	// A binary replaced since it started (a package upgrade) reads "<path> (deleted)".
	if exe, err := p.Executable(); err == nil {
		if n := filepath.Base(strings.TrimSuffix(exe, " (deleted)")); slices.Contains(names, n) {
			return n, true
		}
	}
	if args, err := p.CmdLine(); err == nil && len(args) > 0 {
		if n := filepath.Base(args[0]); slices.Contains(names, n) {
			return n, true
		}
	}
	return "", false
}

// pidNS is the PID namespace of the process pid, "" when it cannot be read (not root).
func pidNS(procfsDir string, pid int) string {
	ns, err := os.Readlink(filepath.Join(procfsDir, strconv.Itoa(pid), "ns", "pid"))
	if err != nil {
		return ""
	}
	return ns
}

// bootTime is when the procfs's kernel booted: now less its uptime. Both have a resolution of
// 10ms, where the boot time of /proc/stat, which procfs.ProcStat.StartTime adds to a start
// time, has a second: too coarse for a restart that follows a change by less than that.
func bootTime(procfsDir string) (time.Time, error) {
	t0 := time.Now()
	b, err := os.ReadFile(filepath.Join(procfsDir, "uptime"))
	// The middle of the read, wall clock only: it is compared with file times.
	now := t0.Add(time.Since(t0) / 2).Round(0)
	if err != nil {
		return time.Time{}, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return time.Time{}, fmt.Errorf("reading %s/uptime: empty", procfsDir)
	}
	up, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("reading %s/uptime: %w", procfsDir, err)
	}
	return now.Add(-time.Duration(up * float64(time.Second))), nil
}

// Pending reports whether no daemon among procs started after changed, the time of a change
// it reads only when it starts: none runs, or those running are older than the change.
func Pending(procs []Proc, changed time.Time) bool {
	for _, p := range procs {
		if p.Started.After(changed) {
			return false
		}
	}
	return true
}

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

// FieldDaemons names the list of daemons in errors.
const FieldDaemons = "Daemons"

// Parse reads a list of daemons: comma-separated program names; "" or "none" is no daemon.
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
			return nil, badvalue.Errorf(FieldDaemons, strconv.Quote(list), "an empty name; want program names separated by commas, or none")
		case strings.ContainsAny(n, "/+ \t"):
			return nil, badvalue.Errorf(FieldDaemons, strconv.Quote(list), "%q is not a program name (no '/', '+' or spaces)", n)
		case slices.Contains(names, n):
			return nil, badvalue.Errorf(FieldDaemons, strconv.Quote(list), "%s is listed twice", n)
		}
		names = append(names, n)
	}
	return names, nil
}

// Find lists the processes under procfsDir that run one of names (as Procs matches them), one
// Daemon per cgroup, ordered as names then by lowest pid, each cgroup a path of l's cpu
// hierarchy (also from inside a private cgroup namespace: cgroup.Layout.ProcPath). Processes in the root cgroup are left out and their daemons
// named in inRoot: there every other task of the root would be charged to them.
func Find(procfsDir string, l *cgroup.Layout, names []string) (found []Daemon, inRoot []string, err error) {
	procs, err := Procs(procfsDir, names...)
	if err != nil {
		return nil, nil, err
	}
	return group(procs, l, names)
}

// group makes Find's Daemons of the processes procs.
func group(procs []Proc, l *cgroup.Layout, names []string) (found []Daemon, inRoot []string, err error) {
	type group struct {
		names []string
		pids  []int
	}
	groups := map[string]*group{} // by cgroup
	for _, p := range procs {
		cg, err := l.ProcPath(p.Proc, cgroup.CPU)
		if gone(err) {
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("finding daemons: %s: %w", p.Name, err)
		}
		g := groups[cg]
		if g == nil {
			g = &group{}
			groups[cg] = g
		}
		if !slices.Contains(g.names, p.Name) {
			g.names = append(g.names, p.Name)
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

// gone says a process exited while it was being read.
func gone(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH)
}
