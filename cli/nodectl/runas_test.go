package main

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// With --run-as the agent gives up root after start: every thread runs as that uid and gid
// with CAP_BPF and CAP_PERFMON alone, its programs attached, and it records into its data
// directory, which it now owns.
func TestAgentRunsAsAnotherUser(t *testing.T) {
	requireRoot(t)
	// Directories of their own in /tmp: the user must reach them (a test's TempDir sits in a
	// directory only root may enter).
	data, err := os.MkdirTemp("", "nodectl-runas-data-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(data) })
	a := startAgent(t, data, "--run-as", "65532:65532", "--interval", "200ms")

	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", a.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"Uid:": "65532\t65532\t65532\t65532", "Gid:": "65532\t65532\t65532\t65532",
		"CapEff:": fmt.Sprintf("%016x", uint64(1)<<39|1<<38), "CapPrm:": fmt.Sprintf("%016x", uint64(1)<<39|1<<38)}
	for _, l := range strings.Split(string(status), "\n") {
		field, v, _ := strings.Cut(l, "\t")
		if w, ok := want[field]; ok && strings.TrimSpace(v) != w {
			t.Errorf("%s %s, want %s", field, v, w)
		}
	}
	// Every thread: a thread left as root would be root in the same process.
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", a.cmd.Process.Pid))
	if err != nil || len(tasks) == 0 {
		t.Fatalf("threads %v: %v", tasks, err)
	}
	for _, task := range tasks {
		b, err := os.ReadFile(task)
		if err == nil && !strings.Contains(string(b), "\nUid:\t65532\t65532\t65532\t65532\n") {
			t.Errorf("%s is not 65532:\n%s", task, b)
		}
	}

	time.Sleep(time.Second)
	checkRecording(t, a.sock, "as uid 65532")
	files := 0
	filepath.WalkDir(data, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if fi, err := d.Info(); err == nil {
			files++
			if st := fi.Sys().(*syscall.Stat_t); st.Uid != 65532 {
				t.Errorf("%s is uid %d's, want 65532's", p, st.Uid)
			}
		}
		return nil
	})
	if files < 2 {
		t.Errorf("%d files in the data directory: want the recorder's", files)
	}
}
