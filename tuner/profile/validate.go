package profile

import (
	"fmt"
	"math"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"k8s.io/utils/cpuset"

	"github.com/nodectl/nodectl/tuner/journald"
	"github.com/nodectl/nodectl/tuner/swap"
	"github.com/nodectl/nodectl/tuner/sysctl"
)

// intSysctls are the sysctls whose values nodectl checks, with the range the kernel accepts.
var intSysctls = map[string][2]int64{
	"vm.swappiness":             {0, 200},
	"vm.watermark_scale_factor": {1, 3000},
}

// gcThresh are the neighbour-table thresholds, per family; the kernel wants
// gc_thresh1 <= gc_thresh2 <= gc_thresh3.
var gcThresh = [][3]string{
	{"net.ipv4.neigh.default.gc_thresh1", "net.ipv4.neigh.default.gc_thresh2", "net.ipv4.neigh.default.gc_thresh3"},
	{"net.ipv6.neigh.default.gc_thresh1", "net.ipv6.neigh.default.gc_thresh2", "net.ipv6.neigh.default.gc_thresh3"},
}

func init() {
	for _, f := range gcThresh {
		for _, k := range f {
			intSysctls[k] = [2]int64{0, math.MaxInt32}
		}
	}
}

// journaldKind is the syntax of a [Journal] setting's value, as journald parses it.
type journaldKind int

const (
	kindText journaldKind = iota
	kindSize
	kindUint
	kindTimespan
	kindBool
	kindLevel
)

// journaldSettings are the [Journal] keys of journald.conf(5) (systemd's
// journald-gperf.gperf), with the syntax of their values.
var journaldSettings = map[string]journaldKind{
	"Storage": kindText, "Compress": kindText, "Seal": kindBool, "SplitMode": kindText,
	"SyncIntervalSec": kindTimespan, "RateLimitInterval": kindTimespan, "RateLimitIntervalSec": kindTimespan,
	"RateLimitBurst": kindUint,
	"SystemMaxUse":   kindSize, "SystemKeepFree": kindSize, "SystemMaxFileSize": kindSize, "SystemMaxFiles": kindUint,
	"RuntimeMaxUse": kindSize, "RuntimeKeepFree": kindSize, "RuntimeMaxFileSize": kindSize, "RuntimeMaxFiles": kindUint,
	"MaxRetentionSec": kindTimespan, "MaxFileSec": kindTimespan,
	"ForwardToSyslog": kindBool, "ForwardToKMsg": kindBool, "ForwardToConsole": kindBool, "ForwardToWall": kindBool,
	"ForwardToSocket": kindText, "TTYPath": kindText,
	"MaxLevelStore": kindLevel, "MaxLevelSyslog": kindLevel, "MaxLevelKMsg": kindLevel,
	"MaxLevelConsole": kindLevel, "MaxLevelWall": kindLevel, "MaxLevelSocket": kindLevel,
	"LineMax": kindSize, "ReadKMsg": kindBool, "Audit": kindText,
}

