// Package cpuset is the tuner's live CPU partition: system cgroups and system daemons on the
// reserved CPUs, workload cgroups on the others. The kubelet's reservedSystemCPUs does this for
// pods only after a restart and never pins the daemons; the partition does both now, on cgroup
// v1 (the cpuset hierarchy) and v2 (cpuset.cpus, enabling the controller where needed).
package cpuset

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/nodectl/nodectl/host"

	"github.com/prometheus/procfs"
	"k8s.io/utils/cpuset"

	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/host/daemons"
	"github.com/nodectl/nodectl/tuner"
)

// Backend is the backend's name in state files, and ID the partition's setting id.
const (
	Backend = "cpuset"
	ID      = Backend + ":partition"
)

// SystemCgroup is the cpuset cgroup the partition moves daemons into when no system cgroup
// holds them.
const SystemCgroup = cgroup.Parent + "/system"

// Partition is the partition's parameters, as recorded in the state file. Cgroup paths are
// below the cpuset hierarchy's root, e.g. system.slice or /kubepods.
type Partition struct {
	Reserved        string   `json:"reserved"`
	SystemCgroups   []string `json:"system_cgroups,omitempty"`
	WorkloadCgroups []string `json:"workload_cgroups,omitempty"`
	Daemons         []string `json:"daemons,omitempty"` // program names, as daemons.Procs matches them
}

type partition struct {
	h    host.FS
	p    Partition
	r, w cpuset.CPUSet
	err  error // a reserved list that cannot be used on this node; Read and Apply return it
	// detect finds the cpuset hierarchy; tests point it at a tree of plain files.
	detect func() (cgroup.Hierarchy, error)
}

// NewPartition is the partition p on h: its reserved CPUs for the system, the node's other
// online CPUs for workloads.
func NewPartition(h host.FS, p Partition) tuner.Setting {
	s := &partition{h: h, p: p}
	s.detect = s.detectHierarchy
	s.r, s.w, s.err = split(h, p.Reserved)
	for _, c := range slices.Concat(p.SystemCgroups, p.WorkloadCgroups) {
		if clean(c) == "/" {
			s.err = fmt.Errorf("%s: cgroup %q: the root cgroup has every CPU; name a cgroup below it", ID, c)
		}
	}
	return s
}

// Decode rebuilds a partition from its recorded Spec.
func Decode(h host.FS, raw json.RawMessage) (tuner.Setting, error) {
	var p Partition
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, fmt.Errorf("decoding cpuset partition spec: %w", err)
	}
	if p.Reserved == "" {
		return nil, fmt.Errorf("decoding cpuset partition spec %s: no reserved CPUs", raw)
	}
	return NewPartition(h, p), nil
}

// split parses the reserved list and takes it from the node's online CPUs.
func split(h host.FS, reserved string) (r, w cpuset.CPUSet, err error) {
	r, err = cpuset.Parse(reserved)
	if err != nil || r.IsEmpty() {
		return r, w, fmt.Errorf("%s: reserved CPUs %q: want a CPU list such as 0,1 or 0-7", ID, reserved)
	}
	file := filepath.Join(h.Sysfs, "devices/system/cpu/online")
	b, err := os.ReadFile(file)
	if err != nil {
		return r, w, fmt.Errorf("%s: reading the online CPUs: %w", ID, err)
	}
	online, err := cpuset.Parse(strings.TrimSpace(string(b)))
	if err != nil {
		return r, w, fmt.Errorf("%s: reading the online CPUs from %s: %w", ID, file, err)
	}
	if !r.IsSubsetOf(online) {
		return r, w, fmt.Errorf("%s: reserved CPUs %s: the node's online CPUs are %s", ID, r, online)
	}
	w = online.Difference(r)
	if w.IsEmpty() {
		return r, w, fmt.Errorf("%s: reserved CPUs %s: that is every online CPU, leaving none for workloads", ID, r)
	}
	return r, w, nil
}

func (s *partition) ID() string      { return ID }
func (s *partition) Backend() string { return Backend }
func (s *partition) Spec() any       { return s.p }
func (s *partition) Desired() string { return text(s.r, s.w) }

