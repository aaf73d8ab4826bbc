package tuner

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Step names a stage of applying or restoring one setting; failures name it.
type Step string

const (
	StepRead    Step = "read"
	StepRecord  Step = "record"
	StepApply   Step = "apply"
	StepVerify  Step = "verify"
	StepRestore Step = "restore"
)

// Engine plans, applies, verifies and rolls back a set of settings against one state file.
type Engine struct {
	Profile  string    // profile name, recorded in the state file
	Settings []Setting // in apply order; rollback goes in reverse
	State    string    // state file path
	// Decode rebuilds a recorded setting by backend name, for rollback and verify without
	// the profile.
	Decode func(backend string, spec json.RawMessage) (Setting, error)
	Log    *slog.Logger
	// Fault, when set, is called before each step of each setting and a non-nil error is
	// taken as that step failing. Tests use it to prove every failure leaves the node as it
	// was.
	Fault func(step Step, id string) error
	Now   func() time.Time
	// Fresh makes Apply refuse a node where a profile is applied already, checked under the
	// lock: validate must not take over (and later roll back) another tuner's apply.
	Fresh bool
	// RollbackCommand is what a person runs to roll back State, which errors name when a
	// rollback is left to do; "" is nodectl tune rollback. An engine on another state file (a
	// stress run's) must name its own, or the advice would roll back the node's tuning.
	RollbackCommand string
}

func (e *Engine) rollbackCommand() string {
	if e.RollbackCommand != "" {
		return e.RollbackCommand
	}
	return "nodectl tune rollback"
}

func (e *Engine) fault(step Step, id string) error {
	if e.Fault == nil {
		return nil
	}
	return e.Fault(step, id)
}

func (e *Engine) now() time.Time {
	if e.Now != nil {
		return e.Now()
	}
	return time.Now().UTC()
}

func (e *Engine) log() *slog.Logger {
	if e.Log != nil {
		return e.Log
	}
	return slog.New(slog.DiscardHandler)
}

