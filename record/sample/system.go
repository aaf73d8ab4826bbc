package sample

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/procfs"
	"github.com/prometheus/procfs/blockdevice"

	"github.com/nodectl/nodectl/host/swapfile"
	"github.com/nodectl/nodectl/rundir"
)

// meminfoLabels are the /proc/meminfo lines sampled (memory and swap totals, for how much room
// the workloads had), each with its labels.
var meminfoLabels = map[string]map[string]string{}

func init() {
	for _, name := range []string{"MemTotal", "MemAvailable", "SwapTotal", "SwapFree"} {
		meminfoLabels[name] = map[string]string{rundir.LabelName: name}
	}
}

// vmstatPrefixes and vmstatNames select the /proc/vmstat counters that explain memory
// trouble: reclaim scans and steals, direct-reclaim stalls, refaults, swap, major faults,
// compaction stalls and OOM kills.
var (
	vmstatPrefixes = []string{"pgscan_", "pgsteal_", "allocstall_", "workingset_refault_", "workingset_activate_", "workingset_restore_"}
	vmstatNames    = []string{"pswpin", "pswpout", "pgmajfault", "pgpgin", "pgpgout", keyOOMKill, "compact_stall", "compact_fail", "compact_success"}
)

// System samples node-wide counters.
type System struct {
	procfs    string
	sysfs     string
	swapDisks map[string]string // swap area path → the disk serving it
	devices   func() []string
	block     blockdevice.FS
	err       error // opening the block devices failed: every Sample returns it
	files     *systemFiles
	disks     []string // the whole disks of /sys/block, listed again every disksEvery samples
	samples   int
}

// disksEvery is how many samples pass between two listings of /sys/block: a disk plugged in is
// sampled within a minute at 1 s.
const disksEvery = 60

// systemFiles are the files System keeps open, apart from it so that a cleanup can close them.
type systemFiles struct {
	meminfo, vmstat, diskstats procFile
	pressure                   map[string]*procFile // by resource
}

// NewSystem samples node-wide PSI, memory and swap totals of /proc/meminfo, selected
// /proc/vmstat counters and /proc/diskstats of the devices ("MAJ:MIN") devices returns, or of
// every whole disk when devices is nil. Whole disks are those in <sysfsDir>/block ("" means /sys); loop and ram devices are left out.
func NewSystem(procfsDir, sysfsDir string, devices func() []string) *System {
	if sysfsDir == "" {
		sysfsDir = "/sys"
	}
	s := &System{procfs: procfsDir, sysfs: sysfsDir, devices: devices, files: &systemFiles{
		meminfo:   procFile{path: filepath.Join(procfsDir, "meminfo")},
		vmstat:    procFile{path: filepath.Join(procfsDir, "vmstat")}, //rundir:other: the file
		diskstats: procFile{path: filepath.Join(procfsDir, "diskstats")},
		pressure:  map[string]*procFile{},
	}}
	for _, res := range pressureResources {
		s.files.pressure[res] = &procFile{path: filepath.Join(procfsDir, "pressure", res)}
	}
	runtime.AddCleanup(s, func(f *systemFiles) {
		f.meminfo.close()
		f.vmstat.close()
		f.diskstats.close()
		for _, p := range f.pressure {
			p.close()
		}
	}, s.files)
	var err error
	if s.block, err = blockdevice.NewFS(procfsDir, sysfsDir); err != nil {
		s.err = fmt.Errorf("opening block devices in %s and %s: %w", procfsDir, sysfsDir, err)
	}
	return s
}

// Sample reads PSI, meminfo, vmstat and diskstats; PSI is skipped where the kernel has it off.
func (s *System) Sample(now time.Time) ([]rundir.Record, error) {
	if s.err != nil {
		return nil, s.err
	}
	var out []rundir.Record
	for _, res := range pressureResources {
		b, err := s.files.pressure[res].read()
		if vanished(err) || errors.Is(err, syscall.EOPNOTSUPP) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s pressure: %w", res, err)
		}
		// The node's PSI files read as a cgroup's do.
		if out, err = readPressure(res)(out, now, "", b); err != nil {
			return nil, fmt.Errorf("parsing %s pressure: %w", res, err)
		}
	}
	for i := range out { // all PSI so far
		out[i].Metric = rundir.MetricSystemPressure
	}
	var err error
	if out, err = s.meminfo(out, now); err != nil {
		return nil, err
	}
	if out, err = s.vmstat(out, now); err != nil {
		return nil, err
	}
	if out, err = s.diskstats(out, now); err != nil {
		return nil, err
	}
	return s.swapAreas(out, now), nil
}

