//go:build unix

package flightrec

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// lockDir opens dir and takes an exclusive flock on it, so that a second writer fails; the
// lock goes with the process, so a killed writer never leaves it behind.
func lockDir(dir string) (*os.File, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("flightrec: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("flightrec: %s is in use by another writer (an agent running?)", dir)
		}
		return nil, fmt.Errorf("flightrec: lock %s: %w", dir, err)
	}
	return f, nil
}
