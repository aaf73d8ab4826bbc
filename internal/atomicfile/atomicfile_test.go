package atomicfile

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestWriteReplacesWholeWithExactMode(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, []byte("new"), 0o640); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil || string(b) != "new" {
		t.Fatalf("read %q, %v; want new", b, err)
	}
	st, _ := os.Stat(path)
	if st.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, want 0640", st.Mode().Perm())
	}
	assertOnly(t, dir, "state.json")
}

func TestAbortLeavesTheOldFileAndNoTemporary(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "seg")
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := Create(path, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("half")); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	pending := 0
	for _, e := range entries {
		if Pending(e.Name()) {
			pending++
		}
	}
	if pending != 1 {
		t.Errorf("%d pending replacements while writing, want 1 (names %v)", pending, entries)
	}
	f.Abort()
	b, _ := os.ReadFile(path)
	if string(b) != "old" {
		t.Errorf("after Abort the file holds %q, want old", b)
	}
	assertOnly(t, dir, "seg")
}

func TestCreateRemovesWhatACrashLeftOfThatFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "pins.json")
	for _, name := range []string{".pins.json123", ".pins.json-77", ".other.json5", ".pins.jsonx"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := Write(path, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	var names []string
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{".other.json5", ".pins.jsonx", "pins.json"}; !slices.Equal(names, want) {
		t.Errorf("directory holds %v, want %v: the crashed replacements of pins.json gone, the rest kept", names, want)
	}
}

func TestCommitIntoAMissingDirectoryFails(t *testing.T) {
	_, err := Create(filepath.Join(t.TempDir(), "gone", "f"), 0o600)
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Create in a missing directory: %v, want not exist", err)
	}
}

func assertOnly(t *testing.T, dir, name string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != name {
		t.Errorf("directory holds %v, want only %s", entries, name)
	}
}
