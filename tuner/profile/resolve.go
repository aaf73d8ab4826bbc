package profile

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/nodectl/nodectl/tuner/journald"
	"github.com/nodectl/nodectl/tuner/kubelet"
)

// Resolve returns the profile to apply on node n: p merged on top of the built-in it extends,
// defaults filled in, reservedSystemCPUs "auto" sized from n.CPUs, and everything checked
// against n. All problems are returned in one joined error (each a *Problem), before anything
// is changed. p itself is not modified.
//
// Merge rules (docs/tuning-profiles.md): sysctl keys and journald settings merge key by key,
// a key set to null removing the inherited one; journald and reservedSystemCPUs merge field
// by field; swap replaces the inherited one whole; a section set to null removes it.
func (p *Profile) Resolve(n Node) (*Profile, error) {
	out := p.clone()
	var probs []error
	if p.Extends != "" {
		if base, ok := builtins[p.Extends]; ok {
			out = merge(base(), p)
		} else {
			probs = append(probs, p.problem("extends", "%q is not a built-in profile: allowed are %s",
				p.Extends, strings.Join(Builtins(), ", ")))
		}
	}
	out.fillDefaults()
	v := &validator{p: out, node: n}
	v.run()
	probs = append(probs, v.probs...)
	if len(probs) > 0 {
		return nil, errors.Join(probs...)
	}
	out.resolved = true
	return out, nil
}

// merge lays over (a user profile) on top of base (the built-in it extends).
func merge(base, over *Profile) *Profile {
	out := base.clone()
	out.Name, out.Extends, out.Source = over.Name, over.Extends, over.Source
	if over.Description != "" || over.given["description"] {
		out.Description = over.Description
	}
	out.Unchecked = slices.Clone(over.Unchecked)
	o := over.clone()
	out.given, out.unset, out.lines, out.file, out.gke = o.given, o.unset, o.lines, o.file, o.gke

	if over.unset["sysctl"] {
		out.Sysctl = nil
	}
	for k, v := range over.Sysctl {
		if out.Sysctl == nil {
			out.Sysctl = map[string]string{}
		}
		out.Sysctl[k] = v
	}
	for u := range over.unset {
		if k, ok := strings.CutPrefix(u, "sysctl."); ok {
			delete(out.Sysctl, k)
		}
	}

	switch {
	case over.unset["journald"]:
		out.Journald = nil
	case o.Journald != nil && out.Journald == nil:
		out.Journald = o.Journald
	case o.Journald != nil:
		j, oj := out.Journald, o.Journald
		if oj.DropIn != "" || over.given["journald.dropIn"] {
			j.DropIn = oj.DropIn
		}
		if oj.Storage != "" || over.given["journald.storage"] {
			j.Storage = oj.Storage
		}
		if over.unset["journald.settings"] {
			j.Settings = nil
		}
		for _, e := range oj.Settings {
			if i := slices.IndexFunc(j.Settings, func(b Entry) bool { return b.Key == e.Key }); i >= 0 {
				j.Settings[i].Value = e.Value
			} else {
				j.Settings = append(j.Settings, e)
			}
		}
		j.Settings = slices.DeleteFunc(j.Settings, func(e Entry) bool {
			return over.unset["journald.settings."+e.Key]
		})
	}

	switch {
	case over.unset["reservedSystemCPUs"]:
		out.ReservedCPUs = nil
	case o.ReservedCPUs != nil && out.ReservedCPUs == nil:
		out.ReservedCPUs = o.ReservedCPUs
	case o.ReservedCPUs != nil:
		r, or := out.ReservedCPUs, o.ReservedCPUs
		given := func(key string) bool { return over.given["reservedSystemCPUs."+key] }
		if or.CPUs != "" || given("cpus") {
			r.CPUs = or.CPUs
		}
		if or.KubeletDropIn != "" || given("kubeletDropIn") {
			r.KubeletDropIn = or.KubeletDropIn
		}
		if or.SystemCgroups != nil || given("systemCgroups") {
			r.SystemCgroups = or.SystemCgroups
		}
		if or.WorkloadCgroups != nil || given("workloadCgroups") {
			r.WorkloadCgroups = or.WorkloadCgroups
		}
		if or.Daemons != nil || given("daemons") {
			r.Daemons = or.Daemons
		}
	}

	// One swap area: a file from one profile and a device from another would be two.
	if over.unset["swap"] {
		out.Swap = nil
	} else if o.Swap != nil {
		out.Swap = o.Swap
	}
	return out
}

// fillDefaults fills what a section leaves out. A key the file wrote keeps its value, so
// kubeletDropIn: "" still means no drop-in.
func (p *Profile) fillDefaults() {
	if j := p.Journald; j != nil && j.DropIn == "" {
		j.DropIn = journald.DefaultDropIn
	}
	if r := p.ReservedCPUs; r != nil {
		given := func(key string) bool { return p.given["reservedSystemCPUs."+key] }
		if r.CPUs == "" && !given("cpus") {
			r.CPUs = AutoCPUs
		}
		if r.KubeletDropIn == "" && !given("kubeletDropIn") {
			r.KubeletDropIn = kubelet.DefaultDropIn
		}
		if r.SystemCgroups == nil && !given("systemCgroups") {
			r.SystemCgroups = DefaultSystemCgroups()
		}
		if r.WorkloadCgroups == nil && !given("workloadCgroups") {
			r.WorkloadCgroups = DefaultWorkloadCgroups()
		}
		if r.Daemons == nil && !given("daemons") {
			r.Daemons = DefaultDaemons()
		}
	}
}

// problem is a Problem at key path kpath: at its line when the file wrote it, else in the
// built-in it was inherited from.
func (p *Profile) problem(kpath, format string, a ...any) *Problem {
	pr := &Problem{Source: p.Source, Path: kpath, Msg: fmt.Sprintf(format, a...)}
	if line, ok := p.lookupLine(kpath); ok {
		pr.Source, pr.Line = p.file, line
	} else if p.Extends != "" && kpath != "" {
		pr.Source = "built-in " + p.Extends
	} else if p.Source == SourceBuiltin {
		pr.Source = "built-in " + p.Name
	} else if p.file != "" {
		pr.Source = p.file
	}
	if p.gke {
		pr.Path = gkePath(kpath)
	}
	return pr
}

// lookupLine finds the line of kpath, or of the nearest section above it the file wrote.
func (p *Profile) lookupLine(kpath string) (int, bool) {
	if strings.HasPrefix(kpath, "sysctl.") {
		// Sysctl keys hold dots, and one the file did not write came from the built-in.
		line, ok := p.lines[kpath]
		return line, ok
	}
	for k := kpath; k != ""; k = parent(k) {
		if line, ok := p.lines[k]; ok {
			return line, true
		}
	}
	return 0, false
}

func parent(k string) string {
	if i := strings.LastIndexByte(k, '.'); i >= 0 {
		return k[:i]
	}
	return ""
}

// gkePath names a key of a profile read from a GKE config as GKE does.
func gkePath(kpath string) string {
	if k, ok := strings.CutPrefix(kpath, "sysctl"); ok {
		return gkeSysctlPath + k
	}
	if k, ok := strings.CutPrefix(kpath, "swap"); ok {
		return gkeSwapPath + k
	}
	return kpath
}

// isAbs reports whether s is a clean absolute path on the node.
func isAbs(s string) bool { return path.IsAbs(s) && path.Clean(s) == s }
