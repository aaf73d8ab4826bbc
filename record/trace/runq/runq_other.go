//go:build !linux

package runq

import (
	"errors"
	"fmt"
	"log/slog"
)

// Tracer is only available on Linux.
type Tracer struct{}

// New fails: the tracer needs Linux.
func New(Config, *slog.Logger) (*Tracer, error) {
	return nil, fmt.Errorf("loading runq tracer: %w", errors.ErrUnsupported)
}

func (*Tracer) Read() (Stats, error)                  { return Stats{}, errors.ErrUnsupported }
func (*Tracer) Forget(func(uint64) bool) (int, error) { return 0, errors.ErrUnsupported }
func (*Tracer) Close() error                          { return nil }
