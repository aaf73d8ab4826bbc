package cgroup

import (
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
)

const (
	// removeTimeout bounds Remove: killing, waiting for exits and rmdir retries together.
	removeTimeout = 10 * time.Second
	// freezeTimeout bounds the wait for a v1 freezer: tasks in uninterruptible sleep can hold
	// it in FREEZING, and killing them unfrozen is still better than waiting.
	freezeTimeout = time.Second
)

// Procs lists the processes in path and below, in any hierarchy, sorted.
func (l *Layout) Procs(path string) ([]int, error) {
	seen := map[int]bool{}
	for _, root := range l.roots() {
		err := walkDirs(filepath.Join(root, path), func(dir string) error {
			pids, err := readProcs(dir)
			for _, p := range pids {
				seen[p] = true
			}
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("listing processes of cgroup %s: %w", path, err)
		}
	}
	out := make([]int, 0, len(seen))
	for p := range seen {
		out = append(out, p)
	}
	slices.Sort(out)
	return out, nil
}

// Remove kills every process in path and below and removes the cgroups, deepest first, from
// every hierarchy. Hierarchies where path is missing are skipped.
func (l *Layout) Remove(path string) error {
	if err := checkPath(path); err != nil {
		return err
	}
	deadline := time.Now().Add(removeTimeout)
	if err := l.kill(path, deadline); err != nil {
		return fmt.Errorf("removing cgroup %s: %w", path, err)
	}
	var errs []error
	for _, root := range l.roots() {
		var dirs []string
		if err := walkDirs(filepath.Join(root, path), func(dir string) error {
			dirs = append(dirs, dir)
			return nil
		}); err != nil {
			errs = append(errs, err)
			continue
		}
		// Walked parents first, so backwards every child goes before its parent.
		for _, d := range slices.Backward(dirs) {
			if err := rmdir(d, deadline); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("removing cgroup %s: %w", path, err)
	}
	return nil
}

// kill SIGKILLs everything in path until nothing is left or the deadline passes. cgroup.kill
// (v2, 5.14+) and the v1 freezer stop forks racing the kill loop.
func (l *Layout) kill(path string, deadline time.Time) error {
	if l.Unified != "" {
		// Missing on older kernels, or when path has no v2 cgroup: the loop below copes.
		_ = os.WriteFile(filepath.Join(l.Unified, path, "cgroup.kill"), []byte("1"), 0o644)
	}
	var freezer string
	if m, ok := l.Mounts["freezer"]; ok {
		if dir := filepath.Join(m, path); freeze(dir) == nil {
			freezer = dir
		}
	}
	defer func() {
		if freezer != "" {
			_ = setFreezer(freezer, "THAWED")
		}
	}()
	self := os.Getpid()
	for {
		pids, err := l.Procs(path)
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes still running after %s: %v", removeTimeout, pids)
		}
		for _, p := range pids {
			if p != self {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
		}
		// Frozen tasks die of the pending SIGKILL once thawed, before they can fork again.
		if freezer != "" {
			_ = setFreezer(freezer, "THAWED")
			freezer = ""
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// freeze asks the v1 freezer to stop dir's tasks and waits, a bounded time, until they are.
func freeze(dir string) error {
	if err := setFreezer(dir, "FROZEN"); err != nil {
		return err
	}
	for end := time.Now().Add(freezeTimeout); time.Now().Before(end); time.Sleep(time.Millisecond) {
		b, err := os.ReadFile(filepath.Join(dir, "freezer.state"))
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(b)) == "FROZEN" {
			return nil
		}
	}
	return nil
}

func setFreezer(dir, state string) error {
	return os.WriteFile(filepath.Join(dir, "freezer.state"), []byte(state), 0o644)
}

// rmdir removes an empty cgroup dir, retrying while the kernel still counts exiting tasks.
func rmdir(dir string, deadline time.Time) error {
	for {
		err := syscall.Rmdir(dir)
		if err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			return &os.PathError{Op: "rmdir", Path: dir, Err: err}
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// walkDirs calls fn on top and every directory below it, parents first; a missing top, or
// a dir vanishing meanwhile, is not an error.
func walkDirs(top string, fn func(dir string) error) error {
	return filepath.WalkDir(top, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.IsDir() {
			return nil
		}
		return fn(p)
	})
}

// readProcs reads dir/cgroup.procs; a dir removed meanwhile has none.
func readProcs(dir string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENODEV) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []int
	for f := range strings.FieldsSeq(string(b)) {
		p, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("parsing %s/cgroup.procs: %w", dir, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// Prune removes path from every hierarchy where it is an empty leaf, and leaves it wherever
// something still lives below it. It kills nothing, so it is safe on a parent that other runs
// share (the nodectl parent): the last one out removes it.
func (l *Layout) Prune(path string) error {
	if err := checkPath(path); err != nil {
		return err
	}
	var errs []error
	for _, root := range l.roots() {
		errs = append(errs, prune(filepath.Join(root, path)))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("pruning cgroup %s: %w", path, err)
	}
	return nil
}

// prune removes dir unless it is missing, or busy with processes or cgroups below it.
func prune(dir string) error {
	err := os.Remove(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.EBUSY) && !errors.Is(err, syscall.ENOTEMPTY) {
		return err
	}
	return nil
}