// swapAreas appends each swap area's size and use, labelled with the disk that serves it (found
// once per area). A kernel without swap has no /proc/swaps: nothing to append.
func (s *System) swapAreas(out []rundir.Record, now time.Time) []rundir.Record {
	areas, err := swapfile.Areas(s.procfs)
	if err != nil {
		return out
	}
	disks := make(map[string]string, len(areas))
	for _, a := range areas {
		disk, ok := s.swapDisks[a.Path]
		if !ok {
			disk = swapfile.Disk(s.procfs, s.sysfs, a)
		}
		disks[a.Path] = disk
		for _, v := range []struct {
			name  string
			bytes int64
		}{{rundir.SwapFileSize, a.Size}, {rundir.SwapFileUsed, a.Used}} {
			b := float64(v.bytes)
			out = append(out, rundir.Record{Type: rundir.TypeSample, Time: now, Metric: rundir.MetricSwapArea, Value: &b,
				Labels: map[string]string{rundir.LabelPath: a.Path, rundir.LabelDevice: disk, rundir.LabelName: v.name}})
		}
	}
	s.swapDisks = disks // areas turned off are forgotten
	return out
}

// meminfo appends the node's memory and swap totals, for how much room the workloads had.
func (s *System) meminfo(out []rundir.Record, now time.Time) ([]rundir.Record, error) {
	b, err := s.files.meminfo.read()
	if err != nil {
		return nil, fmt.Errorf("reading meminfo: %w", err)
	}
	// "MemTotal:       16303436 kB" lines.
	for len(b) > 0 {
		var line []byte
		line, b, _ = bytes.Cut(b, []byte{'\n'})
		name, rest, ok := bytes.Cut(line, []byte{':'})
		labels := meminfoLabels[string(name)]
		if !ok || labels == nil {
			continue
		}
		num, unit, _ := bytes.Cut(bytes.TrimSpace(rest), []byte{' '})
		v, err := strconv.ParseUint(string(num), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("parsing meminfo %s: %w", name, err)
		}
		if string(unit) == "kB" {
			v *= 1024
		}
		out = append(out, sample(now, "", rundir.MetricMeminfo, float64(v), labels))
	}
	return out, nil
}

func (s *System) vmstat(out []rundir.Record, now time.Time) ([]rundir.Record, error) {
	b, err := s.files.vmstat.read()
	if err != nil {
		return nil, fmt.Errorf("reading vmstat: %w", err)
	}
	for len(b) > 0 {
		var name, val []byte
		var ok bool
		if name, val, b, ok = cutFlat(b); !ok || !wantVmstat(string(name)) {
			continue
		}
		v, err := strconv.ParseUint(string(val), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("parsing vmstat %s: %w", name, err)
		}
		out = append(out, sample(now, "", rundir.MetricVmstat, float64(v), map[string]string{rundir.LabelName: string(name)}))
	}
	return out, nil
}

