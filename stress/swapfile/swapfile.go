// Package swapfile makes, enables and removes the swap file of a test or a run, and lists the
// swap areas that are on, so a caller can check it left the node's swap as it found it.
package swapfile

import (
	"errors"
	"fmt"

	"github.com/prometheus/procfs"
)

// File is a swap file this package made, or a swap device a user formatted (OpenDevice).
type File struct {
	Path   string
	Size   int64 // bytes, a whole number of pages
	on     bool
	device bool // the user's: never written to or removed, only turned on and off
}

// ErrExists is returned by Create for a path that is already taken: a swap file is never made
// over an existing file, which may be someone's swap.
var ErrExists = errors.New("file exists")

// Active lists the swap areas on now, by path, from <procfsDir>/swaps.
func Active(procfsDir string) ([]string, error) {
	fs, err := procfs.NewFS(procfsDir)
	if err != nil {
		return nil, fmt.Errorf("opening procfs %s: %w", procfsDir, err)
	}
	swaps, err := fs.Swaps()
	if err != nil {
		return nil, fmt.Errorf("reading swaps: %w", err)
	}
	out := make([]string, 0, len(swaps))
	for _, s := range swaps {
		out = append(out, s.Filename)
	}
	return out, nil
}
