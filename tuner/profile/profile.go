// Package profile reads, merges and validates tuning profiles: the built-in sandbox-density
// profile, user profiles in nodectl's YAML format that extend or override it, and GKE node
// system configs checked against a node. It is pure logic: it never touches the node, so every
// problem is found before anything is changed. docs/tuning-profiles.md describes the format.
package profile

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/nodectl/nodectl/tuner/journald"
	"github.com/nodectl/nodectl/tuner/kubelet"
)

// Defaults filled in by Resolve where a profile's section leaves the key out; the drop-ins'
// are their backends', journald.DefaultDropIn and kubelet.DefaultDropIn.
const (
	// AutoCPUs sizes the reservation from the node: ceil(CPUs/4), at least 1, lowest first.
	AutoCPUs = "auto"
	// SourceBuiltin is the Source of a built-in profile.
	SourceBuiltin = "built-in"
)

// DefaultSystemCgroups, DefaultWorkloadCgroups and DefaultDaemons return the defaults of
// reservedSystemCPUs' lists, fresh each call so callers may change them.
func DefaultSystemCgroups() []string   { return []string{"system.slice"} }
func DefaultWorkloadCgroups() []string { return []string{"kubepods.slice", "kubepods"} }
func DefaultDaemons() []string {
	return []string{"kubelet", "containerd", "crio", "dockerd", "systemd-journald"}
}

// Profile is a set of node settings. A section left nil leaves that part of the node alone.
type Profile struct {
	Name         string
	Extends      string // a built-in's name, or ""
	Description  string
	Sysctl       map[string]string // key (dotted, e.g. vm.swappiness) -> value as text
	Journald     *Journald
	ReservedCPUs *ReservedCPUs
	Swap         *Swap
	// Source is "built-in", a file path, or "GKE node system config <path>".
	Source string
	// Unchecked are key paths of a GKE input that nodectl accepts but does not check, for
	// plan output to say so.
	Unchecked []string

	// given holds the key paths the file wrote (with a value or null), unset those set to
	// null, lines the YAML line of each: merging needs to tell "left out" from "set to the
	// zero value", and errors found after merging still point at the file's line.
	given map[string]bool
	unset map[string]bool
	lines map[string]int
	file  string // the file the lines are in
	gke   bool   // paths are shown in GKE's names
	// resolved marks Resolve's result, which YAML prints whole, without extends.
	resolved bool
}

// Entry is one key=value line of a configuration section, kept in order.
type Entry struct{ Key, Value string }

// Journald is a drop-in for journald's [Journal] section and where the journal is stored.
type Journald struct {
	DropIn   string  // node path of the drop-in; default journald.DefaultDropIn
	Settings []Entry // [Journal] entries, in order
	// Storage is a directory bind-mounted onto /var/log/journal; "" leaves storage alone.
	Storage string
}

// ReservedCPUs keeps the kubelet and system daemons on some CPUs and workloads off them.
type ReservedCPUs struct {
	CPUs string // "auto" or a CPU list; after Resolve a canonical list such as "0-1"
	// KubeletDropIn is the node path of the kubelet configuration drop-in setting
	// reservedSystemCPUs; "" writes none. Default kubelet.DefaultDropIn.
	KubeletDropIn   string
	SystemCgroups   []string // cgroups kept on the reserved CPUs; default DefaultSystemCgroups
	WorkloadCgroups []string // cgroups kept off them; default DefaultWorkloadCgroups
	Daemons         []string // process names moved onto them; default DefaultDaemons
}

// Swap is one swap area. With neither File nor Device it is a check only (from a GKE config,
// where GKE provisions the swap): Enabled means some swap is on, !Enabled that none is.
type Swap struct {
	File     string // node path of a swap file nodectl creates, or
	Device   string // a block device already formatted as swap (nodectl never formats one)
	Size     int64  // bytes, for a file
	Priority int    // -1 = the kernel's default
	Enabled  bool
}

// Node is what Resolve checks a profile against.
type Node struct {
	CPUs int // online CPUs
	// Online is the online CPU list (/sys/devices/system/cpu/online), for nodes where some
	// CPUs are offline; "" means CPUs 0 to CPUs-1.
	Online       string
	SysctlExists func(string) bool // nil: do not check
}

