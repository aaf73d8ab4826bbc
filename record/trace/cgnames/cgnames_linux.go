//go:build linux

package cgnames

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
	"unsafe"

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
// whether the ring lost any since the last call. A path cut to fit the event is handed as "".
// It is a host/cgroup.Feed.
func (t *Tracer) Feed(fn func(cgroup.Change)) (lost bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ring == nil {
		return false, errors.New("reading cgroup changes: tracer closed")
	}
	t.ring.SetDeadline(time.Now())
	var rec ringbuf.Record
	for {
		err := t.ring.ReadInto(&rec)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			break
		}
		if err != nil {
			return false, fmt.Errorf("reading the %s ring: %w", name, err)
		}
		c, err := decode(rec.RawSample)
		if err != nil {
			return false, err
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

// eventSize is struct cg_event's: id, hierarchy, op, len, then the path.
var eventSize = int(unsafe.Sizeof(cgnamesCgEvent{}))

// decode reads a struct cg_event (bpf/cgnames.bpf.c) by its fields' offsets: a reflective
// decode of its 256-byte path costs more than the rest of the read.
func decode(raw []byte) (cgroup.Change, error) {
	if len(raw) < eventSize {
		return cgroup.Change{}, fmt.Errorf("decoding a cgroup change: %d bytes, want %d", len(raw), eventSize)
	}
	e := binary.NativeEndian
	c := cgroup.Change{ID: e.Uint64(raw[0:]), Hierarchy: int(e.Uint32(raw[8:])), Removed: e.Uint16(raw[12:]) == uint16(cgnamesCgOpCG_RMDIR)}
	if n, path := int(e.Uint16(raw[14:])), raw[16:eventSize]; n < len(path) {
		c.Path = string(path[:n])
	}
	return c, nil
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
