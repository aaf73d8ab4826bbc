package stress

import (
	"os"
	"path/filepath"
	"testing"
)

// Sysctls are noted before they change, and put back from the note: by the run, or by stress
// clean after a kill.
func TestHostChangesAreNotedAndUndone(t *testing.T) {
	p := Paths{Procfs: t.TempDir(), State: t.TempDir()}
	const id = "density-20260101-120000-a1b2c3"
	if err := os.MkdirAll(filepath.Join(p.Procfs, "sys/vm"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(p.State, id), 0o755); err != nil {
		t.Fatal(err)
	}
	sysctl := filepath.Join(p.Procfs, "sys/vm/swappiness")
	if err := os.WriteFile(sysctl, []byte("60\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h := &hostUndo{paths: p, id: id}
	if err := h.setSysctl("vm/swappiness", "100"); err != nil {
		t.Fatal(err)
	}
	if err := h.setSysctl("vm/swappiness", "90"); err != nil { // the first old value is kept
		t.Fatal(err)
	}
	// As after a kill: only the note is left.
	what, errs := undoNotedHostChanges(p, id)
	if len(errs) > 0 || what != "vm.swappiness=60" {
		t.Fatalf("undo: %q, %v", what, errs)
	}
	if b, _ := os.ReadFile(sysctl); string(b) != "60" {
		t.Errorf("vm.swappiness %q after undo, want 60", b)
	}
}