// Problem is one thing wrong with a profile. Parse and Resolve return all of them joined.
type Problem struct {
	Source string // file path, "built-in sandbox-density", ...
	Line   int    // YAML line, 0 when unknown
	Path   string // key path, e.g. sysctl.vm.swappiness or journald.settings.SystemMaxUse
	Msg    string
}

func (p *Problem) Error() string {
	loc := p.Source
	if p.Line > 0 {
		loc += ":" + strconv.Itoa(p.Line)
	}
	if p.Path == "" {
		return loc + ": " + p.Msg
	}
	return loc + ": " + p.Path + ": " + p.Msg
}

// builtins build fresh profiles, so callers may change what they get.
var builtins = map[string]func() *Profile{
	"sandbox-density": sandboxDensity,
}

// sandboxDensity is the seed report's tuning that made 768 sandboxes per node stable.
func sandboxDensity() *Profile {
	return &Profile{
		Name: "sandbox-density",
		Description: "Dense sandbox nodes: larger neighbour tables, swap-friendly reclaim, " +
			"bounded journald on local SSD, system CPUs reserved for the kubelet and OS daemons",
		Sysctl: map[string]string{
			"net.ipv4.neigh.default.gc_thresh1": "2048",
			"net.ipv4.neigh.default.gc_thresh2": "4096",
			"net.ipv4.neigh.default.gc_thresh3": "8192",
			"net.ipv6.neigh.default.gc_thresh1": "2048",
			"net.ipv6.neigh.default.gc_thresh2": "4096",
			"net.ipv6.neigh.default.gc_thresh3": "8192",
			"vm.swappiness":                     "100",
			"vm.watermark_scale_factor":         "500",
		},
		Journald: &Journald{
			DropIn: journald.DefaultDropIn,
			Settings: []Entry{
				{"SystemMaxUse", "500M"},
				{"RateLimitIntervalSec", "30s"},
				{"RateLimitBurst", "1000"},
			},
			// The local SSD on GKE nodes with local-SSD ephemeral storage.
			Storage: "/var/lib/containerd/systemd-journal",
		},
		ReservedCPUs: &ReservedCPUs{
			CPUs:            AutoCPUs,
			KubeletDropIn:   kubelet.DefaultDropIn,
			SystemCgroups:   DefaultSystemCgroups(),
			WorkloadCgroups: DefaultWorkloadCgroups(),
			Daemons:         DefaultDaemons(),
		},
		Source: SourceBuiltin,
	}
}

// Builtins lists the built-in profiles' names, sorted.
func Builtins() []string {
	names := make([]string, 0, len(builtins))
	for n := range builtins {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Builtin returns the built-in profile name, unresolved (reservedSystemCPUs "auto").
func Builtin(name string) (*Profile, error) {
	b, ok := builtins[name]
	if !ok {
		return nil, fmt.Errorf("no built-in profile %q: the built-ins are %s", name, strings.Join(Builtins(), ", "))
	}
	return b(), nil
}

// Load returns the built-in profile ref, or else parses the file at path ref.
func Load(ref string) (*Profile, error) {
	if b, ok := builtins[ref]; ok {
		return b(), nil
	}
	data, err := os.ReadFile(ref)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("profile %q is neither a built-in (%s) nor a file: %w", ref, strings.Join(Builtins(), ", "), err)
		}
		return nil, fmt.Errorf("reading profile: %w", err)
	}
	return Parse(data, ref)
}

// clone copies p deeply.
func (p *Profile) clone() *Profile {
	c := *p
	c.Sysctl = maps.Clone(p.Sysctl)
	if p.Journald != nil {
		j := *p.Journald
		j.Settings = slices.Clone(j.Settings)
		c.Journald = &j
	}
	if p.ReservedCPUs != nil {
		r := *p.ReservedCPUs
		r.SystemCgroups = slices.Clone(r.SystemCgroups)
		r.WorkloadCgroups = slices.Clone(r.WorkloadCgroups)
		r.Daemons = slices.Clone(r.Daemons)
		c.ReservedCPUs = &r
	}
	if p.Swap != nil {
		s := *p.Swap
		c.Swap = &s
	}
	c.Unchecked = slices.Clone(p.Unchecked)
	c.given = maps.Clone(p.given)
	c.unset = maps.Clone(p.unset)
	c.lines = maps.Clone(p.lines)
	return &c
}
