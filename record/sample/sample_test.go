//go:build linux

package sample

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/procfs/blockdevice"
	"golang.org/x/sys/unix"

	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/rundir"
)

func TestReadPressure(t *testing.T) {
	recs, err := readPressure("io")(nil, time.Now(), "/a", []byte("some avg10=1.50 avg60=0.00 avg300=0.00 total=2500000\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=42\n"))
	if err != nil {
		t.Fatal(err)
	}
	if some, full := value(t, recs, "/a", rundir.MetricCgroupPressure, rundir.LabelResource, "io", rundir.LabelKind, "some"),
		value(t, recs, "/a", rundir.MetricCgroupPressure, rundir.LabelResource, "io", rundir.LabelKind, "full"); some != 2.5 || full != 42e-6 || len(recs) != 2 {
		t.Fatalf("got some %v, full %v in %d records", some, full, len(recs))
	}
}

// testParent detects the host's cgroups and returns a fresh parent path /nodectl/<kind>-*,
// removed with everything in it when the test ends.
func testParent(tb testing.TB, kind string) (*cgroup.Layout, string) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root to create cgroups")
	}
	l, err := cgroup.Detect("/sys/fs/cgroup")
	if err != nil {
		tb.Fatal(err)
	}
	parent := fmt.Sprintf("%s/%s-%d-%08x", cgroup.Parent, kind, os.Getpid(), rand.Uint32())
	tb.Cleanup(func() {
		if err := l.Remove(parent); err != nil {
			tb.Errorf("cleanup: %v", err)
		}
		if err := l.Prune(cgroup.Parent); err != nil {
			tb.Errorf("cleanup: %v", err)
		}
	})
	return l, parent
}

// value finds the one record of metric for cgroup with the given labels (key, value pairs).
func value(t *testing.T, recs []rundir.Record, cg, metric string, labels ...string) float64 {
	t.Helper()
	var found []float64
	for _, r := range recs {
		if r.Metric != metric || r.Cgroup != cg || r.Type != rundir.TypeSample || r.Value == nil {
			continue
		}
		match := true
		for i := 0; i+1 < len(labels); i += 2 {
			match = match && r.Labels[labels[i]] == labels[i+1]
		}
		if match {
			found = append(found, *r.Value)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d records of %s %v for cgroup %q, want 1", len(found), metric, labels, cg)
	}
	return found[0]
}

// busyIn starts a shell busy loop in path's cgroup. It waits on stdin until it has been moved
// there, so that none of its work is done outside; it is killed when the test ends.
func busyIn(t *testing.T, l *cgroup.Layout, path string) {
	t.Helper()
	hog := exec.Command("sh", "-c", "read x; while :; do :; done")
	gate, err := hog.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := hog.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = hog.Process.Kill()
		_ = hog.Wait()
	})
	if err := l.AddProc(path, hog.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if _, err := gate.Write([]byte("go\n")); err != nil {
		t.Fatalf("releasing the busy loop: %v", err)
	}
}

func TestCgroupThrottling(t *testing.T) {
	l, parent := testParent(t, "test")
	path := parent + "/hog"
	if err := l.Create(path, cgroup.Limits{CPUMilli: 50}); err != nil {
		t.Fatal(err)
	}
	busyIn(t, l, path)
	missing := parent + "/never-created"
	s := NewCgroups(l, func() []string { return []string{path, missing} })

	t0 := time.Now()
	before, err := s.Sample(t0)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	t1 := time.Now()
	after, err := s.Sample(t1)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range append(before, after...) {
		if r.Cgroup != path {
			t.Fatalf("record for %q: the missing cgroup must be skipped", r.Cgroup)
		}
	}
	delta := func(metric string, labels ...string) float64 {
		return value(t, after, path, metric, labels...) - value(t, before, path, metric, labels...)
	}
	wall := t1.Sub(t0).Seconds()
	periods, throttled := delta(rundir.MetricCPUPeriods), delta(rundir.MetricCPUThrottled)
	throttledTime, usage := delta(rundir.MetricCPUThrottledTime), delta(rundir.MetricCPUUsage)
	t.Logf("over %.2fs: periods %v, throttled %v, throttled %.3fs, usage %.3fs", wall, periods, throttled, throttledTime, usage)
	if periods <= 0 || throttled <= 0 || throttledTime <= 0 {
		t.Fatalf("no throttling recorded: periods %v, throttled %v, throttled time %v", periods, throttled, throttledTime)
	}
	if throttled > periods {
		t.Fatalf("throttled %v of %v periods", throttled, periods)
	}
	if usage <= 0 || usage >= 0.3*wall {
		t.Fatalf("usage %.3fs over %.3fs wall; a 50m quota allows 0.05 of it", usage, wall)
	}
	// The expected range: a busy loop exhausts 5 ms of quota early in every 100 ms period and is
	// held for the rest, so nearly every period is throttled and the throttled time is most of
	// the wall time (one thread: one CPU's run queue throttled at a time).
	if throttled < 0.8*periods {
		t.Errorf("throttled in %v of %v periods; a busy loop at 50m is throttled in nearly all", throttled, periods)
	}
	if r := throttledTime / wall; r < 0.6 || r > 1.3 {
		t.Errorf("throttled %.3fs over %.3fs wall (x%.2f); a busy loop at 50m is held about 0.95 of the time", throttledTime, wall, r)
	}
	// The hog allocates nothing after it moved in, and v1 does not move charges: any value.
	value(t, after, path, rundir.MetricMemoryUsage)
	if l.Unified != "" {
		// The throttled hog waits for CPU it may not have: the cgroup's cpu pressure grows.
		if delta(rundir.MetricCgroupPressure, rundir.LabelResource, "cpu", rundir.LabelKind, "some") <= 0 {
			t.Fatal("no cpu pressure for a throttled cgroup")
		}
	}
}