func text(system, workloads cpuset.CPUSet) string {
	return fmt.Sprintf("system %s, workloads %s", system, workloads)
}

// Live reports the partition that the applied, complete state st holds: the CPU lists of the
// system and of workloads, from its recorded parameters and the node's online CPUs below
// sysfs. A stress run places its workloads by it. An error says the recorded partition no
// longer fits the node (a CPU went offline).
func Live(st *tuner.State, sysfs string) (system, workloads string, ok bool, err error) {
	if st == nil || !st.Complete() {
		return "", "", false, nil
	}
	for _, r := range st.Settings {
		if r.ID != ID {
			continue
		}
		var p Partition
		if err := json.Unmarshal(r.Spec, &p); err != nil {
			return "", "", false, fmt.Errorf("%s: decoding the recorded spec: %w", ID, err)
		}
		rs, ws, err := split(host.FS{Sysfs: sysfs}, p.Reserved)
		if err != nil {
			return "", "", false, err
		}
		return rs.String(), ws.String(), true, nil
	}
	return "", "", false, nil
}

func (s *partition) detectHierarchy() (cgroup.Hierarchy, error) {
	l, err := cgroup.DetectProcfs(s.h.Cgroupfs, s.h.Procfs)
	if err != nil {
		return cgroup.Hierarchy{}, err
	}
	return l.Hierarchy(cgroup.CPUSet)
}

// ancestors are the cgroups above p, the root first.
func ancestors(p string) []string {
	var out []string
	for d := filepath.Dir(p); ; d = filepath.Dir(d) {
		out = append(out, d)
		if d == "/" {
			break
		}
	}
	slices.Reverse(out)
	return out
}

// depth is how far below the root p is: the root 0, /kubepods 1.
func depth(p string) int {
	if p == "/" {
		return 0
	}
	return strings.Count(p, "/")
}

// clean makes a configured cgroup path absolute: "system.slice" is "/system.slice".
func clean(p string) string { return filepath.Clean("/" + p) }

// display is a cgroup path as people write it: system.slice.
func display(p string) string { return strings.TrimPrefix(p, "/") }

// change is one cgroup's cpuset.cpus going from one value to another.
type change struct {
	Path string `json:"path"`
	From string `json:"cpus"` // what it was: recorded for restore
	to   string
}

// move is a daemon process in a cpuset cgroup outside the system's CPUs.
type move struct {
	PID    int    `json:"pid"`
	Start  uint64 `json:"start"` // start time in clock ticks: tells a reused pid apart
	Comm   string `json:"comm"`
	Cgroup string `json:"cgroup"`
}

// data is what Restore needs: every cgroup's previous cpus, every moved daemon's cgroup, the
// cgroups whose subtree_control gains cpuset (v2), and whether nodectl's cgroups existed.
type data struct {
	Cgroups       []change `json:"cgroups,omitempty"`
	Moves         []move   `json:"pids,omitempty"`
	Enabled       []string `json:"subtree_control,omitempty"`
	ParentExisted bool     `json:"nodectl_existed"`
	SystemExisted bool     `json:"system_existed"`
}

// plan is what the partition finds and what Apply would do about it.
type plan struct {
	data
	diffs []string // what differs, for the Text
}

