// Package blockdev names block devices the way the kernel records them and maps partitions and
// paths to the whole disk they live on, through sysfs.
package blockdev

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// Name formats a kernel dev_t (MAJOR<<20 | MINOR, the in-kernel encoding BPF programs read) as
// "MAJ:MIN".
func Name(dev uint32) string {
	return fmt.Sprintf("%d:%d", dev>>20, dev&(1<<20-1))
}

// wholeDisks caches WholeDisk answers by sysfs root and "MAJ:MIN": devices rarely change, and
// the tracers ask on every read.
var wholeDisks sync.Map

type cacheKey struct{ sysfs, majmin string }

// WholeDisk maps a partition's "MAJ:MIN" to its disk's; a whole disk maps to itself. A device
// sysfs does not know maps to the input, uncached, so that it resolves once it appears.
func WholeDisk(sysfs, majmin string) string {
	k := cacheKey{sysfs, majmin}
	if v, ok := wholeDisks.Load(k); ok {
		return v.(string)
	}
	dir, err := filepath.EvalSymlinks(filepath.Join(sysfs, "dev", "block", majmin))
	if err != nil {
		return majmin
	}
	disk := majmin
	// A partition's sysfs directory has a "partition" file and sits inside its disk's.
	if _, err := os.Stat(filepath.Join(dir, "partition")); err == nil {
		b, err := os.ReadFile(filepath.Join(filepath.Dir(dir), "dev"))
		if err != nil {
			return majmin
		}
		disk = strings.TrimSpace(string(b))
	}
	wholeDisks.Store(k, disk)
	return disk
}
