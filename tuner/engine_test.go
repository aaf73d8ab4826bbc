package tuner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// node is a fake node: settings are keys in a map, absent keys are absent settings.
type node map[string]string

type fakeSpec struct {
	Key, Want string
}

// fake is a setting on a fake node; fail makes Apply leave it half-changed and fail.
type fake struct {
	n    node
	spec fakeSpec
	fail bool
}

func (f *fake) ID() string      { return "fake:" + f.spec.Key }
func (f *fake) Backend() string { return "fake" }
func (f *fake) Desired() string { return f.spec.Want }
func (f *fake) Spec() any       { return f.spec }
func (f *fake) Read(context.Context) (Value, error) {
	v, ok := f.n[f.spec.Key]
	return Value{Present: ok, Text: v}, nil
}
func (f *fake) Apply(context.Context) error {
	if f.fail {
		f.n[f.spec.Key] = "half"
		return errors.New("refused")
	}
	f.n[f.spec.Key] = f.spec.Want
	return nil
}
func (f *fake) Restore(_ context.Context, prev Value) error {
	if !prev.Present {
		delete(f.n, f.spec.Key)
		return nil
	}
	f.n[f.spec.Key] = prev.Text
	return nil
}

func engine(t *testing.T, n node, wants ...string) *Engine {
	t.Helper()
	e := &Engine{Profile: "test", State: filepath.Join(t.TempDir(), "state.json")}
	for i := 0; i+1 < len(wants); i += 2 {
		e.Settings = append(e.Settings, &fake{n: n, spec: fakeSpec{wants[i], wants[i+1]}})
	}
	e.Decode = func(backend string, spec json.RawMessage) (Setting, error) {
		var s fakeSpec
		if err := json.Unmarshal(spec, &s); err != nil {
			return nil, err
		}
		return &fake{n: n, spec: s}, nil
	}
	return e
}

func clone(n node) node {
	c := node{}
	for k, v := range n {
		c[k] = v
	}
	return c
}

