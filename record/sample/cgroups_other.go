//go:build !linux

package sample

import (
	"errors"
	"time"

	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/rundir"
)

// Cgroups samples per-cgroup counters.
type Cgroups struct{}

// NewCgroups needs Linux cgroups; its Sample always fails.
func NewCgroups(l *cgroup.Layout, paths func() []string) *Cgroups { return &Cgroups{} }

// Priority does nothing without cgroups; it returns s.
func (s *Cgroups) Priority(func(path string) bool) *Cgroups { return s }

// Sample fails: cgroups are Linux's.
func (*Cgroups) Sample(time.Time) ([]rundir.Record, error) { return nil, errors.ErrUnsupported }

// SampleFull fails: cgroups are Linux's.
func (*Cgroups) SampleFull(time.Time) ([]rundir.Record, error) { return nil, errors.ErrUnsupported }
