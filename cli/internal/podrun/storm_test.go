package podrun

import (
	"slices"
	"testing"
)

func TestLineWriterSplitsLines(t *testing.T) {
	var got []string
	w := &lineWriter{fn: func(b []byte) { got = append(got, string(b)) }}
	for _, part := range []string{"a", "b\nc", "\n\nd"} {
		if n, err := w.Write([]byte(part)); err != nil || n != len(part) {
			t.Fatalf("Write(%q) = %d, %v", part, n, err)
		}
	}
	if !slices.Equal(got, []string{"ab", "c", ""}) || string(w.buf) != "d" {
		t.Errorf("lines %q, left %q", got, w.buf)
	}
}
