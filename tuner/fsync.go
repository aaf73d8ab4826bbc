package tuner

import (
	"fmt"
	"os"
)

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
