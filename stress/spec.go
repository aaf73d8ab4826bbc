// Package stress drives stress scenarios on the local node: it starts workloads (the victim
// probe and hogs) in their own cgroups under nodectl/<run-id>/, runs phases, records what the
// tracer and samplers see, and cleans everything up.
package stress

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/nodectl/nodectl/internal/badvalue"
	"github.com/nodectl/nodectl/internal/quantity"
	"github.com/nodectl/nodectl/rundir"
)

// HogKinds are the neighbour kinds `--hog` accepts.
var HogKinds = rundir.HogKinds

// HogSpec is one
// `--hog KIND[,count=N][,cpu=LIMIT][,request=CPU][,memory=SIZE][,target=PATH][,threads=N]`.
type HogSpec struct {
	Kind            string
	Count           int
	CPUMilli        int64  // 0 = unlimited
	CPURequestMilli int64  // sets the cgroup's CPU weight (see CPURequest); 0 = the kernel's default
	MemBytes        int64  // 0 = unlimited (memory hogs default to DefaultMemoryHog)
	Target          string // directory disk and fsync hogs write to; "" = the run's scratch directory
	Threads         int    // busy threads of a cpu hog, processes at a time of a churn hog; 0 = one per CPU (of its limit)
	raw             string
}

// hogKeys are the keys of a --hog value after its kind.
const hogKeys = "count, cpu, request, memory, target, threads"

// MinNodeMemory is the smallest --node-memory of a noisy run: the victim probe's 64 MiB write
// and its own memory, with room to spare.
const MinNodeMemory = 96 << 20

// DefaultMemoryHog caps a memory hog that was given no memory limit, so a run never exhausts
// the machine.
const DefaultMemoryHog = 512 << 20

// ParseHog parses one hog spec (KIND[,key=value...]), naming the offending key and what is
// allowed on error.
func ParseHog(s string) (HogSpec, error) {
	parts := strings.Split(s, ",")
	h := HogSpec{Kind: strings.TrimSpace(parts[0]), Count: 1, raw: s}
	if !slices.Contains(HogKinds, h.Kind) {
		return h, badvalue.Errorf(FieldHogs, strconv.Quote(s), "unknown kind %q (allowed: %s)", h.Kind, strings.Join(HogKinds, ", "))
	}
	for _, kv := range parts[1:] {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok || v == "" {
			return h, badvalue.Errorf(FieldHogs, strconv.Quote(s), "%q is not key=value (keys: %s)", kv, hogKeys)
		}
		var err error
		switch k {
		case "count":
			h.Count, err = positiveInt(v, 1000)
		case "threads":
			h.Threads, err = positiveInt(v, 1024)
		case "cpu": //rundir:other: --hog keys
			h.CPUMilli, err = quantity.ParseCPU(v)
		case "request":
			h.CPURequestMilli, err = quantity.ParseCPU(v)
		case "memory": //rundir:other
			h.MemBytes, err = quantity.ParseSize(v)
		case "target":
			if !strings.HasPrefix(v, "/") {
				err = fmt.Errorf("must be an absolute directory path")
			}
			h.Target = v
		default:
			err = fmt.Errorf("unknown key (keys: %s)", hogKeys)
		}
		if err != nil {
			return h, badvalue.Errorf(FieldHogs, strconv.Quote(s), "%s=%s: %w", k, v, err)
		}
	}
	var err error
	if h.CPURequestMilli, err = CPURequest(h.CPURequestMilli, h.CPUMilli); err != nil {
		return h, badvalue.New(FieldHogs, strconv.Quote(s), err)
	}
	if h.Kind == rundir.KindMemory && h.MemBytes == 0 {
		h.MemBytes = DefaultMemoryHog
	}
	return h, nil
}

// CPURequest is a workload's CPU request in millicores: the one given, else its CPU limit, as
// Kubernetes defaults a request to the limit (a Guaranteed pod). The request becomes the
// cgroup's CPU weight as the kubelet sets it (cgroup.CPUShares), so a 250m workload next to
// busy neighbours gets a quarter of a 1-CPU one's share of a contended CPU, even below its
// limit. Without either it is 0: the kernel's default weight, which on cgroup v1 is that of a
// 1-CPU request. A request above the limit is refused, as Kubernetes refuses it.
func CPURequest(request, limit int64) (int64, error) {
	if request == 0 {
		return limit, nil
	}
	if limit > 0 && request > limit {
		return 0, fmt.Errorf("CPU request %s is above the CPU limit %s", quantity.FormatCPU(request), quantity.FormatCPU(limit))
	}
	return request, nil
}

func positiveInt(v string, maxV int) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > maxV {
		return 0, fmt.Errorf("want an integer from 1 to %d", maxV)
	}
	return n, nil
}

// threadsFor is the default busy-thread count of a cpu hog: enough to use its whole limit, or
// every online CPU when unlimited.
func threadsFor(h HogSpec, ncpu int) int {
	if h.Threads > 0 {
		return h.Threads
	}
	if h.CPUMilli == 0 {
		return ncpu
	}
	return max(1, int(math.Ceil(float64(h.CPUMilli)/1000)))
}
