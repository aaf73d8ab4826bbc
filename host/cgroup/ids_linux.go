//go:build linux

package cgroup

import (
	"bytes"
	"encoding/binary"
	"path"

	"golang.org/x/sys/unix"
)

// cgroupIDs calls fn with the path below root (from "/") and the inode number (a cgroup's id)
// of root and of every directory below it. It reads each directory with getdents, whose
// entries carry their type and inode number: a cgroup costs its open, read and close, where
// filepath.WalkDir and a stat each took a syscall more and allocated every control file's
// entry (30 a cgroup on v1) to sort them. A directory removed during the walk is passed over.
func cgroupIDs(root string, fn func(rel string, id uint64)) {
	var st unix.Stat_t
	if unix.Stat(root, &st) != nil {
		return
	}
	fn("/", st.Ino)
	w := dirWalk{buf: make([]byte, 32<<10), fn: fn}
	w.below(root, "/")
}

type dirWalk struct {
	buf []byte
	fn  func(rel string, id uint64)
}

// subdir is a directory entry's name and inode number.
type subdir struct {
	name string
	ino  uint64
}

// below walks the directories below dir, whose path from the root is rel.
func (w *dirWalk) below(dir, rel string) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	var subs []subdir
	for {
		n, err := unix.Getdents(fd, w.buf)
		if err != nil || n <= 0 {
			break
		}
		subs = appendSubdirs(subs, dir, w.buf[:n])
	}
	unix.Close(fd) // before going down: one descriptor open at a time
	for _, s := range subs {
		p := path.Join(rel, s.name)
		w.fn(p, s.ino)
		w.below(dir+"/"+s.name, p)
	}
}

// appendSubdirs appends the directories among the linux_dirent64 records in b (inode number,
// offset, record length, type, name and its NUL), but . and .., to subs; an entry of unknown
// type is looked at with lstat.
func appendSubdirs(subs []subdir, dir string, b []byte) []subdir {
	for len(b) >= 19 {
		ino := binary.NativeEndian.Uint64(b[0:8])
		reclen := int(binary.NativeEndian.Uint16(b[16:18]))
		if reclen < 19 || reclen > len(b) {
			break
		}
		typ, name := b[18], b[19:reclen]
		if i := bytes.IndexByte(name, 0); i >= 0 {
			name = name[:i]
		}
		b = b[reclen:]
		if string(name) == "." || string(name) == ".." {
			continue
		}
		if typ == unix.DT_UNKNOWN {
			var st unix.Stat_t
			if unix.Lstat(dir+"/"+string(name), &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
				continue
			}
			ino, typ = st.Ino, unix.DT_DIR
		}
		if typ == unix.DT_DIR {
			subs = append(subs, subdir{name: string(name), ino: ino})
		}
	}
	return subs
}
