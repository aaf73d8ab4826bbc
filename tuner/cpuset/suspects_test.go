package cpuset

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodectl/nodectl/host"

	"github.com/nodectl/nodectl/tuner"
)

func TestSuspectsNameWhoMayHaveMovedThePartition(t *testing.T) {
	root := t.TempDir()
	h := host.FS{Root: root, Procfs: "/proc", Sysfs: "/sys", Cgroupfs: "/sys/fs/cgroup"}
	s := &partition{h: h}
	got := s.Suspects(context.Background(), tuner.Value{Present: true, Text: "containerd[812] outside"})
	if len(got) == 0 || !strings.Contains(got[0], "started after the partition was applied") {
		t.Errorf("a daemon outside: suspects %q", got)
	}
	if err := os.MkdirAll(filepath.Join(root, "run/systemd/system"), 0o755); err != nil {
		t.Fatal(err)
	}
	got = s.Suspects(context.Background(), tuner.Value{Present: true, Text: "system 0-1 (system.slice)"})
	if len(got) == 0 || !strings.Contains(strings.Join(got, "\n"), "AllowedCPUs=") {
		t.Errorf("with systemd: suspects %q", got)
	}
}
