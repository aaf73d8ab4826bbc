//go:build linux

package cgnames

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"

	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/record/trace/internal/loader"
)

const name = "cgnames"

var dropReasons = map[cgnamesDropReason]string{cgnamesDropReasonDROP_RING_FULL: "ring_full"}

// Tracer owns the loaded programs and their ring.
type Tracer struct {
	mu    sync.Mutex
	objs  cgnamesObjects
	links []link.Link
	ring  *ringbuf.Reader
	drops uint64 // ring_full as of the last Feed
}

// New loads the programs and attaches them to the cgroup_mkdir and cgroup_rmdir tracepoints
// (tp_btf). A failed New closes what it opened.
func New(log *slog.Logger) (*Tracer, error) {
	spec, err := loadCgnames()
	if err != nil {
		return nil, fmt.Errorf("loading %s spec: %w", name, err)
	}
	t := &Tracer{}
	if err := loader.Load(name, spec, loader.Options{}, &t.objs, log); err != nil {
		return nil, err
	}
	if t.links, err = loader.Attach(loader.TpBTF("cgroup_mkdir", t.objs.CgroupMkdir), loader.TpBTF("cgroup_rmdir", t.objs.CgroupRmdir)); err != nil {
		t.Close()
		return nil, err
	}
	if t.ring, err = ringbuf.NewReader(t.objs.Ring); err != nil {
		t.Close()
		return nil, fmt.Errorf("opening the %s ring: %w", name, err)
	}
	return t, nil
}

// Feed hands fn every mkdir and rmdir the ring holds, without waiting for more, and says
// whether the ring lost any since the last call. A path the kernel's was cut from is handed as
// "". It is a host/cgroup.Feed.
func (t *Tracer) Feed(fn func(cgroup.Change)) (lost bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ring == nil {
		return false, errors.New("reading cgroup changes: tracer closed")
	}
	t.ring.SetDeadline(time.Now())
	var rec ringbuf.Record
	var e cgnamesCgEvent
	for {
		err := t.ring.ReadInto(&rec)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			break
		}
		if err != nil {
			return false, fmt.Errorf("reading the %s ring: %w", name, err)
		}
		if err := binary.Read(bytes.NewReader(rec.RawSample), binary.NativeEndian, &e); err != nil {
			return false, fmt.Errorf("decoding a cgroup change: %w", err)
		}
		c := cgroup.Change{Hierarchy: int(e.Hierarchy), ID: e.Id, Removed: e.Op == uint16(cgnamesCgOpCG_RMDIR)}
		if n := int(e.Len); n < len(e.Path) {
			c.Path = string(bytesOf(e.Path[:n]))
		}
		fn(c)
	}
	drops, err := loader.Drops(t.objs.Drops, dropReasons)
	if err != nil {
		return false, err
	}
	n := drops[dropReasons[cgnamesDropReasonDROP_RING_FULL]]
	lost, t.drops = n != t.drops, n
	return lost, nil
}

// bytesOf is the C chars of a path as bytes.
func bytesOf(cs []int8) []byte {
	b := make([]byte, len(cs))
	for i, c := range cs {
		b[i] = byte(c)
	}
	return b
}

// Close detaches and unloads everything. It is safe to call more than once.
func (t *Tracer) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	var errs []error
	if t.ring != nil {
		if err := t.ring.Close(); err != nil {
			errs = append(errs, fmt.Errorf("closing the %s ring: %w", name, err))
		}
		t.ring = nil
	}
	errs = append(errs, loader.Close(name, t.links, &t.objs))
	t.links = nil
	return errors.Join(errs...)
}