func TestApplyVerifyRollback(t *testing.T) {
	ctx := context.Background()
	n := node{"a": "1", "b": "2"}
	before := clone(n)
	e := engine(t, n, "a", "10", "b", "2", "c", "30")

	plan, err := e.Current(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	var changes []string
	for _, it := range plan {
		if it.Change {
			changes = append(changes, it.ID)
		}
	}
	if !reflect.DeepEqual(changes, []string{"fake:a", "fake:c"}) {
		t.Fatalf("plan changes %v, want a and c", changes)
	}
	res, err := e.Apply(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(res.Changed, []string{"fake:a", "fake:c"}) || !reflect.DeepEqual(res.Held, []string{"fake:b"}) {
		t.Fatalf("apply result %+v", res)
	}
	if !reflect.DeepEqual(n, node{"a": "10", "b": "2", "c": "30"}) {
		t.Fatalf("node after apply %v", n)
	}
	st, err := LoadState(e.State)
	if err != nil || st == nil || !st.Complete() {
		t.Fatalf("state after apply %+v, %v", st, err)
	}

	// A second apply changes nothing, the state file included.
	raw, _ := os.ReadFile(e.State)
	if res, err := e.Apply(ctx); err != nil || len(res.Changed) != 0 {
		t.Fatalf("second apply: %+v, %v", res, err)
	}
	if raw2, _ := os.ReadFile(e.State); string(raw) != string(raw2) {
		t.Fatal("second apply rewrote the state file")
	}

	// Drift, then a re-apply that fixes it and keeps the first apply's record.
	n["a"] = "99"
	items, _ := e.Current(ctx, true)
	if !items[0].Change || items[0].Current != "99" {
		t.Fatalf("drift not seen: %+v", items[0])
	}
	if res, err := e.Apply(ctx); err != nil || !reflect.DeepEqual(res.Changed, []string{"fake:a"}) {
		t.Fatalf("re-apply: %+v, %v", res, err)
	}

	rb, err := e.Rollback(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(rb.Restored, []string{"fake:c", "fake:a"}) {
		t.Fatalf("restored %v, want c then a", rb.Restored)
	}
	if !reflect.DeepEqual(n, before) {
		t.Fatalf("node after rollback %v, want %v", n, before)
	}
	if _, err := os.Stat(e.State); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("state file left after rollback")
	}
	if _, err := os.Stat(e.State + ".lock"); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("lock file left after rollback")
	}
	if _, err := e.Rollback(ctx); err == nil {
		t.Fatal("rollback without state succeeded")
	}
}

// Every failure at every step of every setting leaves the node and the state file as they
// were before apply: first apply (no state) and re-apply over a drifted node (a state).
func TestApplyFailureLeavesNodeAsItWas(t *testing.T) {
	ctx := context.Background()
	ids := []string{"fake:a", "fake:b", "fake:c"}
	for _, reapply := range []bool{false, true} {
		for _, step := range []Step{StepRead, StepRecord, StepApply, StepVerify} {
			for _, id := range ids {
				name := fmt.Sprintf("reapply_%v/%s/%s", reapply, step, id)
				t.Run(name, func(t *testing.T) {
					n := node{"a": "1", "b": "2"}
					e := engine(t, n, "a", "10", "b", "20", "c", "30")
					var stateBefore []byte
					if reapply {
						if _, err := e.Apply(ctx); err != nil {
							t.Fatal(err)
						}
						n["a"], n["c"] = "drifted", "drifted"
						delete(n, "b")
						stateBefore, _ = os.ReadFile(e.State)
					}
					before := clone(n)
					e.Fault = func(s Step, at string) error {
						if s == step && (at == id || s == StepRecord) {
							return errors.New("injected")
						}
						return nil
					}
					if _, err := e.Apply(ctx); err == nil {
						t.Fatal("apply succeeded despite the fault")
					}
					if !reflect.DeepEqual(n, before) {
						t.Fatalf("node %v, want %v", n, before)
					}
					got, err := os.ReadFile(e.State)
					if reapply && string(got) != string(stateBefore) {
						t.Fatalf("state file changed:\n%s\nwant\n%s (%v)", got, stateBefore, err)
					}
					if !reapply && !errors.Is(err, os.ErrNotExist) {
						t.Fatalf("state file left: %s", got)
					}
				})
			}
		}
	}
}

func TestApplyHalfDoneSettingIsRestored(t *testing.T) {
	n := node{"a": "1"}
	before := clone(n)
	e := engine(t, n, "a", "10", "b", "20")
	e.Settings[1].(*fake).fail = true
	_, err := e.Apply(context.Background())
	if err == nil {
		t.Fatal("apply succeeded")
	}
	if !reflect.DeepEqual(n, before) {
		t.Fatalf("node %v, want %v (%v)", n, before, err)
	}
}

func TestOtherProfileRefused(t *testing.T) {
	ctx := context.Background()
	n := node{}
	e := engine(t, n, "a", "1")
	if _, err := e.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	other := engine(t, n, "a", "2")
	other.State = e.State
	if _, err := other.Apply(ctx); !errors.Is(err, ErrOtherProfile) {
		t.Fatalf("apply of another profile: %v", err)
	}
	if n["a"] != "1" {
		t.Fatal("refused apply changed the node")
	}
}

// A restore that fails keeps its setting in the state file; a second rollback finishes.
func TestRollbackFailureKeepsWhatIsLeft(t *testing.T) {
	ctx := context.Background()
	n := node{"a": "1", "b": "2"}
	before := clone(n)
	e := engine(t, n, "a", "10", "b", "20")
	if _, err := e.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	e.Fault = func(s Step, id string) error {
		if s == StepRestore && id == "fake:a" {
			return errors.New("injected")
		}
		return nil
	}
	if _, err := e.Rollback(ctx); err == nil || !strings.HasSuffix(err.Error(), "run nodectl tune rollback again") {
		t.Fatalf("rollback despite the fault: %v; want an error naming tune rollback", err)
	}
	// An engine on another state file names the command that rolls that one back.
	e.RollbackCommand = "nodectl stress clean density-1"
	if _, err := e.Rollback(ctx); err == nil || !strings.HasSuffix(err.Error(), "run nodectl stress clean density-1 again") {
		t.Fatalf("rollback despite the fault: %v; want an error naming the engine's command", err)
	}
	st, err := LoadState(e.State)
	if err != nil || st == nil || len(st.Settings) != 1 || st.Settings[0].ID != "fake:a" {
		t.Fatalf("state after failed rollback: %+v, %v", st, err)
	}
	e.Fault = nil
	if _, err := e.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(n, before) {
		t.Fatalf("node %v, want %v", n, before)
	}
}

// An apply that died half-way is refused until rolled back; rollback restores what it changed.
func TestUnfinishedApplyIsRolledBack(t *testing.T) {
	ctx := context.Background()
	n := node{"a": "1"}
	before := clone(n)
	e := engine(t, n, "a", "10", "b", "20")
	st := &State{Version: StateVersion, Profile: "test", Digest: e.Digest()}
	for _, s := range e.Settings {
		v, _ := s.Read(ctx)
		spec, _ := json.Marshal(s.Spec())
		st.Settings = append(st.Settings, Record{ID: s.ID(), Backend: s.Backend(), Spec: spec, Desired: s.Desired(), Previous: v})
	}
	st.Settings[0].Changed = true
	if err := st.save(e.State); err != nil {
		t.Fatal(err)
	}
	n["a"] = "10" // the crash came after the first apply
	if _, err := e.Apply(ctx); !errors.Is(err, ErrUnfinished) {
		t.Fatalf("apply over an unfinished one: %v", err)
	}
	if _, err := e.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(n, before) {
		t.Fatalf("node %v, want %v", n, before)
	}
}

// Ctrl-C during apply undoes what was applied: all or nothing.
func TestInterruptedApplyIsUndone(t *testing.T) {
	n := node{"a": "1", "b": "2"}
	before := clone(n)
	e := engine(t, n, "a", "10", "b", "20", "c", "30")
	ctx, cancel := context.WithCancelCause(context.Background())
	e.Fault = func(s Step, id string) error {
		if s == StepVerify && id == "fake:b" {
			cancel(errors.New("received interrupt"))
		}
		return nil
	}
	_, err := e.Apply(ctx)
	if err == nil || !strings.Contains(err.Error(), "received interrupt") {
		t.Fatalf("interrupted apply: %v", err)
	}
	if !reflect.DeepEqual(n, before) {
		t.Fatalf("node %v, want %v", n, before)
	}
	if _, err := os.Stat(e.State); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("interrupted apply left a state file")
	}
}

