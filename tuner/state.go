package tuner

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nodectl/nodectl/host"
	"github.com/nodectl/nodectl/internal/atomicfile"
)

// StateVersion is the version of the state file's format.
const StateVersion = 1

// DefaultStateFile is where the state file lives on the node, below the host root.
const DefaultStateFile = "/var/lib/nodectl/tune/state.json"

// State is what apply recorded: the profile and, per setting, its value before apply. It is
// written before the first change and after each one, so a crash leaves enough to roll back.
type State struct {
	Version int    `json:"version"`
	Profile string `json:"profile"`
	// Digest identifies the desired settings; applying a different profile over this one is
	// refused until it is rolled back.
	Digest   string    `json:"digest"`
	Started  time.Time `json:"started_at"`
	Finished time.Time `json:"applied_at,omitzero"` // zero while an apply runs or after it died
	// Dirs are the state file's directories the first apply made (absolute, outermost
	// first); rollback removes them with the state file.
	Dirs     []string `json:"created_dirs,omitempty"`
	Settings []Record `json:"settings"`
}

// Record is one setting in the state file.
type Record struct {
	ID       string          `json:"id"`
	Backend  string          `json:"backend"`
	Spec     json.RawMessage `json:"spec"`
	Desired  string          `json:"desired"`
	Previous Value           `json:"previous"`
	// Changed is set before the setting is applied and stays set: rollback restores every
	// changed setting, including one whose apply was cut short.
	Changed bool      `json:"changed"`
	At      time.Time `json:"changed_at,omitzero"`
}

// Complete reports whether the apply that wrote s finished.
func (s *State) Complete() bool { return !s.Finished.IsZero() }

// LoadState reads the state file at path; a missing file is (nil, nil).
func LoadState(path string) (*State, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading tune state: %w", err)
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("reading tune state %s: %w", path, err)
	}
	if s.Version != StateVersion {
		return nil, fmt.Errorf("reading tune state %s: version %d, this nodectl reads version %d", path, s.Version, StateVersion)
	}
	return &s, nil
}

// save writes s to path atomically and durably: a crash leaves the old or the new file whole.
func (s *State) save(path string) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding tune state: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("writing tune state: %w", err)
	}
	if err := atomicfile.Write(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing tune state %s: %w", path, err)
	}
	return nil
}

// removeState deletes the state file durably.
func removeState(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing tune state: %w", err)
	}
	return atomicfile.SyncDir(filepath.Dir(path))
}

// stateLock is an exclusive lock beside the state file, so two tuners (a DaemonSet and a
// person) never interleave.
type stateLock struct {
	f         *os.File
	statePath string
	// created are the state file's directories that taking the lock made (absolute paths,
	// outermost first): a first apply records them, so rollback removes them too.
	created []string
}

// lock takes the lock; it fails at once rather than wait.
func lock(statePath string) (*stateLock, error) {
	lockPath := statePath + ".lock"
	node := host.FS{Root: "/"}
	// The holder removes the lock file when nothing is applied; a tuner that opened it just
	// before then holds a lock on a file no longer there, so it checks and opens again.
	for range 5 {
		created := node.MissingDirs(filepath.Dir(statePath))
		if err := os.MkdirAll(filepath.Dir(statePath), 0o755); err != nil {
			return nil, fmt.Errorf("locking tune state: %w", err)
		}
		f, err := os.OpenFile(lockPath, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return nil, fmt.Errorf("locking tune state: %w", err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, fmt.Errorf("another nodectl tune is running on this node (lock %s)", lockPath)
			}
			return nil, fmt.Errorf("locking tune state: %w", err)
		}
		held, err1 := f.Stat()
		now, err2 := os.Stat(lockPath)
		if err1 != nil || err2 != nil || !os.SameFile(held, now) {
			f.Close()
			continue
		}
		return &stateLock{f: f, statePath: statePath, created: created}, nil
	}
	return nil, fmt.Errorf("locking tune state: %s keeps being replaced", lockPath)
}

// release drops the lock. With nothing applied it leaves nothing behind: the lock file goes
// (removed while still held), and so do the directories this lock made and those in made (a
// first apply's, from the state file), when empty.
func (l *stateLock) release(made []string) {
	defer l.f.Close()
	if _, err := os.Stat(l.statePath); !errors.Is(err, os.ErrNotExist) {
		return
	}
	os.Remove(l.statePath + ".lock")
	node := host.FS{Root: "/"}
	_ = node.RemoveDirs(l.created)
	_ = node.RemoveDirs(made)
}