// Digest identifies the desired settings (ids, specs, desired values), independent of order.
func (e *Engine) Digest() string {
	h := sha256.New()
	for _, s := range e.Settings {
		spec, _ := json.Marshal(s.Spec())
		fmt.Fprintf(h, "%s\x00%s\x00%s\x00", s.ID(), spec, s.Desired())
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Item is one setting in a plan or a verification.
type Item struct {
	ID      string `json:"id"`
	Backend string `json:"backend"`
	Current string `json:"current"`
	Present bool   `json:"present"`
	Desired string `json:"desired"`
	// Change is true when the setting does not hold now: apply would change it, verify
	// calls it drift.
	Change bool `json:"change"`
	// Restart names what must restart for the setting to take effect; Pending says it has
	// not restarted since.
	Restart  string   `json:"restart,omitempty"`
	Pending  bool     `json:"pending,omitempty"`
	Note     string   `json:"note,omitempty"`
	Suspects []string `json:"suspects,omitempty"`
}

// holds reports whether v is what s wants.
func holds(s Setting, v Value) bool { return v.Present && v.Text == s.Desired() }

// Current reads every setting and says which differ from the desired value. It changes
// nothing; with suspects it also names who may have changed a differing setting.
func (e *Engine) Current(ctx context.Context, suspects bool) ([]Item, error) {
	items := make([]Item, 0, len(e.Settings))
	for _, s := range e.Settings {
		if err := e.fault(StepRead, s.ID()); err != nil {
			return nil, fmt.Errorf("reading %s: %w", s.ID(), err)
		}
		v, err := s.Read(ctx)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", s.ID(), err)
		}
		it := Item{ID: s.ID(), Backend: s.Backend(), Current: v.Text, Present: v.Present, Desired: s.Desired(), Change: !holds(s, v)}
		if n, ok := s.(Noter); ok {
			it.Note = n.Note()
		}
		if r, ok := s.(Restarter); ok {
			it.Restart = r.Restart()
			if v.Present && !it.Change {
				if it.Pending, err = r.Pending(ctx); err != nil {
					return nil, fmt.Errorf("reading %s: %w", s.ID(), err)
				}
			} else {
				it.Pending = true
			}
		}
		if suspects && it.Change {
			if sp, ok := s.(Suspecter); ok {
				it.Suspects = sp.Suspects(ctx, v)
			}
		}
		items = append(items, it)
	}
	return items, nil
}

// ErrOtherProfile is returned by Apply when the state file holds a different profile.
var ErrOtherProfile = errors.New("another profile is applied")

// ErrUnfinished is returned by Apply when an earlier apply died before finishing.
var ErrUnfinished = errors.New("an earlier apply did not finish")

// ApplyResult says what Apply did.
type ApplyResult struct {
	Changed []string `json:"changed"` // ids applied in this call
	Held    []string `json:"held"`    // ids that already held
}

// Apply makes every setting hold. It reads all of them first, records their values in the
// state file before changing any, then applies and verifies them in order. When one fails, or
// ctx is cancelled between two settings, every setting already changed is restored in reverse
// order and the state file is put back as it was; the error says what failed and whether the
// restore succeeded. Applying again a profile that is applied and holds changes nothing, the
// state file included.
func (e *Engine) Apply(ctx context.Context) (*ApplyResult, error) {
	lk, err := lock(e.State)
	if err != nil {
		return nil, err
	}
	defer lk.release(nil)
	old, err := LoadState(e.State)
	if err != nil {
		return nil, err
	}
	digest := e.Digest()
	if old != nil && e.Fresh {
		return nil, fmt.Errorf("%w: %q since %s, and this apply must start from an untuned node", ErrOtherProfile, old.Profile, old.Finished.Format(time.RFC3339))
	}
	if old != nil && !old.Complete() {
		return nil, fmt.Errorf("%w (state %s, started %s): run %s", ErrUnfinished, e.State, old.Started.Format(time.RFC3339), e.rollbackCommand())
	}
	if old != nil && old.Digest != digest {
		return nil, fmt.Errorf("%w: %q since %s; run %s first", ErrOtherProfile, old.Profile, old.Finished.Format(time.RFC3339), e.rollbackCommand())
	}

	// Read everything before changing anything.
	current := make([]Value, len(e.Settings))
	res := &ApplyResult{}
	var todo []int
	for i, s := range e.Settings {
		if err := e.fault(StepRead, s.ID()); err != nil {
			return nil, fmt.Errorf("reading %s: %w", s.ID(), err)
		}
		if current[i], err = s.Read(ctx); err != nil {
			return nil, fmt.Errorf("reading %s: %w", s.ID(), err)
		}
		done := holds(s, current[i])
		if f, ok := s.(Finisher); ok && done {
			unfinished, err := f.Unfinished(ctx)
			if err != nil {
				return nil, fmt.Errorf("reading %s: %w", s.ID(), err)
			}
			done = !unfinished
		}
		if done {
			res.Held = append(res.Held, s.ID())
		} else {
			todo = append(todo, i)
		}
	}
	if old != nil && len(todo) == 0 {
		return res, nil
	}

	// Record before changing. A re-apply keeps what the first apply recorded, so rollback
	// still goes back to the node before any tuning.
	st := &State{Version: StateVersion, Profile: e.Profile, Digest: digest, Started: e.now(), Dirs: lk.created}
	prev := map[string]Record{}
	if old != nil {
		st.Started, st.Dirs = old.Started, old.Dirs
		for _, r := range old.Settings {
			prev[r.ID] = r
		}
	}
	for i, s := range e.Settings {
		spec, err := json.Marshal(s.Spec())
		if err != nil {
			return nil, fmt.Errorf("recording %s: %w", s.ID(), err)
		}
		r, ok := prev[s.ID()]
		if !ok {
			r = Record{ID: s.ID(), Backend: s.Backend(), Previous: current[i]}
		} else if m, isMerger := s.(Merger); isMerger && !holds(s, current[i]) {
			if r.Previous, err = m.Merge(r.Previous, current[i]); err != nil {
				return nil, fmt.Errorf("recording %s: %w", s.ID(), err)
			}
		}
		r.Spec, r.Desired = spec, s.Desired()
		st.Settings = append(st.Settings, r)
	}
	if err := e.fault(StepRecord, ""); err != nil {
		return nil, fmt.Errorf("writing tune state: %w", err)
	}
	if err := st.save(e.State); err != nil {
		return nil, err
	}

	var changed []int // settings this call touched, for undoing
	fail := func(i int, step Step, cause error) (*ApplyResult, error) {
		err := fmt.Errorf("%s %s: %w", step, e.Settings[i].ID(), cause)
		// The undo runs to the end even when ctx was cancelled: half a rollback is worse.
		if uerr := e.undo(context.WithoutCancel(ctx), changed, current, old); uerr != nil {
			return nil, fmt.Errorf("%w; rolling back: %w", err, uerr)
		}
		return nil, fmt.Errorf("%w; everything applied so far was rolled back", err)
	}
	for _, i := range todo {
		s := e.Settings[i]
		if ctx.Err() != nil {
			// Interrupted (Ctrl-C): all or nothing, so undo what is done.
			return fail(i, StepApply, fmt.Errorf("interrupted before it was applied: %w", context.Cause(ctx)))
		}
		st.Settings[i].Changed, st.Settings[i].At = true, e.now()
		if err := st.save(e.State); err != nil {
			return fail(i, StepRecord, err)
		}
		changed = append(changed, i)
		if err := e.fault(StepApply, s.ID()); err != nil {
			return fail(i, StepApply, err)
		}
		if err := s.Apply(ctx); err != nil {
			return fail(i, StepApply, err)
		}
		if err := e.fault(StepVerify, s.ID()); err != nil {
			return fail(i, StepVerify, err)
		}
		v, err := s.Read(ctx)
		if err != nil {
			return fail(i, StepVerify, err)
		}
		if !holds(s, v) {
			return fail(i, StepVerify, fmt.Errorf("reads %q after apply, want %q", v.Text, s.Desired()))
		}
		e.log().Info("applied", "setting", s.ID(), "from", current[i].Text, "to", s.Desired())
		res.Changed = append(res.Changed, s.ID())
	}
	st.Finished = e.now()
	if err := st.save(e.State); err != nil {
		if len(todo) == 0 {
			// Nothing was changed: only the state file to take back.
			return nil, errors.Join(err, removeState(e.State))
		}
		return fail(todo[len(todo)-1], StepRecord, err)
	}
	return res, nil
}

// undo restores the settings at idx (in reverse) to what they read as when this apply began
// (for a first apply, what the state file recorded), then puts the state file back as it was
// before this apply: old, or none.
func (e *Engine) undo(ctx context.Context, idx []int, before []Value, old *State) error {
	var errs []error
	for k := len(idx) - 1; k >= 0; k-- {
		i := idx[k]
		if err := restore(ctx, e.Settings[i], before[i]); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		// The state file keeps recording what was changed, so rollback can finish the job.
		return fmt.Errorf("%w; the state file %s still records them: run %s", errors.Join(errs...), e.State, e.rollbackCommand())
	}
	if old != nil {
		return old.save(e.State)
	}
	return removeState(e.State)
}

// restore puts prev back into s and checks that it reads back: the same text, or for a
// RestoreChecker what it says.
func restore(ctx context.Context, s Setting, prev Value) error {
	if err := s.Restore(ctx, prev); err != nil {
		return fmt.Errorf("restoring %s: %w", s.ID(), err)
	}
	if rc, ok := s.(RestoreChecker); ok {
		back, why, err := rc.Restored(ctx, prev)
		if err != nil {
			return fmt.Errorf("restoring %s: reading back: %w", s.ID(), err)
		}
		if !back {
			return fmt.Errorf("restoring %s: not back as recorded: %s", s.ID(), why)
		}
		return nil
	}
	v, err := s.Read(ctx)
	if err != nil {
		return fmt.Errorf("restoring %s: reading back: %w", s.ID(), err)
	}
	if v.Present != prev.Present || v.Text != prev.Text {
		return fmt.Errorf("restoring %s: reads %s after restore, want %s", s.ID(), describe(v), describe(prev))
	}
	return nil
}

func describe(v Value) string {
	if !v.Present {
		return "absent"
	}
	return fmt.Sprintf("%q", v.Text)
}

// RollbackResult says what Rollback did.
type RollbackResult struct {
	Profile  string   `json:"profile"`
	Restored []string `json:"restored"`
}

// Rollback restores, in reverse order, every setting the state file records as changed, to
// the value recorded before apply, and removes the state file. It needs no profile: the
// settings are rebuilt from the state file. Settings that fail to restore stay recorded, so
// rollback can be run again; the others are dropped from the state file.
func (e *Engine) Rollback(ctx context.Context) (*RollbackResult, error) {
	lk, err := lock(e.State)
	if err != nil {
		return nil, err
	}
	var made []string
	defer func() { lk.release(made) }()
	st, err := LoadState(e.State)
	if err != nil {
		return nil, err
	}
	if st != nil {
		made = st.Dirs
	}
	if st == nil {
		return nil, fmt.Errorf("nothing to roll back: no tune state at %s", e.State)
	}
	res := &RollbackResult{Profile: st.Profile}
	keep := make([]bool, len(st.Settings))
	var errs []error
	for i := len(st.Settings) - 1; i >= 0; i-- {
		r := st.Settings[i]
		if !r.Changed {
			continue
		}
		s, err := e.Decode(r.Backend, r.Spec)
		if err == nil {
			err = e.fault(StepRestore, r.ID)
		}
		if err == nil {
			err = restore(ctx, s, r.Previous)
		}
		if err != nil {
			keep[i] = true
			errs = append(errs, err)
			continue
		}
		res.Restored = append(res.Restored, r.ID)
		e.log().Info("restored", "setting", r.ID, "to", describe(r.Previous))
	}
	if len(errs) == 0 {
		return res, removeState(e.State)
	}
	var left []Record
	for i, r := range st.Settings {
		if keep[i] {
			left = append(left, r)
		}
	}
	st.Settings = left
	if err := st.save(e.State); err != nil {
		errs = append(errs, err)
	}
	return res, fmt.Errorf("%w; the state file %s keeps the settings not restored: run %s again", errors.Join(errs...), e.State, e.rollbackCommand())
}

// Recorded rebuilds the settings a state file records, for verify and status without the
// profile.
func (e *Engine) Recorded(st *State) ([]Setting, error) {
	out := make([]Setting, 0, len(st.Settings))
	for _, r := range st.Settings {
		s, err := e.Decode(r.Backend, r.Spec)
		if err != nil {
			return nil, fmt.Errorf("reading tune state: setting %s: %w", r.ID, err)
		}
		out = append(out, s)
	}
	return out, nil
}
