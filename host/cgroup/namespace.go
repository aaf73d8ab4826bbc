package cgroup

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/procfs"
)

// A process in a private cgroup namespace (a container's: the runtimes' default on cgroup v2)
// reads the cgroup of a process outside it relative to the namespace's root, in
// /proc/<pid>/cgroup: "0::/../../system.slice/kubelet.service". The hierarchy mounted from the
// host (the agent's --cgroupfs) still shows the whole tree, and the root's place in it is where
// this process's own cgroup is, less the path its own /proc/self/cgroup gives: found once per
// hierarchy, since a namespace's root never moves.

// nsRoots caches each hierarchy directory's namespace root, or the error finding it.
var nsRoots sync.Map

type nsRoot struct {
	path string
	err  error
}

// ProcPath is ProcPath in l's hierarchy for controller as a path of the whole hierarchy, also
// when this process is in a cgroup namespace of its own.
func (l *Layout) ProcPath(p procfs.Proc, controller string) (string, error) {
	rel, err := ProcPath(p, controller, l.V1)
	if err != nil {
		return "", err
	}
	root, err := l.namespaceRoot(controller)
	if err != nil {
		return "", fmt.Errorf("pid %d: cgroup %s is relative to this process's cgroup namespace: %w", p.PID, rel, err)
	}
	return path.Join(root, rel), nil
}

// outside says whether a path read from /proc/<pid>/cgroup climbs above the reader's namespace.
func outside(rel string) bool { return rel == "/.." || strings.HasPrefix(rel, "/../") }

// inHostNamespace says whether this process reads pid 1's cgroup whole: then it is in the
// host's cgroup namespace (pid 1 is the host's init in the host's PID namespace, which the
// agent shares), every path reads whole, and nothing needs finding. /proc/1/cgroup is readable
// without the ptrace rights that /proc/1/ns/cgroup needs.
func inHostNamespace(controller string, v1 bool) bool {
	init, err := procfs.NewProc(1)
	if err != nil {
		return true
	}
	rel, err := ProcPath(init, controller, v1)
	return err != nil || !outside(rel)
}

// namespaceRoot is where this process's cgroup namespace is rooted in controller's hierarchy.
func (l *Layout) namespaceRoot(controller string) (string, error) {
	if inHostNamespace(controller, l.V1) {
		return "/", nil
	}
	dir := l.Dir(controller, "/")
	if dir == "" {
		return "", fmt.Errorf("no hierarchy for %s", controller)
	}
	if r, ok := nsRoots.Load(dir); ok {
		return r.(nsRoot).path, r.(nsRoot).err
	}
	r := nsRoot{}
	r.path, r.err = findNamespaceRoot(dir, controller, l.V1)
	nsRoots.Store(dir, r)
	return r.path, r.err
}

func findNamespaceRoot(dir, controller string, v1 bool) (string, error) {
	self, err := procfs.Self()
	if err != nil {
		return "", err
	}
	rel, err := ProcPath(self, controller, v1)
	if err != nil {
		return "", err
	}
	own, err := cgroupOf(dir, os.Getpid())
	if err != nil {
		return "", err
	}
	if rel == "/" {
		return own, nil
	}
	if !strings.HasSuffix(own, rel) {
		return "", fmt.Errorf("this process is in %s of %s but reads itself in %s", own, dir, rel)
	}
	if root := strings.TrimSuffix(own, rel); root != "" {
		return root, nil
	}
	return "/", nil
}

// cgroupOf walks the hierarchy at dir for the cgroup whose cgroup.procs lists pid.
func cgroupOf(dir string, pid int) (string, error) {
	want := strconv.Itoa(pid)
	found := ""
	errFound := errors.New("found")
	err := filepath.WalkDir(dir, func(d string, e fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) { // removed while walked
				return nil
			}
			return err
		}
		if !e.IsDir() {
			return nil
		}
		if lists(filepath.Join(d, "cgroup.procs"), want) {
			rel, err := filepath.Rel(dir, d)
			if err != nil {
				return err
			}
			found = filepath.Join("/", rel)
			return errFound
		}
		return nil
	})
	if found != "" {
		return found, nil
	}
	if err == nil {
		err = fmt.Errorf("pid %d is in no cgroup of %s", pid, dir)
	}
	return "", err
}

func lists(file, pid string) bool {
	f, err := os.Open(file)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if sc.Text() == pid {
			return true
		}
	}
	return false
}
