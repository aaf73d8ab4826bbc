//go:build !linux

package sample

import (
	"errors"
	"time"

	"github.com/nodectl/nodectl/agent/cgroup"
	"github.com/nodectl/nodectl/agent/record"
)

// Cgroups samples per-cgroup counters.
type Cgroups struct{}

// NewCgroups needs Linux cgroups; its Sample always fails.
func NewCgroups(l *cgroup.Layout, paths func() []string) *Cgroups { return &Cgroups{} }

// Sample fails: cgroups are Linux's.
func (*Cgroups) Sample(time.Time) ([]record.Record, error) { return nil, errors.ErrUnsupported }
