// Package atomicfile replaces files whole, on renameio's pending files: a reader sees the old
// content or the new, never a part of either, and once a write returns, the new content and
// its name survive a crash (the file is synced before the rename, its directory after it,
// which renameio leaves to its caller).
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/google/renameio/v2"
)

// Write replaces path with data, with exactly the mode perm (no umask).
func Write(path string, data []byte, perm os.FileMode) error {
	f, err := Create(path, perm)
	if err != nil {
		return err
	}
	defer f.Abort()
	if _, err := f.Write(data); err != nil {
		return err
	}
	return f.Commit()
}

// File is a replacement being written: it takes path's place at Commit. Abort, deferred,
// removes it when Commit never ran or failed.
type File struct {
	*renameio.PendingFile
	path string
}

// Create starts a replacement of path with exactly the mode perm: a temporary file in path's
// directory (a rename within one filesystem is atomic), opened for reading and writing. What a
// crash left of an earlier replacement of path goes first: a path has one writer at a time.
func Create(path string, perm os.FileMode) (*File, error) {
	removeLeftovers(path)
	pf, err := renameio.NewPendingFile(path, renameio.WithTempDir(filepath.Dir(path)), renameio.WithStaticPermissions(perm))
	if err != nil {
		return nil, fmt.Errorf("replacing %s: %w", path, err)
	}
	return &File{PendingFile: pf, path: path}, nil
}

// Commit syncs the replacement, renames it over path and syncs path's directory.
func (f *File) Commit() error {
	if err := f.CloseAtomicallyReplace(); err != nil {
		return fmt.Errorf("replacing %s: %w", f.path, err)
	}
	return SyncDir(filepath.Dir(f.path))
}

// Abort removes a replacement that was not committed; after Commit it does nothing.
func (f *File) Abort() { _ = f.Cleanup() }

// removeLeftovers removes the replacements of path a crash left behind.
func removeLeftovers(path string) {
	dir, base := filepath.Split(path)
	entries, err := os.ReadDir(filepath.Clean(dir))
	if err != nil {
		return // Create reports it
	}
	for _, e := range entries {
		if rest, ok := strings.CutPrefix(e.Name(), "."+base); ok && isNumber(rest) {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

func isNumber(s string) bool {
	_, err := strconv.ParseInt(s, 10, 64)
	return err == nil
}

// Pending reports whether a directory entry's name is a replacement a crash left behind
// (renameio names one "." + the file's name + a random number): a program that writes its
// files here and no others of its own starting with "." removes these when it starts.
func Pending(name string) bool { return strings.HasPrefix(name, ".") }

// SyncDir flushes dir's entries to disk, so that a file created, renamed or removed in it
// survives a crash as it was left: a rename is durable only once its directory is synced.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("syncing %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", dir, err)
	}
	return nil
}
