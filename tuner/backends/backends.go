// Package backends turns a resolved profile into the backends' settings, in apply order, and
// rebuilds recorded settings from a state file.
package backends

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/nodectl/nodectl/host"

	"github.com/nodectl/nodectl/tuner"
	"github.com/nodectl/nodectl/tuner/cpuset"
	"github.com/nodectl/nodectl/tuner/journald"
	"github.com/nodectl/nodectl/tuner/kubelet"
	"github.com/nodectl/nodectl/tuner/profile"
	"github.com/nodectl/nodectl/tuner/swap"
	"github.com/nodectl/nodectl/tuner/sysctl"
)

// journalDir is where journald keeps a persistent journal; the storage setting mounts over it.
const journalDir = "/var/log/journal"

// Settings are p's settings on h, in the order apply goes: kernel settings first (sysctls
// sorted by key, so gc_thresh1 comes before 2 and 3; swap), then daemons' configuration
// (journald, the journal's storage, the kubelet drop-in) and last the live CPU partition,
// which moves processes. p must be resolved.
func Settings(h host.FS, p *profile.Profile) []tuner.Setting {
	var out []tuner.Setting
	keys := make([]string, 0, len(p.Sysctl))
	for k := range p.Sysctl {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		out = append(out, sysctl.New(h, k, p.Sysctl[k]))
	}
	if s := p.Swap; s != nil {
		a := swap.Area{File: s.File, Device: s.Device, Size: s.Size, Priority: s.Priority, Enabled: s.Enabled}
		if a.File == "" && a.Device == "" {
			a.Priority = -1 // a check only ("some swap is on"): no area of ours to prioritise
		}
		out = append(out, swap.New(h, a))
	}
	if j := p.Journald; j != nil {
		if len(j.Settings) > 0 {
			entries := make([]journald.Entry, len(j.Settings))
			for i, e := range j.Settings {
				entries[i] = journald.Entry{Key: e.Key, Value: e.Value}
			}
			out = append(out, journald.NewDropIn(h, j.DropIn, entries))
		}
		if j.Storage != "" {
			out = append(out, journald.NewStorage(h, j.Storage, journalDir))
		}
	}
	if r := p.ReservedCPUs; r != nil {
		if r.KubeletDropIn != "" {
			out = append(out, kubelet.NewDropIn(h, r.KubeletDropIn, r.CPUs))
		}
		out = append(out, cpuset.NewPartition(h, cpuset.Partition{Reserved: r.CPUs,
			SystemCgroups: r.SystemCgroups, WorkloadCgroups: r.WorkloadCgroups, Daemons: r.Daemons}))
	}
	return out
}

// Decoder rebuilds a recorded setting by its backend's name.
func Decoder(h host.FS) func(backend string, spec json.RawMessage) (tuner.Setting, error) {
	decoders := map[string]tuner.Decoder{
		"sysctl":          sysctl.Decode,
		"swap":            swap.Decode,
		"journald":        journald.DecodeDropIn,
		"journal-storage": journald.DecodeStorage,
		"kubelet":         kubelet.Decode,
		"cpuset":          cpuset.Decode,
	}
	return func(backend string, spec json.RawMessage) (tuner.Setting, error) {
		d, ok := decoders[backend]
		if !ok {
			return nil, fmt.Errorf("unknown backend %q (this nodectl knows sysctl, swap, journald, journal-storage, kubelet, cpuset)", backend)
		}
		return d(h, spec)
	}
}
