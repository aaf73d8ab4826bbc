package profile

import (
	"bytes"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/api/resource"
)

var intRE = regexp.MustCompile(`^-?[0-9]+$`)

// YAML prints the profile in nodectl's format, for `tune plan -o yaml` and the docs; Parse
// reads it back to the same profile. A resolved profile prints whole, every key, with what
// extends added merged in (so extends is left out). An unresolved one prints what it sets,
// with null for what it removes from the profile it extends.
func (p *Profile) YAML() ([]byte, error) {
	root := &yaml.Node{Kind: yaml.MappingNode}
	var head []string
	if p.resolved {
		src := p.Source
		if src == SourceBuiltin {
			src = "built-in " + p.Name
		}
		head = append(head, "resolved from "+src)
		if p.Extends != "" {
			head = append(head, "extends "+p.Extends+", merged in below")
		}
	}
	// show reports whether to print the key at kpath: a resolved profile prints all, an
	// unresolved one what the file wrote or the code set.
	show := func(kpath string, set bool) bool { return p.resolved || set || p.given[kpath] }
	// removed reports whether the file set kpath to null, which a resolved profile has applied.
	removed := func(kpath string) bool { return !p.resolved && p.unset[kpath] }

	add(root, "name", str(p.Name))
	if p.Description != "" {
		add(root, "description", str(p.Description))
	}
	if p.Extends != "" && !p.resolved {
		add(root, "extends", str(p.Extends))
	}

	sysctl := &yaml.Node{Kind: yaml.MappingNode}
	keys := make([]string, 0, len(p.Sysctl))
	for k := range p.Sysctl {
		keys = append(keys, k)
	}
	for u := range p.unset {
		if k, ok := strings.CutPrefix(u, "sysctl."); ok && removed(u) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		if v, ok := p.Sysctl[k]; ok {
			add(sysctl, k, scalar(v))
		} else {
			add(sysctl, k, null())
		}
	}
	switch {
	case len(sysctl.Content) > 0:
		add(root, "sysctl", sysctl)
	case removed("sysctl"):
		add(root, "sysctl", null())
	}

	if j := p.Journald; j != nil {
		m := &yaml.Node{Kind: yaml.MappingNode}
		if show("journald.dropIn", j.DropIn != "") {
			add(m, "dropIn", str(j.DropIn))
		}
		settings := &yaml.Node{Kind: yaml.MappingNode}
		for _, e := range j.Settings {
			add(settings, e.Key, scalar(e.Value))
		}
		var gone []string
		for u := range p.unset {
			if k, ok := strings.CutPrefix(u, "journald.settings."); ok && removed(u) {
				gone = append(gone, k)
			}
		}
		slices.Sort(gone)
		for _, k := range gone {
			add(settings, k, null())
		}
		switch {
		case removed("journald.settings") && len(settings.Content) == 0:
			add(m, "settings", null())
		case show("journald.settings", len(settings.Content) > 0):
			add(m, "settings", settings)
		}
		if show("journald.storage", j.Storage != "") {
			add(m, "storage", str(j.Storage))
		}
		add(root, "journald", m)
	} else if removed("journald") {
		add(root, "journald", null())
	}

	if r := p.ReservedCPUs; r != nil {
		m := &yaml.Node{Kind: yaml.MappingNode}
		if show("reservedSystemCPUs.cpus", r.CPUs != "") {
			add(m, "cpus", str(r.CPUs))
		}
		if show("reservedSystemCPUs.kubeletDropIn", r.KubeletDropIn != "") {
			add(m, "kubeletDropIn", str(r.KubeletDropIn))
		}
		for _, l := range []struct {
			key  string
			list []string
		}{{"systemCgroups", r.SystemCgroups}, {"workloadCgroups", r.WorkloadCgroups}, {"daemons", r.Daemons}} {
			if show("reservedSystemCPUs."+l.key, l.list != nil) {
				add(m, l.key, list(l.list))
			}
		}
		add(root, "reservedSystemCPUs", m)
	} else if removed("reservedSystemCPUs") {
		add(root, "reservedSystemCPUs", null())
	}

	if s := p.Swap; s != nil {
		m := &yaml.Node{Kind: yaml.MappingNode}
		if s.File != "" {
			add(m, "file", str(s.File))
		}
		if s.Device != "" {
			add(m, "device", str(s.Device))
		}
		if s.Size != 0 {
			add(m, "size", str(resource.NewQuantity(s.Size, resource.BinarySI).String()))
		}
		add(m, "priority", &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.Itoa(s.Priority)})
		add(m, "enabled", &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(s.Enabled)})
		add(root, "swap", m)
	} else if removed("swap") {
		add(root, "swap", null())
	}
	if len(p.Unchecked) > 0 {
		root.FootComment = "not checked by nodectl:\n" + strings.Join(p.Unchecked, "\n")
	}
	root.HeadComment = strings.Join(head, "\n")

	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(root); err != nil {
		return nil, fmt.Errorf("printing profile %s: %w", p.Name, err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("printing profile %s: %w", p.Name, err)
	}
	return buf.Bytes(), nil
}

func add(m *yaml.Node, key string, v *yaml.Node) {
	m.Content = append(m.Content, str(key), v)
}

// scalar prints an integer as a number and anything else as a string.
func scalar(s string) *yaml.Node {
	if intRE.MatchString(s) {
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: s}
	}
	return str(s)
}

func null() *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null"} }

func str(s string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s} }

func list(l []string) *yaml.Node {
	n := &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}
	for _, s := range l {
		n.Content = append(n.Content, str(s))
	}
	return n
}
