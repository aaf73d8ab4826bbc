//go:build linux

package swapfile

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Swap header (include/linux/swap.h, union swap_header): version 1 after 1024 boot bytes, the
// last usable page, no bad pages; the magic ends the first page.
const (
	swapMagic    = "SWAPSPACE2"
	swapVersion  = 1
	bootBits     = 1024
	minSwapPages = 10
	swapFlagPrio = 0x8000 // SWAP_FLAG_PREFER
	swapPrioMask = 0x7fff // SWAP_FLAG_PRIO_MASK
)

// Create makes a swap file of size bytes (rounded down to pages) at path, allocated on disk and
// formatted, but not on. path must not exist and must be on a filesystem that can hold swap
// (ext4, xfs: not tmpfs or overlayfs).
func Create(path string, size int64) (*File, error) {
	page := int64(os.Getpagesize())
	size -= size % page
	if size < minSwapPages*page {
		return nil, fmt.Errorf("creating swap file %s: size %d bytes is below the minimum of %d pages", path, size, minSwapPages)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("creating swap file %s: %w", path, ErrExists)
	}
	if err != nil {
		return nil, fmt.Errorf("creating swap file: %w", err)
	}
	if err := format(f, size, page); err != nil {
		f.Close()
		os.Remove(path)
		return nil, fmt.Errorf("creating swap file %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("creating swap file %s: %w", path, err)
	}
	return &File{Path: path, Size: size}, nil
}

// format allocates size bytes without holes (swapon refuses them) and writes the header.
func format(f *os.File, size, page int64) error {
	if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		return fmt.Errorf("allocating %d bytes: %w", size, err)
	}
	hdr := make([]byte, page)
	binary.NativeEndian.PutUint32(hdr[bootBits:], swapVersion)
	binary.NativeEndian.PutUint32(hdr[bootBits+4:], uint32(size/page-1))
	copy(hdr[page-int64(len(swapMagic)):], swapMagic)
	if _, err := f.WriteAt(hdr, 0); err != nil {
		return fmt.Errorf("writing the swap header: %w", err)
	}
	return f.Sync()
}

// Enable turns the swap file on at priority prio (0 to 32767, higher is used first), or at the
// kernel's default (below every other area) when prio is negative.
func (f *File) Enable(prio int) error {
	if prio > swapPrioMask {
		return fmt.Errorf("enabling swap file %s: priority %d: want at most %d, or negative for the default", f.Path, prio, swapPrioMask)
	}
	flags := 0
	if prio >= 0 {
		flags = swapFlagPrio | prio
	}
	p, err := unix.BytePtrFromString(f.Path)
	if err != nil {
		return err
	}
	if _, _, errno := unix.Syscall(unix.SYS_SWAPON, uintptr(unsafe.Pointer(p)), uintptr(flags), 0); errno != 0 {
		return fmt.Errorf("enabling swap file %s: swapon: %w", f.Path, errno)
	}
	f.on = true
	return nil
}

// Disable turns the swap file off, which pages what it holds back into memory; a file that is
// not on is left alone.
func (f *File) Disable() error {
	if !f.on {
		return nil
	}
	p, err := unix.BytePtrFromString(f.Path)
	if err != nil {
		return err
	}
	if _, _, errno := unix.Syscall(unix.SYS_SWAPOFF, uintptr(unsafe.Pointer(p)), 0, 0); errno != 0 {
		return fmt.Errorf("disabling swap file %s: swapoff: %w", f.Path, errno)
	}
	f.on = false
	return nil
}

// OpenDevice takes a block device the user formatted as swap (mkswap): it is never formatted
// here, since that would destroy what it holds, only turned on and off. Its size is read from
// its swap header.
func OpenDevice(path string) (*File, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("swap device: %w", err)
	}
	if st.Mode()&os.ModeDevice == 0 || st.Mode()&os.ModeCharDevice != 0 {
		return nil, fmt.Errorf("swap device %s: not a block device", path)
	}
	size, err := readHeader(path)
	if errors.Is(err, ErrNotSwap) {
		return nil, fmt.Errorf("swap device %s: no swap signature; format it with mkswap first (nodectl never formats a device: it would destroy what it holds)", path)
	}
	if err != nil {
		return nil, fmt.Errorf("swap device %s: %w", path, err)
	}
	return &File{Path: path, Size: size, device: true}, nil
}

// Open takes an existing swap file or block device, one with a swap signature, without
// changing it. on says whether it is on now (see Areas), so that Disable and Remove turn it
// off; Remove deletes a file but never a device.
func Open(path string, on bool) (*File, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("opening swap area: %w", err)
	}
	device := st.Mode()&os.ModeDevice != 0 && st.Mode()&os.ModeCharDevice == 0
	if !device && !st.Mode().IsRegular() {
		return nil, fmt.Errorf("opening swap area %s: neither a regular file nor a block device", path)
	}
	size, err := readHeader(path)
	if err != nil {
		return nil, fmt.Errorf("opening swap area %s: %w", path, err)
	}
	return &File{Path: path, Size: size, on: on, device: device}, nil
}

// readHeader returns the size of the swap area at path from its header, or ErrNotSwap.
func readHeader(path string) (int64, error) {
	d, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer d.Close()
	page := int64(os.Getpagesize())
	hdr := make([]byte, page)
	if _, err := d.ReadAt(hdr, 0); errors.Is(err, io.EOF) {
		return 0, ErrNotSwap // shorter than a page
	} else if err != nil {
		return 0, fmt.Errorf("reading its header: %w", err)
	}
	if string(hdr[page-int64(len(swapMagic)):]) != swapMagic {
		return 0, ErrNotSwap
	}
	last := int64(binary.NativeEndian.Uint32(hdr[bootBits+4:]))
	return (last + 1) * page, nil
}

// Remove turns the swap file off if it is on and deletes it (a device is only turned off);
// calling it again does nothing.
func (f *File) Remove() error {
	if err := f.Disable(); err != nil {
		return err
	}
	if f.device {
		return nil
	}
	if err := os.Remove(f.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing swap file: %w", err)
	}
	return nil
}
