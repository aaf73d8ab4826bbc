package analyzer

import (
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/nodectl/nodectl/internal/human"
	"github.com/nodectl/nodectl/rundir"
)

// IDCPUBookingCeiling: what the API server booked on the node, not what its kernel used, bounds
// how many more pods it takes (docs/findings.md).
const IDCPUBookingCeiling = "cpu-booking-ceiling"

const (
	// A dimension is booked full from this share of its allocatable (the scheduler refuses a
	// pod whose request does not fit in what is left).
	bookedFullShare = 0.90
	// The kernel's use of a resource is low below this share of its allocatable: the node is
	// booked full but not used so.
	usedLowShare = 0.50
)

// The dimensions the scheduler books against, and the finding's victim.
const (
	dimCPU      = "cpu"    //rundir:other: a booked dimension
	dimMemory   = "memory" //rundir:other: a booked dimension
	dimPods     = "pods"
	dimVolumes  = "volumes"
	bookingNode = "node" //rundir:other: the node as a finding's victim
)

// bookingDim is one dimension the scheduler books against, and what the kernel used of it.
type bookingDim struct {
	name             string // cpu, memory, pods, volumes
	booked, capacity float64
	used             float64 // the kernel's figure in the same unit; -1 when it has none
	unit             string
}

func (d bookingDim) share() float64 { return ratio(d.booked, d.capacity) }

// bookingCeiling compares the node's bookings (Meta.Booking) with the kernel's use of the same
// resources over the window.
func (a *analysis) bookingCeiling(rep *Report) {
	b := a.run.Meta.Booking
	if b == nil || b.AllocatableCPUMilli <= 0 {
		return
	}
	w := a.bookedWindow()
	secsLong := w.Seconds()
	if secsLong <= 0 {
		return
	}
	cpuUsed := a.nodeCPUSeconds(w) / secsLong // cores
	memUsed := -1.0
	if total, avail := a.meminfo(w, "MemTotal"), a.meminfo(w, "MemAvailable"); total > 0 && avail >= 0 {
		memUsed = total - avail
	}
	dims := []bookingDim{
		{name: dimCPU, booked: float64(b.RequestedCPUMilli) / 1000, capacity: float64(b.AllocatableCPUMilli) / 1000, used: cpuUsed, unit: "cores"},
		{name: dimMemory, booked: float64(b.RequestedMemory), capacity: float64(b.AllocatableMemory), used: memUsed, unit: UnitBytes},
		{name: dimPods, booked: float64(b.Pods), capacity: float64(b.MaxPods), used: -1, unit: UnitCount},
	}
	if b.AttachableVolumes > 0 {
		dims = append(dims, bookingDim{name: dimVolumes, booked: float64(b.AttachedVolumes), capacity: float64(b.AttachableVolumes), used: -1, unit: UnitCount})
	}
	// The binding dimension: the one booked fullest.
	bind := slices.MaxFunc(dims, func(x, y bookingDim) int {
		switch {
		case x.share() < y.share():
			return -1
		case x.share() > y.share():
			return 1
		}
		return 0
	})
	if bind.capacity <= 0 || bind.share() < bookedFullShare {
		return
	}
	f := &Finding{ID: IDCPUBookingCeiling, Severity: SeverityInfo, Victim: bookingNode}
	for _, d := range dims {
		if d.capacity <= 0 {
			continue
		}
		unit := d.unit
		if unit == "cores" {
			unit = UnitCount
		}
		f.Evidence = append(f.Evidence, Evidence{Metric: d.name + "_booked", Workload: bookingNode, Phase: w.Name,
			Baseline: d.capacity, Value: d.booked, Unit: unit})
		if d.used >= 0 {
			f.Evidence = append(f.Evidence, Evidence{Metric: d.name + "_used", Workload: bookingNode, Phase: w.Name,
				Baseline: d.capacity, Value: d.used, Unit: unit})
		}
	}
	cpuShare, memShare := ratio(cpuUsed, float64(b.AllocatableCPUMilli)/1000), -1.0
	if memUsed >= 0 && b.AllocatableMemory > 0 {
		memShare = memUsed / float64(b.AllocatableMemory)
	}
	kernel := fmt.Sprintf("its kernel ran %s of CPU on average (%s of the allocatable %s)", fmtCores(cpuUsed), human.Percent(cpuShare),
		fmtCores(float64(b.AllocatableCPUMilli)/1000))
	if memShare >= 0 {
		kernel += fmt.Sprintf(" and used %s of memory (%s of the allocatable %s)", human.Bytes(memUsed), human.Percent(memShare), human.Bytes(float64(b.AllocatableMemory)))
	}
	idle := cpuShare < usedLowShare && (memShare < 0 || memShare < usedLowShare)
	if idle {
		f.Severity = SeverityWarning
	}
	head := fmt.Sprintf("the node is booked full by %s: %s of %s %s (%s)", bookedWhat(bind), fmtBooked(bind.booked, bind.unit),
		fmtBooked(bind.capacity, bind.unit), bookedNoun(bind), human.Percent(bind.share()))
	more := ""
	if b.SmallestCPURequest > 0 && bind.name == dimCPU {
		free := float64(b.AllocatableCPUMilli - b.RequestedCPUMilli)
		more = fmt.Sprintf("; %d more pods of the smallest request here (%dm) fit", max(0, int(free)/int(b.SmallestCPURequest)), b.SmallestCPURequest)
	}
	switch {
	case idle:
		f.Summary = head + more + ", while " + kernel + ": the scheduler's bookings, not the kernel, are the ceiling. " +
			"Right-size the requests (the pods use far less than they book), or raise " + raiseWhat(bind) + "."
	default:
		f.Summary = head + more + ", and " + kernel + ": booked and used alike, the node is near its capacity."
	}
	rep.Findings = append(rep.Findings, *f)
}

