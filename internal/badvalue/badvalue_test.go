package badvalue

import (
	"errors"
	"fmt"
	"testing"
)

func TestNamesTheFieldUntilTheCLINamesTheFlag(t *testing.T) {
	err := fmt.Errorf("planning the run: %w", Errorf("Hogs", "gpu", "unknown kind %q", "gpu"))
	if got, want := err.Error(), `planning the run: Hogs gpu: unknown kind "gpu"`; got != want {
		t.Errorf("before naming: %q, want %q", got, want)
	}
	err = Name(err, map[string]string{"Hogs": "--hog"})
	if got, want := err.Error(), `planning the run: --hog gpu: unknown kind "gpu"`; got != want {
		t.Errorf("after naming: %q, want %q", got, want)
	}
	if !Is(err, "Hogs") || Is(err, "Runtime") {
		t.Error("Is does not tell the field")
	}
}

func TestNameWalksJoinedErrors(t *testing.T) {
	a, b := New("Runtime", "", errors.New("runc is not installed")), New("Target", "/x", errors.New("not a directory"))
	err := errors.Join(a, fmt.Errorf("cleanup: %w", b))
	named := Name(err, map[string]string{"Runtime": "--runtime", "Target": "--target"})
	if got, want := named.Error(), "--runtime: runc is not installed\ncleanup: --target /x: not a directory"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
	if !errors.Is(named, a) {
		t.Error("the named error no longer unwraps to the original")
	}
}
