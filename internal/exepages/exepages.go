//go:build linux

// Package exepages gives back the pages of this process's own executable that only its start
// touched. A Go binary's start runs every package's init, spread over the whole of its code and
// read-only data, and the kernel maps the file's pages in blocks around each touch (fault-around,
// large folios): a long-running process keeps them all resident, though it never touches most
// of them again. Release unmaps them from the process (MADV_DONTNEED); the page cache keeps
// them, to be reclaimed first when memory runs short, and the pages the process still runs map
// again from it as it runs them.
package exepages

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"
)

// Mapping is one read-only mapping of the executable.
type Mapping struct{ Start, End uintptr }

// Mappings returns the read-only mappings of this process's executable (its code, read-only
// data and the runtime's tables): those of the file whose mapping holds this function's code.
// The file is known by the device and inode /proc/self/maps gives it, not by a stat of
// /proc/self/exe, which an overlay filesystem (a container's) answers with inodes of its own.
func Mappings() ([]Mapping, error) {
	self, err := procfs.Self()
	if err != nil {
		return nil, err
	}
	maps, err := self.ProcMaps()
	if err != nil {
		return nil, fmt.Errorf("reading its mappings: %w", err)
	}
	pc := reflect.ValueOf(Mappings).Pointer()
	i := slices.IndexFunc(maps, func(m *procfs.ProcMap) bool { return m.StartAddr <= pc && pc < m.EndAddr })
	if i < 0 || maps[i].Inode == 0 {
		return nil, errors.New("no file mapping holds the executable's code in /proc/self/maps")
	}
	var out []Mapping
	for _, m := range maps {
		if m.Inode == maps[i].Inode && m.Dev == maps[i].Dev && m.Perms != nil && !m.Perms.Write {
			out = append(out, Mapping{m.StartAddr, m.EndAddr})
		}
	}
	return out, nil
}

// Release unmaps the executable's read-only pages from this process. It changes no content:
// a private mapping of a file never written to reads the file's pages again. MADV_DONTNEED,
// not MADV_PAGEOUT: the kernel pages a file's cache out only for a process that owns the file
// or may write it, and the agent in its DaemonSet runs as another user than its binary's.
func Release() error {
	ms, err := Mappings()
	if err != nil {
		return err
	}
	for _, m := range ms {
		// The range is the kernel's own mapping: no Go memory is named, so it goes as numbers.
		if _, _, e := unix.Syscall(unix.SYS_MADVISE, m.Start, m.End-m.Start, unix.MADV_DONTNEED); e != 0 {
			return fmt.Errorf("madvise(MADV_DONTNEED) on %#x-%#x: %w", m.Start, m.End, e)
		}
	}
	return nil
}

// Resident is the bytes of the executable's read-only mappings resident in this process.
func Resident() (uint64, error) {
	ms, err := Mappings()
	if err != nil {
		return 0, err
	}
	return resident("/proc/self/pagemap", ms)
}

// resident counts the present pages of ms in a process's pagemap.
func resident(pagemap string, ms []Mapping) (uint64, error) {
	f, err := os.Open(pagemap)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	page := uintptr(os.Getpagesize())
	var n uint64
	buf := make([]byte, 8*512)
	for _, m := range ms {
		for a := m.Start; a < m.End; {
			k := min((m.End-a)/page, 512)
			if _, err := f.ReadAt(buf[:8*k], int64(a/page*8)); err != nil {
				return 0, fmt.Errorf("reading %s: %w", pagemap, err)
			}
			for i := range k {
				// Bit 63 of an entry: the page is present.
				if buf[8*i+7]&0x80 != 0 {
					n += uint64(page)
				}
			}
			a += k * page
		}
	}
	return n, nil
}