// tree plans one system or workload cgroup and its descendants: top gets target; a descendant
// keeps what it has of target (all of it when nothing). It holds when every one's CPUs are
// within target and, when exact (system), the top's are target.
func (pl *plan) tree(hy cgroup.Hierarchy, role, top string, target cpuset.CPUSet, exact bool) error {
	if !hy.Exists(top) {
		return nil
	}
	var failed []string
	var failedCPUs string
	effective := map[string]cpuset.CPUSet{}
	// Pods come and go while the tree is read; one that went is no longer there to change.
	err := hy.Walk(top, func(p string) error {
		raw, err := hy.CPUs(p)
		if errors.Is(err, fs.ErrNotExist) {
			return filepath.SkipDir
		}
		if err != nil {
			return err
		}
		set, err := cpuset.Parse(raw)
		if err != nil {
			return fmt.Errorf("reading %s: %w", filepath.Join(hy.Dir(p), "cpuset.cpus"), err)
		}
		// On v2 an empty cpuset.cpus takes the parent's, and what a cgroup gets is always
		// within its parent's.
		eff := set
		if hy.V2 {
			parent, ok := effective[filepath.Dir(p)]
			if !ok {
				if parent, err = inherited(hy, filepath.Dir(p)); err != nil {
					return err
				}
			}
			if raw == "" {
				eff = parent
			} else {
				eff = set.Intersection(parent)
			}
		}
		effective[p] = eff
		ok := eff.IsSubsetOf(target)
		if p == top && exact {
			ok = eff.Equals(target)
		}
		if !ok {
			if failed == nil {
				failedCPUs = eff.String()
			}
			failed = append(failed, display(p))
		}
		to := target
		if p != top {
			if hy.V2 && raw == "" {
				return nil // inherits the top's
			}
			if kept := set.Intersection(target); !kept.IsEmpty() {
				to = kept
			}
		}
		if !set.Equals(to) || raw == "" {
			pl.Cgroups = append(pl.Cgroups, change{Path: p, From: raw, to: to.String()})
			if err := pl.enable(hy, p); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("reading the cpusets below %s: %w", hy.Dir(top), err)
	}
	if len(failed) > 0 {
		what := failed[0]
		if len(failed) > 1 {
			what += fmt.Sprintf(" and %d below", len(failed)-1)
		}
		pl.diffs = append(pl.diffs, fmt.Sprintf("%s %s (%s)", role, orNone(failedCPUs), what))
	}
	return nil
}

func orNone(cpus string) string {
	if cpus == "" {
		return "none"
	}
	return cpus
}

// inherited is what p gets on v2: its own cpus within its parent's, the root's being all
// online CPUs (its cpuset.cpus.effective).
func inherited(hy cgroup.Hierarchy, p string) (cpuset.CPUSet, error) {
	if p == "/" {
		all, err := hy.EffectiveCPUs(p)
		if err != nil {
			return cpuset.New(), err
		}
		return cpuset.Parse(all)
	}
	parent, err := inherited(hy, filepath.Dir(p))
	if err != nil {
		return parent, err
	}
	raw, err := hy.CPUs(p)
	if err != nil || raw == "" {
		return parent, err
	}
	set, err := cpuset.Parse(raw)
	if err != nil {
		return parent, err
	}
	return set.Intersection(parent), nil
}

// enable notes the ancestors of p (v2) that must hand cpuset down for p to have cpuset.cpus.
func (pl *plan) enable(hy cgroup.Hierarchy, p string) error {
	for _, a := range ancestors(p) {
		if slices.Contains(pl.Enabled, a) || !hy.Exists(a) {
			continue
		}
		on, err := hy.Enabled(a)
		if err != nil {
			return err
		}
		if !on {
			pl.Enabled = append(pl.Enabled, a)
		}
	}
	return nil
}

func (s *partition) systemTrees(hy cgroup.Hierarchy) []string {
	var out []string
	for _, c := range s.p.SystemCgroups {
		out = append(out, clean(c))
	}
	// Daemons moved earlier stay confined only while nodectl's own system cgroup is on the
	// reserved CPUs too.
	if hy.Exists(SystemCgroup) && !slices.Contains(out, SystemCgroup) {
		out = append(out, SystemCgroup)
	}
	return out
}

func under(p, top string) bool { return p == top || strings.HasPrefix(p, top+"/") }

// plan reads the node: the cgroups and daemons outside the partition and what Apply would do.
func (s *partition) plan(hy cgroup.Hierarchy) (*plan, error) {
	pl := &plan{}
	pl.ParentExisted, pl.SystemExisted = hy.Exists(cgroup.Parent), hy.Exists(SystemCgroup)
	system := s.systemTrees(hy)
	for _, c := range system {
		if err := pl.tree(hy, "system", c, s.r, true); err != nil {
			return nil, err
		}
	}
	for _, c := range s.p.WorkloadCgroups {
		if err := pl.tree(hy, "workloads", clean(c), s.w, false); err != nil {
			return nil, err
		}
	}
	outside, err := s.daemons(hy)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(outside, func(a, b move) int { return a.PID - b.PID })
	for _, m := range outside {
		pl.diffs = append(pl.diffs, fmt.Sprintf("%s[%d] outside", m.Comm, m.PID))
		// A daemon in a system cgroup is confined when that cgroup is.
		if !slices.ContainsFunc(system, func(top string) bool { return hy.Exists(top) && under(m.Cgroup, top) }) {
			pl.Moves = append(pl.Moves, m)
		}
	}
	if len(pl.Moves) > 0 {
		for _, a := range []string{"/", cgroup.Parent} {
			if hy.Exists(a) && !slices.Contains(pl.Enabled, a) {
				if on, err := hy.Enabled(a); err != nil {
					return nil, err
				} else if !on {
					pl.Enabled = append(pl.Enabled, a)
				}
			}
		}
	}
	slices.SortStableFunc(pl.Enabled, func(a, b string) int { return depth(a) - depth(b) })
	return pl, nil
}

// daemons are the processes named in Daemons that may run outside the reserved CPUs, by pid.
func (s *partition) daemons(hy cgroup.Hierarchy) ([]move, error) {
	if len(s.p.Daemons) == 0 {
		return nil, nil
	}
	procs, err := daemons.Procs(s.h.Procfs, s.p.Daemons...)
	if err != nil {
		return nil, err
	}
	var out []move
	for _, d := range procs {
		p := d.Proc
		comm, err := p.Comm()
		if err != nil {
			continue
		}
		// A process that exits while it is read is no daemon to move.
		st, err := p.NewStatus()
		if err != nil {
			continue
		}
		allowed := make([]int, len(st.CpusAllowedList))
		for i, c := range st.CpusAllowedList {
			allowed[i] = int(c)
		}
		if cpuset.New(allowed...).IsSubsetOf(s.r) {
			continue
		}
		stat, err := p.Stat()
		if err != nil {
			continue
		}
		cg, err := cpusetCgroup(p, hy)
		if err != nil {
			continue
		}
		out = append(out, move{PID: p.PID, Start: stat.Starttime, Comm: comm, Cgroup: cg})
	}
	return out, nil
}

// cpusetCgroup is p's cgroup in the cpuset hierarchy.
func cpusetCgroup(p procfs.Proc, hy cgroup.Hierarchy) (string, error) {
	return cgroup.ProcPath(p, hy.Controller, !hy.V2)
}

func (s *partition) errf(hy cgroup.Hierarchy, err error) error {
	return fmt.Errorf("%s (%s): %w", ID, hy.Root, err)
}

func (s *partition) Read(context.Context) (tuner.Value, error) {
	if s.err != nil {
		return tuner.Value{}, s.err
	}
	hy, err := s.detect()
	if err != nil {
		return tuner.Value{}, fmt.Errorf("%s: %w", ID, err)
	}
	pl, err := s.plan(hy)
	if err != nil {
		return tuner.Value{}, s.errf(hy, err)
	}
	raw, err := json.Marshal(pl.data)
	if err != nil {
		return tuner.Value{}, s.errf(hy, err)
	}
	t := s.Desired()
	if len(pl.diffs) > 0 {
		t = strings.Join(pl.diffs, "; ")
	}
	return tuner.Value{Present: true, Text: t, Data: raw}, nil
}

// transition writes each cgroup's cpus so that no write breaks the v1 rule that a parent's
// CPUs hold its children's: first every cgroup, parents first, gets the union of what it has
// and what it will have, then, children first, what it will have.
func transition(hy cgroup.Hierarchy, changes []change) error {
	sorted := slices.Clone(changes)
	slices.SortStableFunc(sorted, func(a, b change) int { return depth(a.Path) - depth(b.Path) })
	for _, c := range sorted {
		// v2 has no such rule: a child's CPUs are cut to its parent's.
		if hy.V2 || c.to == "" || !hy.Exists(c.Path) {
			continue
		}
		cur, err := hy.CPUs(c.Path)
		if err != nil {
			if ignoreGone(err) == nil {
				continue
			}
			return err
		}
		curSet, err1 := cpuset.Parse(cur)
		toSet, err2 := cpuset.Parse(c.to)
		if err := errors.Join(err1, err2); err != nil {
			return fmt.Errorf("cpuset of %s: %w", c.Path, err)
		}
		if u := curSet.Union(toSet); !u.Equals(curSet) {
			if err := hy.SetCPUs(c.Path, u.String()); ignoreGone(err) != nil {
				return err
			}
		}
	}
	for _, c := range slices.Backward(sorted) {
		if !hy.Exists(c.Path) {
			continue
		}
		if cur, err := hy.CPUs(c.Path); err != nil {
			if ignoreGone(err) == nil {
				continue
			}
			return err
		} else if cur == c.to {
			continue
		}
		if err := hy.SetCPUs(c.Path, c.to); ignoreGone(err) != nil {
			return err
		}
	}
	return nil
}

// ignoreGone drops the error of a cgroup that was removed meanwhile (a pod that ended).
func ignoreGone(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

func (s *partition) Apply(context.Context) error {
	if s.err != nil {
		return s.err
	}
	hy, err := s.detect()
	if err != nil {
		return fmt.Errorf("%s: %w", ID, err)
	}
	pl, err := s.plan(hy)
	if err != nil {
		return s.errf(hy, err)
	}
	for _, p := range pl.Enabled {
		if err := hy.Enable(p); err != nil {
			return s.errf(hy, err)
		}
	}
	if err := transition(hy, pl.Cgroups); err != nil {
		return s.errf(hy, err)
	}
	if len(pl.Moves) == 0 {
		return nil
	}
	if err := s.makeSystem(hy); err != nil {
		return s.errf(hy, err)
	}
	for _, m := range pl.Moves {
		if err := hy.AddProc(SystemCgroup, m.PID); err != nil && !errors.Is(err, syscall.ESRCH) {
			return s.errf(hy, fmt.Errorf("confining %s to the reserved CPUs: %w", m.Comm, err))
		}
	}
	return nil
}

// makeSystem makes nodectl's system cgroup on the reserved CPUs, and its parent; on v2 the
// parents hand the controller down.
func (s *partition) makeSystem(hy cgroup.Hierarchy) error {
	for _, p := range []string{cgroup.Parent, SystemCgroup} {
		if hy.Exists(p) {
			continue
		}
		if err := hy.Enable(filepath.Dir(p)); err != nil {
			return err
		}
		if err := hy.Create(p); err != nil {
			return err
		}
	}
	if cur, err := hy.CPUs(SystemCgroup); err != nil {
		return err
	} else if cur != s.r.String() {
		return hy.SetCPUs(SystemCgroup, s.r.String())
	}
	return nil
}

// recorded is the data of a recorded value.
func recorded(v tuner.Value) (data, error) {
	var d data
	if len(v.Data) > 0 {
		if err := json.Unmarshal(v.Data, &d); err != nil {
			return d, fmt.Errorf("%s: decoding the recorded value: %w", ID, err)
		}
	}
	return d, nil
}

func (s *partition) Restore(_ context.Context, prev tuner.Value) error {
	d, err := recorded(prev)
	if err != nil {
		return err
	}
	hy, err := s.detect()
	if err != nil {
		return fmt.Errorf("%s: %w", ID, err)
	}
	if err := s.moveBack(hy, d.Moves); err != nil {
		return s.errf(hy, err)
	}
	changes := make([]change, len(d.Cgroups))
	for i, c := range d.Cgroups {
		changes[i] = change{Path: c.Path, to: c.From}
	}
	if err := transition(hy, changes); err != nil {
		return s.errf(hy, err)
	}
	if !d.SystemExisted {
		if err := s.removeSystem(hy, d.Moves); err != nil {
			return s.errf(hy, err)
		}
	}
	if !d.ParentExisted {
		// A stress run may live below it; then it stays until that run prunes it.
		if err := hy.Prune(cgroup.Parent); err != nil {
			return s.errf(hy, err)
		}
	}
	for _, p := range slices.Backward(d.Enabled) {
		if !hy.Exists(p) {
			continue
		}
		if err := hy.Disable(p); err != nil {
			return s.errf(hy, err)
		}
	}
	return nil
}

// moveBack puts each moved daemon back into the cgroup it came from; one that exited, or whose
// pid now names another process, is skipped.
func (s *partition) moveBack(hy cgroup.Hierarchy, moves []move) error {
	if len(moves) == 0 {
		return nil
	}
	pfs, err := procfs.NewFS(s.h.Procfs)
	if err != nil {
		return err
	}
	for _, m := range moves {
		p, err := pfs.Proc(m.PID)
		if err != nil {
			continue
		}
		st, err := p.Stat()
		if err != nil || st.Starttime != m.Start {
			continue
		}
		if cg, err := cpusetCgroup(p, hy); err == nil && cg == m.Cgroup {
			continue
		}
		if err := hy.AddProc(m.Cgroup, m.PID); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("moving %s back: %w", m.Comm, err)
		}
	}
	return nil
}

// removeSystem removes nodectl's system cgroup. A process still in it was not recorded: a child
// that a moved daemon forked there (containerd's shims), or a daemon that started since and
// was moved without a re-apply recording it. A child goes to the cgroup its nearest recorded
// ancestor was moved back to, where it would be had the daemon never moved (on v2 that is the
// daemon's systemd unit, which accounts for it and stops it with the daemon); any other
// process goes to the root cgroup, where a process starts.
func (s *partition) removeSystem(hy cgroup.Hierarchy, moves []move) error {
	if !hy.Exists(SystemCgroup) {
		return nil
	}
	pids, err := hy.Procs(SystemCgroup)
	if err != nil {
		return err
	}
	pfs, err := procfs.NewFS(s.h.Procfs)
	if err != nil {
		return err
	}
	for _, pid := range pids {
		to := "/"
		if m, ok := recordedAncestor(pfs, pid, moves); ok {
			to = m.Cgroup
		}
		if err := hy.AddProc(to, pid); err != nil && !errors.Is(err, syscall.ESRCH) {
			return err
		}
	}
	return hy.Remove(SystemCgroup)
}

// recordedAncestor is the move of pid's nearest ancestor process that apply moved (the same
// process: its start time matches).
func recordedAncestor(pfs procfs.FS, pid int, moves []move) (move, bool) {
	if len(moves) == 0 {
		return move{}, false
	}
	p, err := pfs.Proc(pid)
	if err != nil {
		return move{}, false
	}
	st, err := p.Stat()
	// Pid 1 and the kernel's threads (ppid 0) end the chain; the bound guards against a loop
	// while pids are reused.
	for i := 0; err == nil && st.PPID > 1 && i < 64; i++ {
		if p, err = pfs.Proc(st.PPID); err != nil {
			break
		}
		if st, err = p.Stat(); err != nil {
			break
		}
		if k := slices.IndexFunc(moves, func(m move) bool { return m.PID == p.PID && m.Start == st.Starttime }); k >= 0 {
			return moves[k], true
		}
	}
	return move{}, false
}

// Restored reports whether what prev recorded is back. Comparing texts would not do: the
// text names daemon pids and counts the cgroups below a workload cgroup, which change on
// their own (a daemon restarts, pods come and go). Back means: every recorded cgroup that
// still exists has its recorded CPUs (and on v2, a parent apply enabled cpuset in no longer
// hands it down), every moved daemon still running as the same process is in its recorded
// cgroup, and nodectl's cgroups exist exactly when they did, except that /nodectl stays
// while other cgroups (a stress run's) are below it.
func (s *partition) Restored(_ context.Context, prev tuner.Value) (bool, string, error) {
	d, err := recorded(prev)
	if err != nil {
		return false, "", err
	}
	hy, err := s.detect()
	if err != nil {
		return false, "", fmt.Errorf("%s: %w", ID, err)
	}
	var why []string
	for _, c := range d.Cgroups {
		if !hy.Exists(c.Path) {
			continue
		}
		cur, err := hy.CPUs(c.Path)
		if ignoreGone(err) != nil {
			return false, "", s.errf(hy, err)
		}
		if err == nil && cur != c.From {
			why = append(why, fmt.Sprintf("%s has CPUs %s, recorded %s", display(c.Path), orNone(cur), orNone(c.From)))
		}
	}
	for _, p := range d.Enabled {
		if !hy.Exists(p) {
			continue
		}
		on, err := hy.Enabled(p)
		if ignoreGone(err) != nil {
			return false, "", s.errf(hy, err)
		}
		if on {
			why = append(why, fmt.Sprintf("%s still enables cpuset in cgroup.subtree_control", filepath.Join(hy.Dir(p), "cgroup.subtree_control")))
		}
	}
	if len(d.Moves) > 0 {
		pfs, err := procfs.NewFS(s.h.Procfs)
		if err != nil {
			return false, "", s.errf(hy, err)
		}
		for _, m := range d.Moves {
			p, err := pfs.Proc(m.PID)
			if err != nil {
				continue
			}
			st, err := p.Stat()
			if err != nil || st.Starttime != m.Start {
				continue
			}
			if cg, err := cpusetCgroup(p, hy); err == nil && cg != m.Cgroup {
				why = append(why, fmt.Sprintf("%s[%d] is in %s, recorded %s", m.Comm, m.PID, cg, m.Cgroup))
			}
		}
	}
	if hy.Exists(SystemCgroup) != d.SystemExisted {
		why = append(why, existence(SystemCgroup, d.SystemExisted))
	}
	// A stress run living below /nodectl keeps it: Restore leaves it for the run to prune.
	if hy.Exists(cgroup.Parent) != d.ParentExisted && (d.ParentExisted || !hasChildren(hy, cgroup.Parent)) {
		why = append(why, existence(cgroup.Parent, d.ParentExisted))
	}
	if len(why) > 0 {
		return false, strings.Join(why, "; "), nil
	}
	return true, "", nil
}

func hasChildren(hy cgroup.Hierarchy, p string) bool {
	below, err := hy.Children(p)
	return err == nil && len(below) > 0
}

func existence(p string, existed bool) string {
	if existed {
		return fmt.Sprintf("cgroup %s is gone; it existed", p)
	}
	return fmt.Sprintf("cgroup %s exists; it did not", p)
}

// Merge extends the first apply's record with what a re-apply after drift changes beyond it:
// the earlier CPUs of cgroups it did not change, daemons that started since with the cgroups
// they are in, parents whose cpuset it enables. Whatever both record keeps the first value,
// the node before any tuning; so do whether nodectl's cgroups existed.
func (s *partition) Merge(first, now tuner.Value) (tuner.Value, error) {
	f, err := recorded(first)
	if err != nil {
		return tuner.Value{}, err
	}
	n, err := recorded(now)
	if err != nil {
		return tuner.Value{}, err
	}
	for _, c := range n.Cgroups {
		// nodectl's own system cgroup did not exist before: restore removes it, whatever
		// CPUs someone gave it since.
		if (c.Path == SystemCgroup && !f.SystemExisted) || slices.ContainsFunc(f.Cgroups, func(o change) bool { return o.Path == c.Path }) {
			continue
		}
		f.Cgroups = append(f.Cgroups, c)
	}
	for _, m := range n.Moves {
		if !slices.ContainsFunc(f.Moves, func(o move) bool { return o.PID == m.PID && o.Start == m.Start }) {
			f.Moves = append(f.Moves, m)
		}
	}
	for _, p := range n.Enabled {
		if !slices.Contains(f.Enabled, p) {
			f.Enabled = append(f.Enabled, p)
		}
	}
	// Restore disables cpuset children first.
	slices.SortStableFunc(f.Enabled, func(a, b string) int { return depth(a) - depth(b) })
	raw, err := json.Marshal(f)
	if err != nil {
		return tuner.Value{}, fmt.Errorf("%s: recording the merged value: %w", ID, err)
	}
	return tuner.Value{Present: first.Present, Text: first.Text, Data: raw}, nil
}