var (
	sizeRE     = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?[KMGTPEB]?$`)
	uintRE     = regexp.MustCompile(`^[0-9]+$`)
	timespanRE = regexp.MustCompile(`^(infinity|([0-9]+(\.[0-9]+)?\s*(usec|us|µs|msec|ms|seconds|second|sec|s|minutes|minute|min|m|hours|hour|hr|h|days|day|d|weeks|week|w|months|month|M|years|year|y)?\s*)+)$`)
	boolRE     = regexp.MustCompile(`^(?i:1|0|yes|no|y|n|true|false|t|f|on|off)$`)
	levelRE    = regexp.MustCompile(`^(emerg|alert|crit|err|warning|notice|info|debug|[0-7])$`)
	// A sysctl key component: interface names bring ':', '@', '+' and '/' (for '.').
	sysctlPartRE = regexp.MustCompile(`^[A-Za-z0-9_:@+/-]+$`)
)

var kindAllowed = map[journaldKind]string{
	kindSize:     "a size in bytes with an optional K, M, G, T, P or E suffix (base 1024), e.g. 500M",
	kindUint:     "a whole number, e.g. 1000",
	kindTimespan: "a time span such as 30s, 5min or 1h",
	kindBool:     "yes or no",
	kindLevel:    "a log level: emerg, alert, crit, err, warning, notice, info, debug or 0-7",
}

type validator struct {
	p     *Profile
	node  Node
	probs []error
}

func (v *validator) fail(kpath, format string, a ...any) {
	v.probs = append(v.probs, v.p.problem(kpath, format, a...))
}

func (v *validator) run() {
	if v.p.Name == "" || strings.ContainsAny(v.p.Name, "\n\r\t") {
		v.fail("name", "want a one-line name, got %q", v.p.Name)
	}
	// A GKE config with only keys nodectl does not check is still worth a plan: it lists them.
	if len(v.p.Sysctl) == 0 && v.p.Journald == nil && v.p.ReservedCPUs == nil && v.p.Swap == nil && !v.p.gke {
		v.fail("", "sets nothing: give at least one of sysctl, journald, reservedSystemCPUs or swap")
	}
	v.sysctls()
	v.journald()
	v.reservedCPUs()
	v.swap()
}

func (v *validator) sysctls() {
	keys := make([]string, 0, len(v.p.Sysctl))
	for k := range v.p.Sysctl {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	ints := map[string]int64{}
	for _, k := range keys {
		kp, val := "sysctl."+k, v.p.Sysctl[k]
		if !validSysctlKey(k) {
			v.fail(kp, "not a sysctl key: want the dotted form such as vm.swappiness or net.ipv4.neigh.default.gc_thresh1")
			continue
		}
		if strings.ContainsAny(val, "\n\r") || strings.TrimSpace(val) == "" {
			v.fail(kp, "want a one-line, non-empty value, got %q", val)
			continue
		}
		if r, ok := intSysctls[k]; ok {
			i, err := strconv.ParseInt(val, 10, 64)
			if err != nil {
				v.fail(kp, "%q is not an integer: allowed are integers from %d to %d", val, r[0], r[1])
				continue
			}
			if i < r[0] || i > r[1] {
				v.fail(kp, "%d is out of range: allowed are integers from %d to %d", i, r[0], r[1])
				continue
			}
			ints[k] = i
		}
		if v.node.SysctlExists != nil && !v.node.SysctlExists(k) {
			v.fail(kp, "the node has no such sysctl (no /proc/sys/%s)", SysctlPath(k))
		}
	}
	for _, f := range gcThresh {
		for i := 0; i < 3; i++ {
			for j := i + 1; j < 3; j++ {
				a, aok := ints[f[i]]
				b, bok := ints[f[j]]
				if !aok || !bok || a <= b {
					continue
				}
				// Point at the key this profile wrote, not the one inherited.
				at := f[i]
				if _, ok := v.p.lines["sysctl."+f[j]]; ok {
					if _, ok := v.p.lines["sysctl."+at]; !ok {
						at = f[j]
					}
				}
				v.fail("sysctl."+at, "%s = %d is above %s = %d: the kernel wants gc_thresh1 <= gc_thresh2 <= gc_thresh3",
					path.Ext(f[i])[1:], a, path.Ext(f[j])[1:], b)
			}
		}
	}
}

// SysctlPath is the path of sysctl key k below /proc/sys, as the sysctl backend finds it:
// dots become slashes and slashes (standing for dots in names, as in
// net.ipv4.conf.eth0/100.rp_filter) dots.
func SysctlPath(k string) string { return sysctl.Path(k) }

func validSysctlKey(k string) bool {
	parts := strings.Split(k, ".")
	if len(parts) < 2 {
		return false
	}
	for _, p := range parts {
		// A part of slashes alone would become "." or ".." in the /proc/sys path.
		if !sysctlPartRE.MatchString(p) || strings.Trim(p, "/") == "" {
			return false
		}
	}
	return true
}

func (v *validator) journald() {
	j := v.p.Journald
	if j == nil {
		return
	}
	// journald reads only *.conf files, and only from its journald.conf.d directories.
	if !isAbs(j.DropIn) || path.Ext(j.DropIn) != ".conf" || path.Base(path.Dir(j.DropIn)) != "journald.conf.d" {
		v.fail("journald.dropIn", "%q is not a journald drop-in: want an absolute path ending in journald.conf.d/<name>.conf, e.g. %s",
			j.DropIn, journald.DefaultDropIn)
	}
	if j.Storage != "" && !isAbs(j.Storage) {
		v.fail("journald.storage", "want an absolute directory on the node, or \"\" to leave storage alone; got %q", j.Storage)
	}
	if len(j.Settings) == 0 && j.Storage == "" {
		v.fail("journald", "sets nothing: give settings or storage, or set journald: null to leave journald alone")
	}
	for _, e := range j.Settings {
		kp := "journald.settings." + e.Key
		kind, ok := journaldSettings[e.Key]
		if !ok {
			keys := make([]string, 0, len(journaldSettings))
			for k := range journaldSettings {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			v.fail(kp, "not a [Journal] setting of journald.conf(5): allowed are %s", strings.Join(keys, ", "))
			continue
		}
		if e.Value == "" || strings.ContainsAny(e.Value, "\n\r") {
			v.fail(kp, "want a one-line, non-empty value, got %q; null removes an inherited setting", e.Value)
			continue
		}
		if !kindOK(kind, e.Value) {
			v.fail(kp, "%q is not valid: want %s", e.Value, kindAllowed[kind])
		}
	}
}

func kindOK(kind journaldKind, s string) bool {
	switch kind {
	case kindSize:
		return sizeRE.MatchString(s)
	case kindUint:
		return uintRE.MatchString(s)
	case kindTimespan:
		return timespanRE.MatchString(s)
	case kindBool:
		return boolRE.MatchString(s)
	case kindLevel:
		return levelRE.MatchString(s)
	}
	return true
}

// autoReserved is the reservation "auto" makes from the online CPUs: ceil(n/4), at least 1,
// the lowest-numbered.
func autoReserved(online cpuset.CPUSet) cpuset.CPUSet {
	ids := online.List()
	return cpuset.New(ids[:max((len(ids)+3)/4, 1)]...)
}

// online is the node's online CPUs: Node.Online, else 0 to CPUs-1.
func (v *validator) online() (cpuset.CPUSet, bool) {
	if v.node.Online != "" {
		set, err := cpuset.Parse(v.node.Online)
		if err != nil || set.IsEmpty() {
			v.fail("reservedSystemCPUs.cpus", "the node's online CPU list %q is not a CPU list", v.node.Online)
			return cpuset.New(), false
		}
		return set, true
	}
	if v.node.CPUs <= 0 {
		v.fail("reservedSystemCPUs.cpus", "the node's CPU count is unknown (%d): cannot check or size reservedSystemCPUs", v.node.CPUs)
		return cpuset.New(), false
	}
	ids := make([]int, v.node.CPUs)
	for i := range ids {
		ids[i] = i
	}
	return cpuset.New(ids...), true
}

func (v *validator) reservedCPUs() {
	r := v.p.ReservedCPUs
	if r == nil {
		return
	}
	const kp = "reservedSystemCPUs.cpus"
	online, ok := v.online()
	ncpu := online.Size()
	switch {
	case !ok:
	case r.CPUs == AutoCPUs:
		set := autoReserved(online)
		if set.Size() >= ncpu {
			v.fail(kp, "auto reserves ceil(CPUs/4) = %d CPU(s) but the node has %d CPU(s): none would be left for workloads; "+
				"reservedSystemCPUs needs a node with at least 2 CPUs (set reservedSystemCPUs: null to leave CPUs alone)", set.Size(), ncpu)
		} else {
			r.CPUs = set.String()
		}
	default:
		set, err := cpuset.Parse(r.CPUs)
		switch {
		case err != nil || set.IsEmpty():
			v.fail(kp, "%q is not a CPU list: want auto or a list such as 0-1 or 0,2-3", r.CPUs)
		case !set.IsSubsetOf(online):
			v.fail(kp, "%q names CPU(s) %s, which the node does not have: it has %d CPU(s) (%s)",
				r.CPUs, set.Difference(online), ncpu, online)
		case set.Size() >= ncpu:
			v.fail(kp, "%q reserves all %d CPU(s) of the node: at least one must be left for workloads", r.CPUs, ncpu)
		default:
			r.CPUs = set.String()
		}
	}
	// The kubelet reads only *.conf files from its --config-dir.
	if r.KubeletDropIn != "" && (!isAbs(r.KubeletDropIn) || path.Ext(r.KubeletDropIn) != ".conf") {
		v.fail("reservedSystemCPUs.kubeletDropIn", "want an absolute path ending in .conf (the kubelet's --config-dir reads *.conf), "+
			"or \"\" for no drop-in; got %q", r.KubeletDropIn)
	}
	for _, l := range []struct {
		key  string
		list []string
	}{{"systemCgroups", r.SystemCgroups}, {"workloadCgroups", r.WorkloadCgroups}} {
		for i, c := range l.list {
			if c == "" || path.IsAbs(c) || path.Clean(c) != c || c == "." || strings.HasPrefix(c, "..") {
				v.fail(fmt.Sprintf("reservedSystemCPUs.%s[%d]", l.key, i),
					"%q is not a cgroup name: want a path relative to the cgroup root, e.g. system.slice or kubepods", c)
			}
		}
	}
	for _, c := range r.SystemCgroups {
		if slices.Contains(r.WorkloadCgroups, c) {
			v.fail("reservedSystemCPUs", "cgroup %q is in both systemCgroups and workloadCgroups", c)
		}
	}
	for i, d := range r.Daemons {
		if d == "" || strings.ContainsAny(d, "/ \t\n") {
			v.fail(fmt.Sprintf("reservedSystemCPUs.daemons[%d]", i),
				"%q is not a process name: want a program name without '/' or spaces, e.g. kubelet", d)
		}
	}
}

func (v *validator) swap() {
	s := v.p.Swap
	if s == nil {
		return
	}
	if s.File != "" && s.Device != "" {
		v.fail("swap", "file %q and device %q are both set: a swap section is one area, give one", s.File, s.Device)
	}
	if s.File != "" && !isAbs(s.File) {
		v.fail("swap.file", "want an absolute path on the node, got %q", s.File)
	}
	if s.Device != "" && !isAbs(s.Device) {
		v.fail("swap.device", "want an absolute device path such as /dev/nvme1n1, got %q", s.Device)
	}
	switch {
	case s.File != "" && s.Enabled && s.Size <= 0:
		v.fail("swap.size", "a swap file needs a size, e.g. size: 8Gi")
	case s.File == "" && s.Size != 0:
		v.fail("swap.size", "size is for a swap file only: a device's swap area is the whole device")
	}
	if s.Priority < -1 || s.Priority > swap.MaxPriority {
		v.fail("swap.priority", "%d is out of range: allowed are -1 (the kernel's default) to %d", s.Priority, swap.MaxPriority)
	}
}
