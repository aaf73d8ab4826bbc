//go:build !linux

package swapfile

import (
	"errors"
	"fmt"
)

// Create fails: swap files are Linux's here.
func Create(path string, size int64) (*File, error) {
	return nil, fmt.Errorf("creating swap file %s: %w", path, errors.ErrUnsupported)
}

// OpenDevice fails: swap is Linux's here.
func OpenDevice(path string) (*File, error) {
	return nil, fmt.Errorf("swap device %s: %w", path, errors.ErrUnsupported)
}

// Open fails: swap is Linux's here.
func Open(path string, on bool) (*File, error) {
	return nil, fmt.Errorf("opening swap area %s: %w", path, errors.ErrUnsupported)
}

// Enable fails: swap files are Linux's here.
func (f *File) Enable(prio int) error { return errors.ErrUnsupported }

// Disable does nothing: nothing was enabled.
func (f *File) Disable() error { return nil }

// Remove does nothing: nothing was made.
func (f *File) Remove() error { return nil }