// bookedWindow is the window the kernel's use is read over, against the bookings: an agent's
// window, else (a density sweep of pods) its last step, whose pods the bookings, read when the
// run was written, hold.
func (a *analysis) bookedWindow() rundir.Window {
	if a.stress.Seconds() > 0 {
		return a.stress
	}
	return a.windows[len(a.windows)-1]
}

func bookedWhat(d bookingDim) string {
	switch d.name {
	case dimCPU:
		return "CPU requests"
	case dimMemory:
		return "memory requests"
	case dimPods:
		return "its pods limit"
	}
	return "attached volumes"
}

func bookedNoun(d bookingDim) string {
	switch d.name {
	case dimCPU:
		return "allocatable cores requested"
	case dimMemory:
		return "allocatable memory requested"
	case dimPods:
		return "pods (maxPods)"
	}
	return "attachable volumes attached"
}

func raiseWhat(d bookingDim) string {
	switch d.name {
	case dimPods:
		return "the kubelet's maxPods"
	case dimVolumes:
		return "the node's volume attach limit (another machine type)"
	}
	return "the node's allocatable (smaller kube-reserved and system-reserved)"
}

func fmtBooked(v float64, unit string) string {
	switch unit {
	case UnitBytes:
		return human.Bytes(v)
	case "cores":
		return fmtCores(v)
	}
	return fmt.Sprintf("%.0f", v)
}

func fmtCores(c float64) string { return fmt.Sprintf("%.2f cores", c) }

// nodeCPUSeconds is the CPU time the node's cgroups used in the window: the root's when it was
// sampled, else the sum over the outermost cgroups sampled (an ancestor's usage holds its
// descendants').
func (a *analysis) nodeCPUSeconds(w rundir.Window) float64 {
	usage := a.run.Series(rundir.MetricCPUUsage).ByCgroup()
	if ss, ok := usage["/"]; ok {
		return ss.Delta(w)
	}
	cgs := make([]string, 0, len(usage))
	for cg := range usage {
		if strings.HasPrefix(cg, "/") {
			cgs = append(cgs, cg)
		}
	}
	slices.Sort(cgs)
	var total float64
	for _, cg := range cgs {
		covered := false
		for p := path.Dir(cg); p != "/" && p != "."; p = path.Dir(p) {
			if _, ok := usage[p]; ok {
				covered = true
				break
			}
		}
		if !covered {
			total += usage[cg].Delta(w)
		}
	}
	return total
}

// meminfo is the mean of a /proc/meminfo field over the window, -1 when not recorded.
func (a *analysis) meminfo(w rundir.Window, field string) float64 {
	vs := a.run.Series(rundir.MetricMeminfo).Label(rundir.LabelName, field).Values(w)
	if len(vs) == 0 {
		return -1
	}
	var sum float64
	for _, v := range vs {
		sum += v
	}
	return sum / float64(len(vs))
}
