// Package tuner changes a node's settings all or nothing: it plans (current against desired),
// applies in order while recording what each setting was in a state file first, verifies each
// change, rolls back everything already applied when one fails, reports drift later, and
// restores exactly what it recorded. The settings themselves come from backends (sysctl,
// journald, kubelet, cpuset, swap) in the packages below this one.
package tuner

import (
	"context"
	"encoding/json"

	"github.com/nodectl/nodectl/host"
)

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
type Decoder func(h host.FS, spec json.RawMessage) (Setting, error)

// RestoreChecker is a setting whose value lists things that come and go on their own (the
// processes of a CPU partition, the pods below a cgroup), so that after Restore its Text
// need not equal the recorded one: it says itself whether what it recorded is back.
type RestoreChecker interface {
	// Restored reports whether prev is back; when not, why.
	Restored(ctx context.Context, prev Value) (ok bool, why string, err error)
}

// Merger is a setting that a re-apply after drift may change beyond what the first apply
// recorded (a daemon that started since, a new cgroup): the record must grow, keeping the
// earliest values, so that rollback restores those too.
type Merger interface {
	// Merge returns first (recorded by the first apply) extended with what now (read just
	// before the re-apply) holds that first does not.
	Merge(first, now Value) (Value, error)
}

// Finisher is a setting that can hold yet be unfinished: its file is written but the daemon
// that reads it has not restarted since, because the restart failed or nodectl died before
// it, and the setting itself restarts that daemon. Apply applies such a setting again, which
// finishes the restart.
type Finisher interface {
	Unfinished(ctx context.Context) (bool, error)
}
