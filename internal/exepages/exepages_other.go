//go:build !linux

package exepages

import "errors"

// Release needs Linux's madvise on the executable's mappings.
func Release() error { return errors.ErrUnsupported }

// Resident needs Linux's pagemap.
func Resident() (uint64, error) { return 0, errors.ErrUnsupported }
