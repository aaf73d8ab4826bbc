//go:build !linux

package cgroup

import (
	"errors"
	"fmt"
)

// Create needs Linux cgroups.
func (l *Layout) Create(path string, lim Limits) error {
	return fmt.Errorf("creating cgroup %s: %w", path, errors.ErrUnsupported)
}

// AddProc needs Linux cgroups.
func (l *Layout) AddProc(path string, pid int) error {
	return fmt.Errorf("moving pid %d to cgroup %s: %w", pid, path, errors.ErrUnsupported)
}
