package launch

import (
	"maps"
	"path/filepath"
	"slices"

	"github.com/prometheus/procfs"

	"github.com/nodectl/nodectl/rundir"
)

// Roles of the host processes that run a workload.
const (
	RoleSandbox = rundir.RoleSandbox
	RoleGofer   = rundir.RoleGofer
	RoleStub    = rundir.RoleStub
	RoleProcess = rundir.RoleProcess
)

// classify names the role of each pid from its command line: runsc re-executes itself as
// `runsc-sandbox` and `runsc-gofer` (comm "exe"), and the sandbox forks the stubs.
func classify(procRoot string, pids []int) []rundir.HostProcess {
	fs, err := procfs.NewFS(procRoot)
	if err != nil {
		return nil
	}
	type info struct {
		comm, argv0 string
		ppid        int
	}
	infos := map[int]info{}
	for _, pid := range pids {
		p, err := fs.Proc(pid)
		if err != nil {
			continue // exited since the cgroup was read
		}
		st, err := p.Stat()
		if err != nil {
			continue
		}
		in := info{comm: st.Comm, ppid: st.PPID}
		if argv, err := p.CmdLine(); err == nil && len(argv) > 0 {
			in.argv0 = filepath.Base(argv[0])
		}
		infos[pid] = in
	}
	role := func(pid int) string {
		switch infos[pid].argv0 {
		case "runsc-sandbox":
			return RoleSandbox
		case "runsc-gofer":
			return RoleGofer
		}
		// Stubs are descendants of the sandbox.
		for p, hops := infos[pid].ppid, 0; p > 1 && hops < 16; hops++ {
			in, ok := infos[p]
			if !ok {
				break
			}
			if in.argv0 == "runsc-sandbox" {
				return RoleStub
			}
			p = in.ppid
		}
		return RoleProcess
	}
	var out []rundir.HostProcess
	for _, pid := range slices.Sorted(maps.Keys(infos)) {
		out = append(out, rundir.HostProcess{PID: pid, Comm: infos[pid].comm, Role: role(pid)})
	}
	return out
}