func TestCgroupVanished(t *testing.T) {
	l, parent := testParent(t, "test")
	path := parent + "/gone"
	if err := l.Create(path, cgroup.Limits{}); err != nil {
		t.Fatal(err)
	}
	s := NewCgroups(l, func() []string { return []string{path} })
	recs, err := s.Sample(time.Now())
	if err != nil || len(recs) == 0 {
		t.Fatalf("existing cgroup: %d records, %v", len(recs), err)
	}
	if err := l.Remove(path); err != nil {
		t.Fatal(err)
	}
	recs, err = s.Sample(time.Now())
	if err != nil || len(recs) != 0 {
		t.Fatalf("removed cgroup: %d records, %v; want none and no error", len(recs), err)
	}
}

// rootDisk is the MAJ:MIN of the whole disk behind /, or "" when / is not on a block device.
func rootDisk(t *testing.T) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat("/", &st); err != nil {
		t.Fatal(err)
	}
	dir := fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	if _, err := os.Stat(dir); err != nil {
		return ""
	}
	if _, err := os.Stat(filepath.Join(dir, "partition")); err == nil {
		dir = filepath.Join(dir, "..")
	}
	b, err := os.ReadFile(filepath.Join(dir, "dev"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestSystem(t *testing.T) {
	disk := rootDisk(t)
	if disk == "" {
		t.Skip("/ is not on a block device")
	}
	recs, err := NewSystem("/proc", "/sys", nil).Sample(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/proc/pressure/cpu"); err == nil {
		for _, res := range []string{"cpu", "memory", "io"} {
			value(t, recs, "", rundir.MetricSystemPressure, rundir.LabelResource, res, rundir.LabelKind, "some")
		}
		if value(t, recs, "", rundir.MetricSystemPressure, rundir.LabelResource, "cpu", rundir.LabelKind, "some") <= 0 {
			t.Error("no cpu pressure since boot")
		}
	}
	for _, name := range []string{"pgmajfault", "pswpout", "pgscan_direct", "oom_kill", "allocstall_normal"} {
		value(t, recs, "", rundir.MetricVmstat, rundir.LabelName, name)
	}
	if value(t, recs, "", rundir.MetricDiskIOs, rundir.LabelDevice, disk, rundir.LabelOp, "read") <= 0 {
		t.Error("the root disk has no reads since boot")
	}
	if value(t, recs, "", rundir.MetricDiskBytes, rundir.LabelDevice, disk, rundir.LabelOp, "read") <= 0 {
		t.Error("the root disk has read no bytes since boot")
	}
	value(t, recs, "", rundir.MetricDiskIOTime, rundir.LabelDevice, disk)
	value(t, recs, "", rundir.MetricDiskWeightedIOTime, rundir.LabelDevice, disk)
	for _, r := range recs {
		if dev := r.Labels[rundir.LabelDevice]; dev != "" && strings.HasPrefix(dev, "7:") {
			t.Errorf("loop device %s sampled", dev)
		}
	}

	// Only the configured devices.
	recs, err = NewSystem("/proc", "/sys", func() []string { return []string{disk} }).Sample(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if dev, ok := r.Labels[rundir.LabelDevice]; ok && dev != disk {
			t.Errorf("device %s sampled, want only %s", dev, disk)
		}
	}
	value(t, recs, "", rundir.MetricDiskWeightedIOTime, rundir.LabelDevice, disk)
}

// The filesystems are opened once, by NewSystem; a failure to open them is what every Sample
// then returns.
func TestSystemOpenFails(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	for _, c := range []struct {
		name, procfs, sysfs string
	}{
		{"procfs", missing, "/sys"},
		{"sysfs", "/proc", missing},
	} {
		s := NewSystem(c.procfs, c.sysfs, nil)
		for range 2 {
			recs, err := s.Sample(time.Now())
			if err == nil || !strings.Contains(err.Error(), missing) || len(recs) != 0 {
				t.Errorf("%s missing: %d records, error %v; want none and an error naming %s", c.name, len(recs), err, missing)
			}
		}
	}
}

// TestCgroupV2Tree samples through the v2 code path on a hybrid host's cgroup2 mount, which has
// no cpu or memory controller: usage and pressure only. A v2 host runs it in the tests above.
func TestCgroupV2Tree(t *testing.T) {
	host, parent := testParent(t, "test")
	if !host.V1 || host.Unified == "" {
		t.Skip("not a hybrid host")
	}
	l := &cgroup.Layout{Root: host.Root, Unified: host.Unified, Mounts: map[string]string{}}
	path := parent + "/v2"
	if err := l.Create(path, cgroup.Limits{}); err != nil {
		t.Fatal(err)
	}
	busyIn(t, l, path)
	s := NewCgroups(l, func() []string { return []string{path, parent + "/never-created"} })
	before, err := s.Sample(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	after, err := s.Sample(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if d := value(t, after, path, rundir.MetricCPUUsage) - value(t, before, path, rundir.MetricCPUUsage); d <= 0 {
		t.Fatalf("usage grew by %v for a busy loop", d)
	}
	value(t, after, path, rundir.MetricCgroupPressure, rundir.LabelResource, "cpu", rundir.LabelKind, "some")
	for _, r := range after {
		if r.Metric == rundir.MetricCPUThrottled || r.Metric == rundir.MetricMemoryUsage {
			t.Fatalf("%s recorded without its controller", r.Metric)
		}
		if r.Cgroup != path {
			t.Fatalf("record for %q: the missing cgroup must be skipped", r.Cgroup)
		}
	}
}

// parseDiskstat reads this machine's /proc/diskstats as procfs does, and refuses short lines.
func TestParseDiskstatAsProcfs(t *testing.T) {
	fs, err := blockdevice.NewFS("/proc", "/sys")
	if err != nil {
		t.Fatal(err)
	}
	want, err := fs.ProcDiskstats()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("/proc/diskstats")
	if err != nil {
		t.Fatal(err)
	}
	var got []diskstat
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		d, ok := parseDiskstat([]byte(line))
		if !ok {
			t.Fatalf("%q did not parse", line)
		}
		got = append(got, d)
	}
	if len(got) != len(want) || len(got) == 0 {
		t.Fatalf("%d lines parsed, procfs %d", len(got), len(want))
	}
	for i, w := range want {
		// The counters move between the two reads: compare those of idle devices exactly, and
		// the identity of all.
		g := got[i]
		if g.dev != fmt.Sprintf("%d:%d", w.MajorNumber, w.MinorNumber) || g.name != w.DeviceName {
			t.Fatalf("line %d: %s %s, procfs %d:%d %s", i, g.dev, g.name, w.MajorNumber, w.MinorNumber, w.DeviceName)
		}
		if g.readIOs < w.ReadIOs || g.writeIOs < w.WriteIOs || g.readSectors < w.ReadSectors || g.writeSectors < w.WriteSectors ||
			g.ioTicks < w.IOsTotalTicks || g.weightedTicks < w.WeightedIOTicks {
			t.Errorf("%s: %+v, below procfs's earlier %+v", g.name, g, w)
		}
		if w.ReadIOs+w.WriteIOs == 0 && (g.readIOs != 0 || g.writeIOs != 0 || g.ioTicks != 0) {
			t.Errorf("%s: idle per procfs, %+v here", g.name, g)
		}
	}
	for _, bad := range []string{"", "8 0 sda 1 2 3", "8 0 sda 1 2 3 4 5 6 7 8 9 x 11"} {
		if _, ok := parseDiskstat([]byte(bad)); ok {
			t.Errorf("%q parsed", bad)
		}
	}
}
