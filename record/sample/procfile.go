package sample

import (
	"errors"
	"io"
	"os"
)

// procFile is a /proc file kept open and read again from its start, which makes the kernel
// generate it anew: opening, registering with the poller and closing the node sampler's files
// every interval took more than reading them (BenchmarkAgent1000Cgroups, profiled).
type procFile struct {
	path string
	f    *os.File
	buf  []byte
}

// read returns the file's content, valid until the next read. A file that cannot be opened is
// tried again at the next read.
func (p *procFile) read() ([]byte, error) {
	if p.f == nil {
		f, err := os.Open(p.path)
		if err != nil {
			return nil, err
		}
		p.f = f
	}
	if p.buf == nil {
		p.buf = make([]byte, 8<<10)
	}
	for {
		n, err := p.f.ReadAt(p.buf, 0)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		if n < len(p.buf) {
			return p.buf[:n], nil
		}
		p.buf = make([]byte, 2*len(p.buf))
	}
}

// close closes the file if it is open.
func (p *procFile) close() {
	if p.f != nil {
		p.f.Close()
		p.f = nil
	}
}
