// Package tuner changes a node's settings all or nothing: it plans (current against desired),
// applies in order while recording what each setting was in a state file first, verifies each
// change, rolls back everything already applied when one fails, reports drift later, and
// restores exactly what it recorded. The settings themselves come from backends (sysctl,
// journald, kubelet, cpuset, swap) in the packages below this one.
package tuner

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
)

// Host says where the node's files are, so a DaemonSet can work on /host and a test on a
// scratch tree. Procfs, Sysfs and Cgroupfs are separate because a test's scratch root still
// tunes the machine's real kernel.
type Host struct {
	Root     string // the node's root filesystem: /etc, /var, /run are below it
	Procfs   string
	Sysfs    string
	Cgroupfs string
}

// HostAt is the host whose root filesystem is root, with /proc and /sys below it.
func HostAt(root string) Host {
	root = filepath.Clean(root)
	return Host{Root: root, Procfs: filepath.Join(root, "proc"), Sysfs: filepath.Join(root, "sys"),
		Cgroupfs: filepath.Join(root, "sys/fs/cgroup")}
}

// Path is p (an absolute path on the node) below the host's root.
func (h Host) Path(p string) string { return filepath.Join(h.Root, p) }

// Systemd reports whether systemd is the node's init, as sd_booted(3) decides.
func (h Host) Systemd() bool {
	fi, err := os.Stat(h.Path("/run/systemd/system"))
	return err == nil && fi.IsDir()
}

// Value is what a setting reads as: the state file records it before a change and Restore
// puts it back.
type Value struct {
	// Present is false when the setting does not exist: no drop-in file, swap area off, no
	// mount. Restoring an absent value removes what apply made.
	Present bool `json:"present"`
	// Text is the value in the form Desired uses; equal texts mean the setting holds.
	Text string `json:"text"`
	// Data is what Restore needs beyond Text (a file's bytes and mode, the cgroups a process
	// was in), backend-specific.
	Data json.RawMessage `json:"data,omitempty"`
}

// Setting is one thing the tuner changes, reads back and undoes.
type Setting interface {
	// ID names the setting uniquely and stably, e.g. "sysctl:vm.swappiness".
	ID() string
	// Backend is the backend's name: sysctl, journald, journal-storage, kubelet, cpuset, swap.
	Backend() string
	// Desired is the Text the setting reads as once applied.
	Desired() string
	// Spec is the setting's parameters, JSON-encodable; the backend's Decode rebuilds the
	// setting from it, so rollback needs only the state file, not the profile.
	Spec() any
	// Read returns the setting's current value.
	Read(ctx context.Context) (Value, error)
	// Apply makes the setting hold. It may be called on a setting that partly holds.
	Apply(ctx context.Context) error
	// Restore puts prev back, removing what Apply made when prev is absent.
	Restore(ctx context.Context, prev Value) error
}

// Restarter is a setting that takes effect only when a daemon restarts.
type Restarter interface {
	// Restart names the daemon, e.g. "kubelet".
	Restart() string
	// Pending reports whether the daemon has not restarted since the setting was written.
	Pending(ctx context.Context) (bool, error)
}

// Noter is a setting with something to say about how it applies here, e.g. that journald is
// not reloaded because systemd does not run.
type Noter interface {
	Note() string
}

// Suspecter is a setting that can name who may have changed it when it drifts: a sysctl.d
// file setting the observed value, a later drop-in, a process known to tune the node.
type Suspecter interface {
	Suspects(ctx context.Context, got Value) []string
}

// Decoder rebuilds a backend's setting from the Spec recorded in a state file.
type Decoder func(h Host, spec json.RawMessage) (Setting, error)
