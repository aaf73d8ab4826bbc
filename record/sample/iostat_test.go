//go:build linux

package sample

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/rundir"
)

// On cgroup v2 with the io and memory controllers (make test-vm boots one): a cgroup that
// writes and syncs 8 MiB has them in its io.stat, and the swap limit written to it is read
// back; on the hybrid hosts neither file exists.
func TestCgroupIOAndSwapLimit(t *testing.T) {
	l, parent := testParent(t, "io")
	if l.V1 {
		t.Skip("io.stat and memory.swap.max are v2's: this host has the cpu controller on v1")
	}
	cg := parent + "/writer"
	if err := l.Create(cg, cgroup.Limits{MemoryBytes: 64 << 20}); err != nil {
		t.Fatal(err)
	}
	dir := l.Dir(cgroup.Unified, cg)
	for _, f := range []string{"io.stat", "memory.swap.max"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatalf("a v2 cgroup with the io and memory controllers has no %s: %v", f, err)
		}
	}
	const swapMax = 32 << 20
	if err := os.WriteFile(filepath.Join(dir, "memory.swap.max"), []byte(fmt.Sprint(swapMax)), 0); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "data")
	dd := exec.Command("sh", "-c", "read x; exec dd if=/dev/zero of="+file+" bs=1M count=8 conv=fsync")
	stdin, err := dd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	dd.Stdout, dd.Stderr = &out, &out
	if err := dd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := l.AddProc(cg, dd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	stdin.Close() // dd's go: it is in the cgroup now
	if err := dd.Wait(); err != nil {
		t.Fatalf("dd: %v: %s", err, out.String())
	}

	recs, err := NewCgroups(l, func() []string { return []string{cg} }).SampleFull(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var written float64
	for _, r := range recs {
		if r.Metric == rundir.MetricCgroupIOBytes && r.Labels[rundir.LabelOp] == rundir.OpWrite && r.Value != nil {
			written += *r.Value
			t.Logf("%s wrote %.0f bytes to %s", cg, *r.Value, r.Labels[rundir.LabelDevice])
		}
	}
	if written < 8<<20 {
		t.Errorf("io.stat charges %.0f bytes written to the cgroup that wrote and synced 8 MiB", written)
	}
	if got := value(t, recs, cg, rundir.MetricMemorySwapLimit); got != swapMax {
		t.Errorf("swap limit %v, want %v", got, swapMax)
	}
}
