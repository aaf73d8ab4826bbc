//go:build !linux

package sample

import (
	"errors"
	"time"

	"github.com/nodectl/nodectl/agent/cgroup"
	"github.com/nodectl/nodectl/agent/record"
)

type cgroups struct{}

// NewCgroups needs Linux cgroups; its Sample always fails.
func NewCgroups(l *cgroup.Layout, paths func() []string) Sampler { return cgroups{} }

func (cgroups) Sample(time.Time) ([]record.Record, error) { return nil, errors.ErrUnsupported }
