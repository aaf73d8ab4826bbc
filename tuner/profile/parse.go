package profile

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/nodectl/nodectl/tuner/swap"
)

// The keys of nodectl's format, in the order docs/tuning-profiles.md and YAML use.
var (
	topKeys      = []string{"name", "description", "extends", "sysctl", "journald", "reservedSystemCPUs", "swap"}
	journaldKeys = []string{"dropIn", "settings", "storage"}
	reservedKeys = []string{"cpus", "kubeletDropIn", "systemCgroups", "workloadCgroups", "daemons"}
	swapKeys     = []string{"file", "device", "size", "priority", "enabled"}
)

// minSwapSize is the smallest swap file accepted: far above mkswap's ten pages, and anything
// smaller is surely a unit mistake (8 instead of 8Gi).
const minSwapSize = 1 << 20

// Parse reads a profile in nodectl's format, or a GKE node system config when the top level
// has a linuxConfig or kubeletConfig key. source names the data in errors (a file path).
// Every problem found is returned, joined; merging with the base profile and the checks
// against the node are Resolve's.
func Parse(data []byte, source string) (*Profile, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, &Problem{Source: source, Msg: "not valid YAML: " + strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	if doc.Kind == 0 || len(doc.Content) == 0 || deref(doc.Content[0]).Tag == "!!null" {
		return nil, &Problem{Source: source, Msg: "empty profile: want a mapping with keys " + strings.Join(topKeys, ", ")}
	}
	root := deref(doc.Content[0])
	ps := &parser{source: source}
	if root.Kind != yaml.MappingNode {
		ps.problem(root, "", "want a mapping with keys %s, got %s", strings.Join(topKeys, ", "), describe(root))
		return nil, ps.err()
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		if k := root.Content[i].Value; k == "linuxConfig" || k == "kubeletConfig" {
			return ps.gke(root)
		}
	}
	return ps.nodectl(root)
}

type parser struct {
	source string
	probs  []error
	p      *Profile
}

func (ps *parser) problem(n *yaml.Node, path, format string, a ...any) {
	line := 0
	if n != nil {
		line = n.Line
	}
	ps.probs = append(ps.probs, &Problem{Source: ps.source, Line: line, Path: path, Msg: fmt.Sprintf(format, a...)})
}

func (ps *parser) err() error { return errors.Join(ps.probs...) }

// note records that the file wrote path at line (null records it as unset too).
func (ps *parser) note(path string, k, v *yaml.Node) {
	ps.p.given[path] = true
	ps.p.lines[path] = k.Line
	if isNull(v) {
		ps.p.unset[path] = true
	}
}

// mapping calls each for every key of the mapping n in order, refusing keys not in allowed
// (nil allows any) and keys written twice.
func (ps *parser) mapping(n *yaml.Node, path string, allowed []string, each func(key, kpath string, k, v *yaml.Node)) {
	n = deref(n)
	if n.Kind != yaml.MappingNode {
		if allowed != nil {
			ps.problem(n, path, "want a mapping with keys %s, got %s", strings.Join(allowed, ", "), describe(n))
		} else {
			ps.problem(n, path, "want a mapping, got %s", describe(n))
		}
		return
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := deref(n.Content[i]), deref(n.Content[i+1])
		kpath := join(path, k.Value)
		if k.Kind != yaml.ScalarNode {
			ps.problem(k, path, "want a plain key, got %s", describe(k))
			continue
		}
		if allowed != nil && !slices.Contains(allowed, k.Value) {
			ps.problem(k, kpath, "unknown key: allowed here are %s", strings.Join(allowed, ", "))
			continue
		}
		if line, dup := seen[k.Value]; dup {
			ps.problem(k, kpath, "written twice (first at line %d)", line)
			continue
		}
		seen[k.Value] = k.Line
		each(k.Value, kpath, k, v)
	}
}

// nodectl parses nodectl's own format.
func (ps *parser) nodectl(root *yaml.Node) (*Profile, error) {
	p := &Profile{Source: ps.source, file: ps.source,
		given: map[string]bool{}, unset: map[string]bool{}, lines: map[string]int{}}
	ps.p = p
	ps.mapping(root, "", topKeys, func(key, path string, k, v *yaml.Node) {
		ps.note(path, k, v)
		switch key {
		case "name":
			p.Name = ps.str(v, path)
		case "description":
			p.Description = ps.str(v, path)
		case "extends":
			p.Extends = ps.str(v, path)
		case "sysctl":
			if !isNull(v) {
				p.Sysctl = map[string]string{}
				ps.mapping(v, path, nil, func(key, path string, k, v *yaml.Node) {
					ps.note(path, k, v)
					if val, ok := ps.sysctlValue(v, path); ok && !isNull(v) {
						p.Sysctl[key] = val
					}
				})
			}
		case "journald":
			if !isNull(v) {
				p.Journald = ps.journald(v, path)
			}
		case "reservedSystemCPUs":
			if !isNull(v) {
				p.ReservedCPUs = ps.reserved(v, path)
			}
		case "swap":
			if !isNull(v) {
				p.Swap = ps.swap(v, path)
			}
		}
	})
	if p.Name == "" && !p.given["name"] {
		// A file's profile is called by its file name unless it says otherwise.
		p.Name = strings.TrimSuffix(filepath.Base(ps.source), filepath.Ext(ps.source))
	}
	if len(ps.probs) > 0 {
		return nil, ps.err()
	}
	return p, nil
}

func (ps *parser) journald(n *yaml.Node, path string) *Journald {
	j := &Journald{}
	ps.mapping(n, path, journaldKeys, func(key, path string, k, v *yaml.Node) {
		ps.note(path, k, v)
		switch key {
		case "dropIn":
			j.DropIn = ps.str(v, path)
		case "storage":
			j.Storage = ps.str(v, path)
		case "settings":
			if isNull(v) {
				return
			}
			ps.mapping(v, path, nil, func(key, path string, k, v *yaml.Node) {
				ps.note(path, k, v)
				if isNull(v) {
					return
				}
				if v.Kind != yaml.ScalarNode {
					ps.problem(v, path, "want a value such as 500M, 30s or 1000, got %s", describe(v))
					return
				}
				j.Settings = append(j.Settings, Entry{key, strings.TrimSpace(v.Value)})
			})
		}
	})
	return j
}

func (ps *parser) reserved(n *yaml.Node, path string) *ReservedCPUs {
	r := &ReservedCPUs{}
	ps.mapping(n, path, reservedKeys, func(key, path string, k, v *yaml.Node) {
		ps.note(path, k, v)
		switch key {
		case "cpus":
			// A single CPU is a YAML number: cpus: 0.
			if v.Tag == "!!int" {
				r.CPUs = v.Value
			} else {
				r.CPUs = ps.str(v, path)
			}
		case "kubeletDropIn":
			r.KubeletDropIn = ps.str(v, path)
		case "systemCgroups":
			r.SystemCgroups = ps.list(v, path)
		case "workloadCgroups":
			r.WorkloadCgroups = ps.list(v, path)
		case "daemons":
			r.Daemons = ps.list(v, path)
		}
	})
	return r
}

func (ps *parser) swap(n *yaml.Node, path string) *Swap {
	s := &Swap{Priority: -1, Enabled: true}
	ps.mapping(n, path, swapKeys, func(key, path string, k, v *yaml.Node) {
		ps.note(path, k, v)
		switch key {
		case "file":
			s.File = ps.str(v, path)
		case "device":
			s.Device = ps.str(v, path)
		case "size":
			s.Size = ps.size(v, path)
		case "priority":
			if isNull(v) {
				return
			}
			if v.Tag != "!!int" {
				ps.problem(v, path, "want an integer from -1 (the kernel's default) to %d, got %s", swap.MaxPriority, describe(v))
				return
			}
			if err := v.Decode(&s.Priority); err != nil {
				ps.problem(v, path, "%s is not an integer from -1 to %d", v.Value, swap.MaxPriority)
			}
		case "enabled":
			if isNull(v) {
				return
			}
			if v.Tag != "!!bool" {
				ps.problem(v, path, "want true or false, got %s", describe(v))
				return
			}
			_ = v.Decode(&s.Enabled) // a !!bool always decodes
		}
	})
	return s
}

// size reads a byte count: a Kubernetes quantity (8Gi, 512Mi) or a plain number of bytes.
func (ps *parser) size(v *yaml.Node, path string) int64 {
	if isNull(v) {
		return 0
	}
	const allowed = "allowed: a Kubernetes quantity such as 512Mi or 8Gi, or a number of bytes, at least 1Mi"
	if v.Kind != yaml.ScalarNode || (v.Tag != "!!int" && v.Tag != "!!float" && v.Tag != "!!str") {
		ps.problem(v, path, "want a size, got %s: %s", describe(v), allowed)
		return 0
	}
	q, err := resource.ParseQuantity(v.Value)
	if err != nil {
		ps.problem(v, path, "%q is not a size: %s", v.Value, allowed)
		return 0
	}
	b, ok := q.AsInt64()
	if !ok || b < minSwapSize {
		ps.problem(v, path, "%q is not a whole number of bytes of at least 1Mi: %s", v.Value, allowed)
		return 0
	}
	return b
}

// str reads a string; null reads as "".
func (ps *parser) str(v *yaml.Node, path string) string {
	if isNull(v) {
		return ""
	}
	if v.Kind != yaml.ScalarNode || v.Tag != "!!str" {
		ps.problem(v, path, "want a string, got %s", describe(v))
		return ""
	}
	return v.Value
}

// list reads a list of strings; null reads as an empty list.
func (ps *parser) list(v *yaml.Node, path string) []string {
	out := []string{}
	if isNull(v) {
		return out
	}
	if v.Kind != yaml.SequenceNode {
		ps.problem(v, path, "want a list of strings, got %s", describe(v))
		return out
	}
	for i, e := range v.Content {
		e = deref(e)
		if e.Kind != yaml.ScalarNode || e.Tag != "!!str" {
			ps.problem(e, fmt.Sprintf("%s[%d]", path, i), "want a string, got %s", describe(e))
			continue
		}
		out = append(out, e.Value)
	}
	return out
}

// sysctlValue reads a sysctl's value as the text written to /proc/sys: a number, or a string
// whose whitespace runs become single spaces (the kernel reads "4096 87380 6291456" in any
// spacing and prints it with tabs).
func (ps *parser) sysctlValue(v *yaml.Node, path string) (string, bool) {
	switch {
	case isNull(v):
		return "", true
	case v.Kind == yaml.ScalarNode && v.Tag == "!!int":
		var i int64
		if err := v.Decode(&i); err != nil {
			ps.problem(v, path, "%s is not a 64-bit integer", v.Value)
			return "", false
		}
		return strconv.FormatInt(i, 10), true
	case v.Kind == yaml.ScalarNode && v.Tag == "!!str":
		s := strings.Join(strings.Fields(v.Value), " ")
		if s == "" {
			ps.problem(v, path, "empty value: want a number or a string such as \"4096 87380 6291456\"; null removes the key")
			return "", false
		}
		return s, true
	}
	ps.problem(v, path, "want a number or a string, got %s (quote it to pass it as text)", describe(v))
	return "", false
}

func deref(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	n = deref(n)
	return n == nil || (n.Kind == yaml.ScalarNode && n.Tag == "!!null")
}

// describe names what a YAML node is, for "want X, got Y".
func describe(n *yaml.Node) string {
	n = deref(n)
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	switch n.Tag {
	case "!!null":
		return "null"
	case "!!bool":
		return "the boolean " + n.Value
	case "!!int", "!!float":
		return "the number " + n.Value
	case "!!str":
		return strconv.Quote(excerpt(n.Value))
	}
	return n.Tag + " " + excerpt(n.Value)
}

// excerptRunes bounds how much of a value an error quotes: a file given by mistake (a
// --profile of /etc/passwd) is named by its start, not echoed whole.
const excerptRunes = 40

// excerpt is v's first excerptRunes characters, with an ellipsis when it was longer.
func excerpt(v string) string {
	r := []rune(v)
	if len(r) <= excerptRunes {
		return v
	}
	return string(r[:excerptRunes]) + "…"
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}
