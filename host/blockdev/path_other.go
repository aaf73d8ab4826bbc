//go:build !linux

package blockdev

import (
	"errors"
	"fmt"
)

// ForPath is the whole disk "MAJ:MIN" holding path; it needs Linux's sysfs.
func ForPath(sysfs, path string) (string, error) {
	return "", fmt.Errorf("finding the disk of %s: %w", path, errors.ErrUnsupported)
}
