package sample

import (
	"io/fs"

	"golang.org/x/sys/unix"
)

// procFile is a /proc file kept open and read again from its start, which makes the kernel
// generate it anew: opening, registering with the poller and closing the node sampler's files
// every interval took more than reading them (BenchmarkAgent1000Cgroups, profiled). One pread
// into a buffer larger than the file reads it whole: os.File.ReadAt read each file twice, the
// second time for its end.
type procFile struct {
	path string
	fd   int
	open bool // fd is open
	buf  []byte
}

// read returns the file's content, valid until the next read. A file that cannot be opened is
// tried again at the next read.
func (p *procFile) read() ([]byte, error) {
	if !p.open {
		fd, err := unix.Open(p.path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, &fs.PathError{Op: "open", Path: p.path, Err: err}
		}
		p.fd, p.open = fd, true
	}
	if p.buf == nil {
		p.buf = make([]byte, 8<<10)
	}
	for {
		n, err := unix.Pread(p.fd, p.buf, 0)
		if err != nil {
			return nil, &fs.PathError{Op: "read", Path: p.path, Err: err} //rundir:other: the syscall, as os.File names it
		}
		if n < len(p.buf) {
			return p.buf[:n], nil
		}
		p.buf = make([]byte, 2*len(p.buf))
	}
}

// close closes the file if it is open.
func (p *procFile) close() {
	if p.open {
		unix.Close(p.fd)
		p.open = false
	}
}
