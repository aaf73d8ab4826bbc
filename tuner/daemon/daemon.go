// Package daemon finds a node's daemon processes and tells whether one has started since a
// change it reads only at start-up, for the settings that take effect when a daemon restarts
// (the kubelet's drop-in, journald's).
package daemon

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/procfs"
)

// commLen is how much of a program's name the kernel keeps as its comm.
const commLen = 15

// userHZ is the unit of a process's start time in /proc/<pid>/stat; Linux fixes it at 100.
const userHZ = 100

// Proc is a running daemon.
type Proc struct {
	procfs.Proc
	Started time.Time
}

// Find returns the processes named name in the procfs at procfsDir that belong to the node:
// their comm is name cut to 15 bytes, as the kernel keeps it, and their executable or argv[0]
// is called name itself, so systemd-journal-upload does not pass for systemd-journald; and
// they run in the PID namespace of that procfs's PID 1, so a container's own systemd-journald
// or kubelet (a kind node's) is not taken for the node's. Processes that exit while being
// read are left out.
func Find(procfsDir, name string) ([]Proc, error) {
	pfs, err := procfs.NewFS(procfsDir)
	if err != nil {
		return nil, err
	}
	procs, err := pfs.AllProcs()
	if err != nil {
		return nil, err
	}
	initNS := pidNS(procfsDir, 1)
	comm := name[:min(len(name), commLen)]
	var out []Proc
	for _, p := range procs {
		if c, err := p.Comm(); err != nil || c != comm {
			continue
		}
		if !named(p, name) {
			continue
		}
		if ns := pidNS(procfsDir, p.PID); initNS != "" && ns != "" && ns != initNS {
			continue
		}
		st, err := p.Stat()
		if err != nil {
			continue // exited
		}
		started, err := startTime(procfsDir, st.Starttime)
		if err != nil {
			return nil, err
		}
		out = append(out, Proc{Proc: p, Started: started})
	}
	return out, nil
}

// named reports whether p's program is called name: its executable, or the name it was run
// by (argv[0]), as through a symlink such as /usr/bin/kubelet -> kubelet-v1.34.
func named(p procfs.Proc, name string) bool {
	// A binary replaced since it started (a package upgrade) reads "<path> (deleted)".
	if exe, err := p.Executable(); err == nil && filepath.Base(strings.TrimSuffix(exe, " (deleted)")) == name {
		return true
	}
	args, err := p.CmdLine()
	return err == nil && len(args) > 0 && filepath.Base(args[0]) == name
}

// pidNS is the PID namespace of the process pid, "" when it cannot be read (not root).
func pidNS(procfsDir string, pid int) string {
	ns, err := os.Readlink(filepath.Join(procfsDir, strconv.Itoa(pid), "ns", "pid"))
	if err != nil {
		return ""
	}
	return ns
}

// startTime is the wall-clock time of a start time in ticks since boot: now less the time
// since then, the uptime being read from the same procfs. Both have a resolution of 10ms,
// where the boot time of /proc/stat, which procfs.ProcStat.StartTime adds to the ticks, has
// a second: too coarse for a restart that follows a change by less than that.
func startTime(procfsDir string, ticks uint64) (time.Time, error) {
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
	since := time.Duration(up*float64(time.Second)) - time.Duration(ticks)*(time.Second/userHZ)
	return now.Add(-since), nil
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
