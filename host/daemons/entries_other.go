//go:build !linux

package daemons

import (
	"os"
	"strconv"
)

// pidEntries lists the processes of the procfs at procfsDir, without inode numbers: a Walker
// reads every comm each time.
func pidEntries(procfsDir string) ([]procEntry, error) {
	names, err := os.ReadDir(procfsDir)
	if err != nil {
		return nil, err
	}
	var out []procEntry
	for _, n := range names {
		if pid, err := strconv.Atoi(n.Name()); err == nil && pid > 0 {
			out = append(out, procEntry{pid: pid})
		}
	}
	return out, nil
}
