// Package sample reads cheap kernel counters (cgroup files, /proc) into sample records. Every
// value is cumulative (or a current level for memory usage) in base units: a window is the
// difference of two samples.
package sample

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nodectl/nodectl/agent/cgroup"
	"github.com/nodectl/nodectl/agent/record"
)

// pressureResources are the PSI files of a v2 cgroup (and of /proc/pressure).
var pressureResources = []string{"cpu", "memory", "io"}

func sample(now time.Time, cg, metric string, v float64, labels map[string]string) record.Record {
	return record.Record{Type: record.TypeSample, Time: now, Metric: metric, Cgroup: cg, Labels: labels, Value: &v}
}

// pressure appends path's PSI totals from its v2 directory. On a hybrid host the v2 cgroup
// exists only if its creator made one, and PSI may be off: missing files are skipped.
func pressure(out []record.Record, now time.Time, l *cgroup.Layout, path string) ([]record.Record, error) {
	if l.Unified == "" {
		return out, nil
	}
	for _, res := range pressureResources {
		b, err := os.ReadFile(filepath.Join(l.Dir(cgroup.Unified, path), res+".pressure"))
		if vanished(err) || errors.Is(err, syscall.EOPNOTSUPP) {
			continue
		}
		if err != nil {
			return out, err
		}
		totals, err := parsePressure(b)
		if err != nil {
			return out, fmt.Errorf("parsing %s.pressure: %w", res, err)
		}
		for kind, v := range totals {
			out = append(out, sample(now, path, record.MetricCgroupPressure, v, map[string]string{
				record.LabelResource: res, record.LabelKind: kind,
			}))
		}
	}
	return out, nil
}

// parsePressure returns the total= of each line of a PSI file, in seconds, by kind (some|full).
func parsePressure(b []byte) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		kind, rest, _ := strings.Cut(sc.Text(), " ")
		for f := range strings.FieldsSeq(rest) {
			v, ok := strings.CutPrefix(f, "total=")
			if !ok {
				continue
			}
			us, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return nil, err
			}
			out[kind] = float64(us) / 1e6
		}
	}
	return out, sc.Err()
}

// vanished says err means the cgroup (or file) is gone: missing, or removed while open.
func vanished(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENODEV)
}
