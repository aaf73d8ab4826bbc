//go:build !linux

package cgnames

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/nodectl/nodectl/host/cgroup"
)

// Tracer is only available on Linux.
type Tracer struct{}

// New fails: the tracer needs Linux.
func New(*slog.Logger) (*Tracer, error) {
	return nil, fmt.Errorf("loading cgnames tracer: %w", errors.ErrUnsupported)
}

func (*Tracer) Feed(func(cgroup.Change)) (bool, error) { return false, errors.ErrUnsupported }
func (*Tracer) Close() error                           { return nil }
