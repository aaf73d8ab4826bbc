package sample

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestRunDelaySumsThreads(t *testing.T) {
	proc := t.TempDir()
	for path, stat := range map[string]string{
		"10/task/10/schedstat": "5000 1500 3\n",
		"10/task/11/schedstat": "7000 2500 9\n",
		"20/task/20/schedstat": "1 1000000000 1\n",
	} {
		p := filepath.Join(proc, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(stat), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Pid 30 exited before it was read: skipped, not an error.
	got, err := RunDelay(proc, []int{10, 20, 30})
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Second + 4000*time.Nanosecond; got != want {
		t.Errorf("RunDelay = %v, want %v", got, want)
	}
}

func TestRunDelayRejectsGarbage(t *testing.T) {
	for name, stat := range map[string]string{"short": "5000\n", "not_a_number": "5000 x 1\n"} {
		t.Run(name, func(t *testing.T) {
			if _, err := parseRunDelay([]byte(stat)); err == nil {
				t.Errorf("parseRunDelay(%q) succeeded", stat)
			}
		})
	}
}

func TestRunDelayOfThisProcess(t *testing.T) {
	// Any live process has a schedstat; its wait can be zero, so only the read is checked.
	if _, err := RunDelay("/proc", []int{os.Getpid()}); err != nil {
		t.Fatal(err)
	}
}
