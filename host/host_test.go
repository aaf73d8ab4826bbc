package host

import (
	"os"
	"path/filepath"
	"testing"
)

// Below a host root, absolute symlinks on the node resolve inside the root.
func TestPathStaysInsideTheRoot(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "mnt/log"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "var"), 0o755); err != nil {
		t.Fatal(err)
	}
	// As on the node: /var/log -> /mnt/log, /etc/link -> /etc/target (a file link, kept).
	if err := os.Symlink("/mnt/log", filepath.Join(root, "var/log")); err != nil {
		t.Fatal(err)
	}
	h := At(root)
	for _, tc := range []struct{ node, want string }{
		{"/var/log/journal", filepath.Join(root, "mnt/log/journal")},
		{"/var/log", filepath.Join(root, "var/log")}, // the last element is not resolved
		{"/etc/x.conf", filepath.Join(root, "etc/x.conf")},
		{"relative/x", filepath.Join(root, "relative/x")},
		{"/../../etc/passwd", filepath.Join(root, "etc/passwd")},
	} {
		if got := h.Path(tc.node); got != tc.want {
			t.Errorf("Path(%q) = %q, want %q", tc.node, got, tc.want)
		}
	}
	if got, err := h.Resolve("/var/log"); err != nil || got != filepath.Join(root, "mnt/log") {
		t.Errorf("Resolve(/var/log) = %q, %v; want %q", got, err, filepath.Join(root, "mnt/log"))
	}
	if got := At("/").Path("/etc/x"); got != "/etc/x" {
		t.Errorf("on / Path = %q", got)
	}
}
