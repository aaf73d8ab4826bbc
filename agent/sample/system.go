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
	procfs  string
	devices func() []string
	block   blockdevice.FS
	err     error // opening the block devices failed: every Sample returns it
	files   *systemFiles
}

// systemFiles are the files System keeps open, apart from it so that a cleanup can close them.
type systemFiles struct {
	meminfo, vmstat procFile
	pressure        map[string]*procFile // by resource
}

// NewSystem samples node-wide PSI, memory and swap totals of /proc/meminfo, selected
// /proc/vmstat counters and /proc/diskstats of the devices ("MAJ:MIN") devices returns, or of
// every whole disk when devices is nil. Whole disks are those in <sysfsDir>/block ("" means /sys); loop and ram devices are left out.
func NewSystem(procfsDir, sysfsDir string, devices func() []string) *System {
	if sysfsDir == "" {
		sysfsDir = "/sys"
	}
	s := &System{procfs: procfsDir, devices: devices, files: &systemFiles{
		meminfo:  procFile{path: filepath.Join(procfsDir, "meminfo")},
		vmstat:   procFile{path: filepath.Join(procfsDir, "vmstat")}, //rundir:other: the file
		pressure: map[string]*procFile{},
	}}
	for _, res := range pressureResources {
		s.files.pressure[res] = &procFile{path: filepath.Join(procfsDir, "pressure", res)}
	}
	runtime.AddCleanup(s, func(f *systemFiles) {
		f.meminfo.close()
		f.vmstat.close()
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
	return out, nil
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

func (s *System) diskstats(out []rundir.Record, now time.Time) ([]rundir.Record, error) {
	stats, err := s.block.ProcDiskstats()
	if err != nil {
		return nil, fmt.Errorf("reading diskstats: %w", err)
	}
	keep, err := s.keepDisk()
	if err != nil {
		return nil, err
	}
	for _, d := range stats {
		dev := fmt.Sprintf("%d:%d", d.MajorNumber, d.MinorNumber)
		if !keep(dev, d.DeviceName) {
			continue
		}
		dl := map[string]string{rundir.LabelDevice: dev}
		op := func(op string) map[string]string {
			return map[string]string{rundir.LabelDevice: dev, rundir.LabelOp: op}
		}
		out = append(out,
			sample(now, "", rundir.MetricDiskIOs, float64(d.ReadIOs), op(rundir.OpRead)),
			sample(now, "", rundir.MetricDiskIOs, float64(d.WriteIOs), op(rundir.OpWrite)),
			sample(now, "", rundir.MetricDiskBytes, float64(d.ReadSectors*procfs.SectorSize), op(rundir.OpRead)),
			sample(now, "", rundir.MetricDiskBytes, float64(d.WriteSectors*procfs.SectorSize), op(rundir.OpWrite)),
			sample(now, "", rundir.MetricDiskIOTime, float64(d.IOsTotalTicks)/1e3, dl),
			sample(now, "", rundir.MetricDiskWeightedIOTime, float64(d.WeightedIOTicks)/1e3, dl),
		)
	}
	return out, nil
}

// keepDisk picks the configured devices, or else the whole disks that are not loop or ram.
func (s *System) keepDisk() (func(dev, name string) bool, error) {
	if s.devices != nil {
		want := s.devices()
		return func(dev, _ string) bool { return slices.Contains(want, dev) }, nil
	}
	disks, err := s.block.SysBlockDevices()
	if err != nil {
		return nil, fmt.Errorf("listing block devices: %w", err)
	}
	return func(_, name string) bool {
		return slices.Contains(disks, name) && !strings.HasPrefix(name, "loop") && !strings.HasPrefix(name, "ram")
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
