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
	b, err := preadWhole(p.fd, &p.buf)
	if err != nil {
		return nil, &fs.PathError{Op: "read", Path: p.path, Err: err} //rundir:other: the syscall, as os.File names it
	}
	return b, nil
}

// preadWhole reads the whole file at fd from its start into *buf, doubling it until a read
// comes back short: a file the kernel generates is read in one pread when the buffer holds it.
func preadWhole(fd int, buf *[]byte) ([]byte, error) {
	if len(*buf) == 0 {
		*buf = make([]byte, 8<<10)
	}
	for {
		n, err := unix.Pread(fd, *buf, 0)
		if err != nil {
			return nil, err
		}
		if n < len(*buf) {
			return (*buf)[:n], nil
		}
		*buf = make([]byte, 2*len(*buf))
	}
}

// close closes the file if it is open.
func (p *procFile) close() {
	if p.open {
		unix.Close(p.fd)
		p.open = false
	}
}
