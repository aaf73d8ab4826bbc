//go:build linux

package loader

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/nodectl/nodectl/agent/hist"
	"github.com/nodectl/nodectl/agent/trace/internal/features"
)

// Options are set on a collection before it loads.
type Options struct {
	CgroupV1 bool // the cgroup_v1 knob of bpf/include/common.h
	// PerCgroup sizes the maps keyed by cgroup, by map name. They are allocated as cgroups
	// appear where the kernel can do that safely: preallocated per-CPU values cost
	// capacity x value size x CPUs up front, tens of MB on a large node for cgroups that
	// mostly do not exist.
	PerCgroup map[string]uint32
}

// Load sets opts on spec and loads it into objs, a bpf2go objects struct. name names the
// object in errors and logs.
func Load(name string, spec *ebpf.CollectionSpec, opts Options, objs any, log *slog.Logger) error {
	if err := spec.Variables["cgroup_v1"].Set(opts.CgroupV1); err != nil {
		return fmt.Errorf("setting cgroup_v1 of %s: %w", name, err)
	}
	lazy := lazyAlloc(log)
	for m, size := range opts.PerCgroup {
		ms, ok := spec.Maps[m]
		if !ok {
			return fmt.Errorf("sizing %s: no map %s", name, m)
		}
		ms.MaxEntries = size
		if lazy {
			ms.Flags |= unix.BPF_F_NO_PREALLOC
		}
	}
	if err := spec.LoadAndAssign(objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			log.Warn("verifier rejected a program", "object", name, "log", fmt.Sprintf("%+v", ve))
		}
		return fmt.Errorf("loading %s objects: %w", name, err)
	}
	return nil
}

// probeWarned makes an inconclusive allocator probe, whose result is cached for the process,
// logged once rather than once per object.
var probeWarned sync.Once

// lazyAlloc reports whether maps keyed by cgroup may go without preallocation.
func lazyAlloc(log *slog.Logger) bool {
	err := features.HaveBPFMemAlloc()
	if err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
		probeWarned.Do(func() {
			log.Warn("probing for the BPF memory allocator failed, preallocating maps", "err", err)
		})
	}
	return err == nil
}

// Attachment is one program and the hook it attaches to.
type Attachment struct {
	hook   string
	attach func() (link.Link, error)
}

// TpBTF attaches a tp_btf program to the tracepoint its section names.
func TpBTF(tracepoint string, prog *ebpf.Program) Attachment {
	return Attachment{hook: tracepoint, attach: func() (link.Link, error) {
		return link.AttachTracing(link.TracingOptions{Program: prog})
	}}
}

// Tracepoint attaches a program to a classic tracepoint, which tracefs must carry.
func Tracepoint(group, name string, prog *ebpf.Program) Attachment {
	return Attachment{hook: group + "/" + name + " (needs tracefs)", attach: func() (link.Link, error) {
		return link.Tracepoint(group, name, prog, nil)
	}}
}

// Attach attaches in order and returns the links. On failure it detaches what it attached.
func Attach(as ...Attachment) ([]link.Link, error) {
	var links []link.Link
	for _, a := range as {
		l, err := a.attach()
		if err != nil {
			for _, l := range links {
				l.Close()
			}
			return nil, fmt.Errorf("attaching to %s: %w", a.hook, err)
		}
		links = append(links, l)
	}
	return links, nil
}

// Close detaches links and closes objs. name names the object in errors.
func Close(name string, links []link.Link, objs io.Closer) error {
	var errs []error
	for _, l := range links {
		if err := l.Close(); err != nil {
			errs = append(errs, fmt.Errorf("detaching %s program: %w", name, err))
		}
	}
	if err := objs.Close(); err != nil {
		errs = append(errs, fmt.Errorf("closing %s objects: %w", name, err))
	}
	return errors.Join(errs...)
}

// HistSum adds up the per-CPU copies of a struct hist (bpf/include/common.h).
type HistSum struct {
	slots        [hist.Slots]uint64
	count, sumNs uint64
}

// Add adds one CPU's copy.
func (s *HistSum) Add(slots []uint64, count, sumNs uint64) {
	for i, v := range slots {
		s.slots[i] += v
	}
	s.count += count
	s.sumNs += sumNs
}

// Log2 returns the sum.
func (s *HistSum) Log2() hist.Log2 { return hist.FromSlots(s.slots[:], s.count, s.sumNs) }

// Drops reads the per-CPU drop counters of bpf/include/common.h, by reason name; every reason
// is present.
func Drops[R ~uint32](m *ebpf.Map, reasons map[R]string) (map[string]uint64, error) {
	out := make(map[string]uint64, len(reasons))
	for r, name := range reasons {
		var per []uint64
		if err := m.Lookup(uint32(r), &per); err != nil {
			return nil, fmt.Errorf("reading drops %s: %w", name, err)
		}
		var n uint64
		for _, v := range per {
			n += v
		}
		out[name] = n
	}
	return out, nil
}

// Fill returns entries over m's capacity.
func Fill(entries int, m *ebpf.Map) float64 {
	if c := m.MaxEntries(); c > 0 {
		return float64(entries) / float64(c)
	}
	return 0
}

// DeleteIf deletes the keys of a hash map for which gone holds and returns how many it
// deleted. Keys added meanwhile may be missed.
func DeleteIf[K any](m *ebpf.Map, gone func(K) bool) (int, error) {
	var doomed []K
	var prev any // nil asks for the first key
	for {
		var k K
		err := m.NextKey(prev, &k)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return 0, fmt.Errorf("listing keys: %w", err)
		}
		if gone(k) {
			doomed = append(doomed, k)
		}
		prev = k
	}
	// Deleting while walking would restart the walk from the first key.
	n := 0
	for _, k := range doomed {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return n, fmt.Errorf("deleting %+v: %w", k, err)
		}
		n++
	}
	return n, nil
}
