// Package swapfile is where nodectl calls swapon and swapoff and reads /proc/swaps: it makes,
// formats, enables and removes swap files, turns a formatted device on and off, and lists the
// areas that are on. The tuner's swap backend builds its setting on it; tests use it directly.
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

// ErrNotSwap is returned by Open for a file without a swap signature: it is never formatted
// here, as it may hold someone's data.
var ErrNotSwap = errors.New("no swap signature")

// Area is a swap area that is on, as <procfs>/swaps lists it.
type Area struct {
	// Path is the file or device as the kernel prints it: relative to the reader's root, with
	// space, tab, newline and backslash escaped as \ooo.
	Path string
	// Priority is the area's priority; negative when it was enabled without one, the kernel
	// then giving each such area the next lower number from -1.
	Priority int
	Size     int64  // bytes
	Used     int64  // bytes
	Type     string // "partition" or "file", as the kernel says
}

// Areas lists the swap areas on now, from <procfsDir>/swaps.
func Areas(procfsDir string) ([]Area, error) {
	fs, err := procfs.NewFS(procfsDir)
	if err != nil {
		return nil, fmt.Errorf("opening procfs %s: %w", procfsDir, err)
	}
	swaps, err := fs.Swaps()
	if err != nil {
		return nil, fmt.Errorf("reading swaps: %w", err)
	}
	out := make([]Area, 0, len(swaps))
	for _, s := range swaps {
		out = append(out, Area{Path: s.Filename, Priority: s.Priority, Size: int64(s.Size) << 10, Used: int64(s.Used) << 10, Type: s.Type})
	}
	return out, nil
}

// Active lists the swap areas on now, by path, from <procfsDir>/swaps.
func Active(procfsDir string) ([]string, error) {
	areas, err := Areas(procfsDir)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(areas))
	for _, a := range areas {
		out = append(out, a.Path)
	}
	return out, nil
}