// procs is a fake partition: its text lists "processes" that come and go, so only a
// RestoreChecker can tell it was restored, and a re-apply may confine new ones (Merger).
type procs struct {
	fake
	moved map[string]bool // process -> confined
}

func (p *procs) Read(ctx context.Context) (Value, error) {
	v, _ := p.fake.Read(ctx)
	var outside []string
	for name, in := range p.moved {
		if !in {
			outside = append(outside, name)
		}
	}
	slices.Sort(outside)
	if len(outside) > 0 {
		v.Text = strings.Join(outside, ",") + " outside"
	}
	data, _ := json.Marshal(outside)
	v.Data = data
	return v, nil
}

func (p *procs) Apply(ctx context.Context) error {
	for name := range p.moved {
		p.moved[name] = true
	}
	return p.fake.Apply(ctx)
}

func (p *procs) Restore(ctx context.Context, prev Value) error {
	var outside []string
	_ = json.Unmarshal(prev.Data, &outside)
	for _, name := range outside {
		if _, alive := p.moved[name]; alive {
			p.moved[name] = false
		}
	}
	return p.fake.Restore(ctx, Value{Present: prev.Present, Text: p.spec.Key})
}

func (p *procs) Restored(_ context.Context, prev Value) (bool, string, error) {
	var outside []string
	_ = json.Unmarshal(prev.Data, &outside)
	for _, name := range outside {
		if in, alive := p.moved[name]; alive && in {
			return false, name + " still confined", nil
		}
	}
	return true, "", nil
}

