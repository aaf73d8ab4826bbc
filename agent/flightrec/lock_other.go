//go:build !unix

package flightrec

import (
	"fmt"
	"os"
)

// lockDir opens dir; without flock, nothing stops a second writer.
func lockDir(dir string) (*os.File, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("flightrec: %w", err)
	}
	return f, nil
}
