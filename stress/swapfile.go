package stress

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/nodectl/nodectl/stress/swapfile"
)

// hostChanges are the node-wide settings a run changed and must put back: a swap file it made
// and enabled, sysctls it set. They are noted in the run's state before each change, so that a
// run killed midway is undone by `stress clean`.
type hostChanges struct {
	SwapFile   string            `json:"swap_file,omitempty"`
	SwapDevice string            `json:"swap_device,omitempty"` // the user's: turned off, never removed
	Sysctls    map[string]string `json:"sysctls,omitempty"`     // name (vm/swappiness) -> value before the run
}

// hostChangesFile, in a run's state directory, holds its hostChanges.
const hostChangesFile = "host-changes.json"

// hostUndo applies and undoes a run's host changes, keeping the note in its state current.
type hostUndo struct {
	paths   Paths
	id      string
	changes hostChanges
	swap    *swapfile.File // the swap file this run made, nil before
}

func (h *hostUndo) note() error {
	b, err := json.Marshal(h.changes)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(h.paths.State, h.id, hostChangesFile), b, 0o644); err != nil {
		return fmt.Errorf("noting host changes in the run state: %w", err)
	}
	return nil
}

// sysctlPath is the /proc/sys file of a sysctl named like vm/swappiness.
func sysctlPath(procfs, name string) string { return filepath.Join(procfs, "sys", name) }

// setSysctl notes a sysctl's value, then sets it.
func (h *hostUndo) setSysctl(name, value string) error {
	p := sysctlPath(h.paths.Procfs, name)
	old, err := os.ReadFile(p)
	if err != nil {
		return fmt.Errorf("reading %s: %w", p, err)
	}
	if _, ok := h.changes.Sysctls[name]; !ok {
		if h.changes.Sysctls == nil {
			h.changes.Sysctls = map[string]string{}
		}
		h.changes.Sysctls[name] = strings.TrimSpace(string(old))
		if err := h.note(); err != nil {
			return err
		}
	}
	if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
		return fmt.Errorf("setting %s to %s: %w", strings.ReplaceAll(name, "/", "."), value, err)
	}
	return nil
}

// enableSwap notes the file, then creates it (it must not exist), formats it and enables it at
// the kernel's default priority, below any swap the host already has. With size 0, path is a
// block device the user formatted as swap: it is only turned on (and off afterwards).
func (h *hostUndo) enableSwap(path string, size int64) error {
	if size == 0 {
		f, err := swapfile.OpenDevice(path)
		if err != nil {
			return fmt.Errorf("--swap: %w", err)
		}
		if used, err := swapUsed(h.paths.Procfs, path); err != nil {
			return err
		} else if used >= 0 {
			return fmt.Errorf("--swap %s: the device is already in use as swap; the run would not know what to put back", path)
		}
		h.changes.SwapDevice = path
		if err := h.note(); err != nil {
			return err
		}
		h.swap = f
		if err := f.Enable(-1); err != nil {
			return fmt.Errorf("--swap: %w", err)
		}
		return nil
	}
	if _, err := os.Lstat(path); err == nil {
		return fmt.Errorf("--swap %s: the file exists; name a new file, which the run creates and removes", path)
	}
	h.changes.SwapFile = path
	if err := h.note(); err != nil {
		return err
	}
	f, err := swapfile.Create(path, size)
	if err != nil {
		return fmt.Errorf("--swap: %w", err)
	}
	h.swap = f
	if err := f.Enable(-1); err != nil {
		return fmt.Errorf("--swap: %w", err)
	}
	return nil
}

// undo puts back everything noted: the swap file off and removed, the sysctls as they were.
func (h *hostUndo) undo() []error {
	var errs []error
	if h.swap != nil {
		if err := h.swap.Remove(); err != nil {
			errs = append(errs, err)
		}
		h.swap = nil
	}
	errs = append(errs, undoHostChanges(h.paths.Procfs, h.changes)...)
	h.changes = hostChanges{}
	if len(errs) == 0 {
		_ = os.Remove(filepath.Join(h.paths.State, h.id, hostChangesFile))
	}
	return errs
}

// undoHostChanges disables and removes the swap file and restores the sysctls of c. A killed
// run's file is found in /proc/swaps by its path.
func undoHostChanges(procfs string, c hostChanges) []error {
	var errs []error
	if c.SwapDevice != "" {
		if err := swapOff(procfs, c.SwapDevice); err != nil {
			errs = append(errs, err)
		}
	}
	if c.SwapFile != "" {
		if err := swapOff(procfs, c.SwapFile); err != nil {
			errs = append(errs, err)
		} else if err := os.Remove(c.SwapFile); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing swap file: %w", err))
		}
	}
	for name, v := range c.Sysctls {
		if err := os.WriteFile(sysctlPath(procfs, name), []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restoring %s to %s: %w", strings.ReplaceAll(name, "/", "."), v, err))
		}
	}
	return errs
}

// undoNotedHostChanges undoes what a killed run noted in its state directory.
func undoNotedHostChanges(p Paths, id string) (string, []error) {
	b, err := os.ReadFile(filepath.Join(p.State, id, hostChangesFile))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", []error{err}
	}
	var c hostChanges
	if err := json.Unmarshal(b, &c); err != nil {
		return "", []error{fmt.Errorf("reading %s: %w", hostChangesFile, err)}
	}
	var what []string
	if c.SwapFile != "" {
		what = append(what, "swap file "+c.SwapFile)
	}
	if c.SwapDevice != "" {
		what = append(what, "swap device "+c.SwapDevice+" (turned off)")
	}
	for name, v := range c.Sysctls {
		what = append(what, fmt.Sprintf("%s=%s", strings.ReplaceAll(name, "/", "."), v))
	}
	return strings.Join(what, ", "), undoHostChanges(p.Procfs, c)
}

// swapOff disables path if it is an active swap area; swapoff brings its pages back to memory,
// so stop what used it first.
func swapOff(procfs, path string) error {
	on, err := swapUsed(procfs, path)
	if err != nil {
		return err
	}
	if on < 0 {
		return nil
	}
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return err
	}
	if _, _, errno := unix.Syscall(unix.SYS_SWAPOFF, uintptr(unsafe.Pointer(p)), 0, 0); errno != 0 && errno != syscall.EINVAL {
		return fmt.Errorf("swapoff %s: %w", path, errno)
	}
	return nil
}

// swapUsed is how many bytes of the swap area path are in use, -1 if it is not active.
func swapUsed(procfs, path string) (int64, error) {
	b, err := os.ReadFile(filepath.Join(procfs, "swaps"))
	if err != nil {
		return 0, fmt.Errorf("reading swaps: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// Filename Type Size Used Priority, sizes in KiB.
		if len(f) >= 4 && f[0] == path {
			used, err := strconv.ParseInt(f[3], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parsing swaps: %w", err)
			}
			return used << 10, nil
		}
	}
	return -1, sc.Err()
}
