package daemons

import (
	"encoding/binary"
	"fmt"
	"strconv"

	"golang.org/x/sys/unix"
)

// pidEntries lists the processes of the procfs at procfsDir, each with its directory's inode
// number, read from the directory's entries as they are (getdents64): no stat a process.
func pidEntries(procfsDir string) ([]procEntry, error) {
	fd, err := unix.Open(procfsDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var out []procEntry
	buf := make([]byte, 32<<10)
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", procfsDir, err)
		}
		if n <= 0 {
			return out, nil
		}
		if out, err = appendPidEntries(out, buf[:n]); err != nil {
			return nil, fmt.Errorf("reading %s: %w", procfsDir, err)
		}
	}
}

// direntName is where a linux_dirent64's name starts: after its inode number (8 bytes), its
// offset (8), its record's length (2) and its type (1).
const direntName = 19

// appendPidEntries appends the numeric entries of b, linux_dirent64 records, to out.
func appendPidEntries(out []procEntry, b []byte) ([]procEntry, error) {
	for len(b) > 0 {
		if len(b) < direntName {
			return out, fmt.Errorf("a directory entry of %d bytes", len(b))
		}
		reclen := int(binary.NativeEndian.Uint16(b[16:18]))
		if reclen < direntName || reclen > len(b) {
			return out, fmt.Errorf("a directory entry's length %d of %d bytes", reclen, len(b))
		}
		name := b[direntName:reclen]
		for i, c := range name {
			if c == 0 {
				name = name[:i]
				break
			}
		}
		if pid, err := strconv.Atoi(string(name)); err == nil && pid > 0 {
			out = append(out, procEntry{pid: pid, ino: binary.NativeEndian.Uint64(b[:8])})
		}
		b = b[reclen:]
	}
	return out, nil
}