func (p *procs) Merge(first, now Value) (Value, error) {
	var a, b []string
	_ = json.Unmarshal(first.Data, &a)
	_ = json.Unmarshal(now.Data, &b)
	for _, n := range b {
		if !slices.Contains(a, n) {
			a = append(a, n)
		}
	}
	first.Data, _ = json.Marshal(a)
	return first, nil
}

// A setting whose text changes on its own is restored by its own check; a re-apply that
// confines a new process records it, and rollback releases it too.
func TestRestoreCheckerAndMerger(t *testing.T) {
	ctx := context.Background()
	n := node{"p": "p"}
	p := &procs{fake: fake{n: n, spec: fakeSpec{"p", "all in"}}, moved: map[string]bool{"kubelet[1]": false}}
	e := engine(t, n)
	e.Settings = []Setting{p}
	e.Decode = func(string, json.RawMessage) (Setting, error) { return p, nil }
	if _, err := e.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	// The kubelet restarts (a new pid) and a containerd appears: drift, and a re-apply.
	delete(p.moved, "kubelet[1]")
	p.moved["kubelet[2]"], p.moved["containerd[3]"] = false, false
	if _, err := e.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Rollback(ctx); err != nil {
		t.Fatalf("rollback of a setting whose text moved on: %v", err)
	}
	for name, in := range p.moved {
		if in {
			t.Errorf("%s still confined after rollback", name)
		}
	}
}

// unfinished is a setting whose file holds but whose daemon still owes a restart.
type unfinished struct {
	fake
	owed     bool
	restarts int
}

func (u *unfinished) Unfinished(context.Context) (bool, error) { return u.owed, nil }
func (u *unfinished) Apply(ctx context.Context) error {
	if u.owed {
		u.restarts++
		u.owed = false
	}
	return u.fake.Apply(ctx)
}

// A re-apply finishes a restart an earlier apply owed, and only then.
func TestReapplyFinishesAnOwedRestart(t *testing.T) {
	ctx := context.Background()
	n := node{"conf": "old"}
	u := &unfinished{fake: fake{n: n, spec: fakeSpec{"conf", "new"}}}
	e := engine(t, n)
	e.Settings = []Setting{u}
	if _, err := e.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	u.owed = true // the restart after the write failed
	res, err := e.Apply(ctx)
	if err != nil || u.restarts != 1 || !reflect.DeepEqual(res.Changed, []string{"fake:conf"}) {
		t.Fatalf("re-apply with a restart owed: %+v, %v, %d restarts", res, err, u.restarts)
	}
	if res, err := e.Apply(ctx); err != nil || len(res.Changed) != 0 || u.restarts != 1 {
		t.Fatalf("re-apply with nothing owed: %+v, %v, %d restarts", res, err, u.restarts)
	}
}

// The state file's directories that apply made go with rollback; ones that were there stay.
func TestRollbackRemovesTheStateDirectoriesApplyMade(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	n := node{}
	e := engine(t, n, "a", "1")
	e.State = filepath.Join(root, "var/lib/nodectl/tune/state.json")
	if err := os.MkdirAll(filepath.Join(root, "var"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(filepath.Join(root, "var"))
	if len(ents) != 0 {
		t.Errorf("rollback left %v in var", ents)
	}
	if _, err := os.Stat(filepath.Join(root, "var")); err != nil {
		t.Error("rollback removed a directory that was there before apply")
	}
}
