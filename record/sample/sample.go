// Package sample reads cheap kernel counters (cgroup files, /proc) into sample records. Every
// value is cumulative (or a current level: memory usage, swap, meminfo) in base units: a
// window is the difference of two samples.
package sample

import (
	"errors"
	"io/fs"
	"syscall"
	"time"

	"github.com/nodectl/nodectl/rundir"
)

// pressureResources are the PSI files of a v2 cgroup (and of /proc/pressure).
var pressureResources = []string{rundir.ResourceCPU, rundir.ResourceMemory, rundir.ResourceIO}

func sample(now time.Time, cg, metric string, v float64, labels map[string]string) rundir.Record {
	return rundir.Record{Type: rundir.TypeSample, Time: now, Metric: metric, Cgroup: cg, Labels: labels, Value: &v}
}

// vanished says err means the cgroup (or file) is gone: missing, or removed while open.
func vanished(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENODEV)
}
