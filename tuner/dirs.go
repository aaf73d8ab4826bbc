package tuner

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"syscall"
)

// MissingDirs are dir and its ancestors (node paths) that do not exist, outermost first: what
// a backend records before Apply creates them, so Restore removes exactly those.
func (h Host) MissingDirs(dir string) []string {
	var out []string
	for ; dir != "/" && dir != "."; dir = path.Dir(dir) {
		if _, err := os.Lstat(h.Path(dir)); !errors.Is(err, fs.ErrNotExist) {
			break
		}
		out = append(out, dir)
	}
	slices.Reverse(out)
	return out
}

// RemoveDirs removes directories Apply made (node paths, outermost first), innermost first;
// one that gained other files since stays, and so do its ancestors.
func (h Host) RemoveDirs(dirs []string) error {
	for _, dir := range slices.Backward(dirs) {
		err := os.Remove(h.Path(dir))
		if errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
			continue
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing directory %s: %w", dir, err)
		}
	}
	return nil
}
