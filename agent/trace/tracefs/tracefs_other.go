//go:build !linux

package tracefs

import (
	"errors"
	"fmt"
)

// Mount is tracefs as Ensure found or made it.
type Mount struct{}

// Ensure fails: tracefs is Linux's.
func Ensure(dir string) (*Mount, error) {
	return nil, fmt.Errorf("mounting tracefs at %s: %w", dir, errors.ErrUnsupported)
}

// Available reports false: tracefs is Linux's.
func Available(string) bool { return false }

func (*Mount) Mounted() bool  { return false }
func (*Mount) Release() error { return nil }
