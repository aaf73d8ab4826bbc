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

// Find reports false: tracefs is Linux's.
func Find() (string, bool) { return "", false }

// Adopt returns a Mount that releases nothing: tracefs is Linux's.
func Adopt(string) *Mount { return &Mount{} }

func (*Mount) Dir() string    { return "" }
func (*Mount) Mounted() bool  { return false }
func (*Mount) Release() error { return nil }