func wantVmstat(name string) bool {
	if slices.Contains(vmstatNames, name) {
		return true
	}
	for _, p := range vmstatPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// diskstats appends the counters of the disks kept. /proc/diskstats is split by hand: procfs's
// parser scans each line with fmt.Sscanf, and that and listing /sys/block at every sample were
// a fifth of the node sampler's time (BenchmarkAgent1000Cgroups, profiled).
func (s *System) diskstats(out []rundir.Record, now time.Time) ([]rundir.Record, error) {
	b, err := s.files.diskstats.read()
	if err != nil {
		return nil, fmt.Errorf("reading diskstats: %w", err)
	}
	keep, err := s.keepDisk()
	if err != nil {
		return nil, err
	}
	for len(b) > 0 {
		var line []byte
		line, b, _ = bytes.Cut(b, []byte("\n"))
		d, ok := parseDiskstat(line)
		if !ok {
			continue
		}
		if !keep(d.dev, d.name) {
			continue
		}
		dl := map[string]string{rundir.LabelDevice: d.dev}
		op := func(op string) map[string]string {
			return map[string]string{rundir.LabelDevice: d.dev, rundir.LabelOp: op}
		}
		out = append(out,
			sample(now, "", rundir.MetricDiskIOs, float64(d.readIOs), op(rundir.OpRead)),
			sample(now, "", rundir.MetricDiskIOs, float64(d.writeIOs), op(rundir.OpWrite)),
			sample(now, "", rundir.MetricDiskBytes, float64(d.readSectors*procfs.SectorSize), op(rundir.OpRead)),
			sample(now, "", rundir.MetricDiskBytes, float64(d.writeSectors*procfs.SectorSize), op(rundir.OpWrite)),
			sample(now, "", rundir.MetricDiskIOTime, float64(d.ioTicks)/1e3, dl),
			sample(now, "", rundir.MetricDiskWeightedIOTime, float64(d.weightedTicks)/1e3, dl),
		)
	}
	return out, nil
}

// diskstat is what the sampler keeps of a /proc/diskstats line.
type diskstat struct {
	dev, name                                                            string // "MAJ:MIN", and the kernel's name
	readIOs, readSectors, writeIOs, writeSectors, ioTicks, weightedTicks uint64
}

// parseDiskstat reads a /proc/diskstats line: major, minor, name, then counters, of which the
// kernel has had at least 11 since 2.6 (Documentation/admin-guide/iostats.rst).
func parseDiskstat(line []byte) (diskstat, bool) {
	var f [14][]byte
	n := 0
	for _, w := range bytes.Fields(line) {
		if n == len(f) {
			break
		}
		f[n] = w
		n++
	}
	if n < len(f) {
		return diskstat{}, false
	}
	var v [14]uint64
	for i := 3; i < len(f); i++ {
		u, err := strconv.ParseUint(string(f[i]), 10, 64)
		if err != nil {
			return diskstat{}, false
		}
		v[i] = u
	}
	return diskstat{dev: string(f[0]) + ":" + string(f[1]), name: string(f[2]),
		readIOs: v[3], readSectors: v[5], writeIOs: v[7], writeSectors: v[9], ioTicks: v[12], weightedTicks: v[13]}, true
}

// keepDisk picks the configured devices, or else the whole disks that are not loop or ram.
func (s *System) keepDisk() (func(dev, name string) bool, error) {
	if s.devices != nil {
		want := s.devices()
		return func(dev, _ string) bool { return slices.Contains(want, dev) }, nil
	}
	if s.samples%disksEvery == 0 {
		disks, err := s.block.SysBlockDevices()
		if err != nil {
			return nil, fmt.Errorf("listing block devices: %w", err)
		}
		s.disks = disks
	}
	s.samples++
	return func(_, name string) bool {
		return slices.Contains(s.disks, name) && !strings.HasPrefix(name, "loop") && !strings.HasPrefix(name, "ram")
	}, nil
}

// MemAvailable is the node's MemAvailable of <procfsDir>/meminfo, in bytes.
func MemAvailable(procfsDir string) (int64, error) {
	fs, err := procfs.NewFS(procfsDir)
	if err != nil {
		return 0, fmt.Errorf("opening procfs %s: %w", procfsDir, err)
	}
	mi, err := fs.Meminfo()
	if err != nil {
		return 0, fmt.Errorf("reading meminfo: %w", err)
	}
	if mi.MemAvailableBytes == nil {
		return 0, errors.New("reading meminfo: no MemAvailable")
	}
	return int64(*mi.MemAvailableBytes), nil
}

// Dirty is the node's page cache waiting for writeback and the kernel's bounds for it, in
// bytes, from /proc/vmstat.
type Dirty struct {
	Dirty     int64
	Writeback int64
	// Threshold is where writers are stopped to write back (balance_dirty_pages);
	// BackgroundThreshold where the flusher starts.
	Threshold           int64
	BackgroundThreshold int64
}

// ReadDirty reads the node's Dirty from <procfsDir>/vmstat.
func ReadDirty(procfsDir string) (Dirty, error) {
	path := filepath.Join(procfsDir, "vmstat") //rundir:other: the file
	b, err := os.ReadFile(path)
	if err != nil {
		return Dirty{}, fmt.Errorf("reading vmstat: %w", err)
	}
	var pages Dirty
	if err := statValues(b, map[string]*int64{"nr_dirty": &pages.Dirty, "nr_writeback": &pages.Writeback,
		"nr_dirty_threshold": &pages.Threshold, "nr_dirty_background_threshold": &pages.BackgroundThreshold}); err != nil {
		return Dirty{}, fmt.Errorf("parsing %s: %w", path, err)
	}
	page := int64(os.Getpagesize())
	return Dirty{Dirty: pages.Dirty * page, Writeback: pages.Writeback * page,
		Threshold: pages.Threshold * page, BackgroundThreshold: pages.BackgroundThreshold * page}, nil
}
