package sample

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// RunDelay is how long every thread of pids has waited on a run queue since it started, summed:
// the run_delay field of <procfs>/<pid>/task/<tid>/schedstat. It needs no tracer, but counts
// only the threads alive now. A process or thread that exits while being read is skipped.
func RunDelay(procfsDir string, pids []int) (time.Duration, error) {
	var total time.Duration
	for _, pid := range pids {
		tasks, err := os.ReadDir(filepath.Join(procfsDir, strconv.Itoa(pid), "task"))
		if vanished(err) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("listing threads of pid %d: %w", pid, err)
		}
		for _, t := range tasks {
			b, err := os.ReadFile(filepath.Join(procfsDir, strconv.Itoa(pid), "task", t.Name(), "schedstat"))
			if vanished(err) {
				continue
			}
			if err != nil {
				return 0, fmt.Errorf("reading schedstat of thread %s: %w", t.Name(), err)
			}
			d, err := parseRunDelay(b)
			if err != nil {
				return 0, fmt.Errorf("parsing schedstat of thread %s: %w", t.Name(), err)
			}
			total += d
		}
	}
	return total, nil
}

// parseRunDelay reads "<on-cpu ns> <run-queue wait ns> <timeslices>".
func parseRunDelay(b []byte) (time.Duration, error) {
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0, fmt.Errorf("%q: want on-CPU time, run-queue wait and timeslices", strings.TrimSpace(string(b)))
	}
	ns, err := strconv.ParseUint(f[1], 10, 63)
	if err != nil {
		return 0, fmt.Errorf("run-queue wait %q: %w", f[1], err)
	}
	return time.Duration(ns), nil
}
