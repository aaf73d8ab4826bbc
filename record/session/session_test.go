package session

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodectl/nodectl/host"
	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/record/trace"
	"github.com/nodectl/nodectl/record/trace/cgnames"
	"github.com/nodectl/nodectl/rundir"
)

// memory is an Appender that keeps every batch.
type memory struct {
	mu      sync.Mutex
	batches [][]rundir.Record
}

func (m *memory) Append(recs ...rundir.Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.batches = append(m.batches, recs)
	return nil
}

func (m *memory) last() []rundir.Record {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.batches[len(m.batches)-1]
}

func count(recs []rundir.Record, metric, cg string) int {
	n := 0
	for _, r := range recs {
		if r.Metric == metric && r.Cgroup == cg {
			n++
		}
	}
	return n
}

// A session that is not told which cgroups to sample follows those the tracer sees: a real
// cgroup whose task keeps waking is traced, then sampled; once it is quiet its tracer series
// stop being recorded, as nothing changed.
func TestSessionFollowsTracedCgroupsAndRecordsChangesOnly(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: loads BPF programs and makes cgroups")
	}
	layout, err := cgroup.Detect(host.Default().Cgroupfs)
	if err != nil {
		t.Fatal(err)
	}
	cg := fmt.Sprintf("%s/session-test-%d-%08x", cgroup.Parent, os.Getpid(), rand.Uint32())
	if err := layout.Create(cg, cgroup.Limits{}); err != nil {
		t.Fatal(err)
	}
	waker := exec.Command("sh", "-c", "while :; do sleep 0.01; done")
	waker.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its sleeps die with it
	if err := waker.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		syscall.Kill(-waker.Process.Pid, syscall.SIGKILL)
		waker.Wait()
		// Quiet means no task left: a sleep still exiting would wait on the run queue again.
		procs := filepath.Join(layout.Dir(cgroup.CPU, cg), "cgroup.procs")
		for range 100 {
			if b, err := os.ReadFile(procs); err != nil || len(b) == 0 {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("%s still has tasks after its waker was killed", cg)
	}
	t.Cleanup(func() {
		stop()
		if err := layout.Remove(cg); err != nil {
			t.Error(err)
		}
		if err := layout.Prune(cgroup.Parent); err != nil {
			t.Error(err)
		}
	})
	if err := layout.AddProc(cg, waker.Process.Pid); err != nil {
		t.Fatal(err)
	}

	out := &memory{}
	s, err := New(Config{Host: host.Default(), Layout: layout, Trace: true, Programs: []string{trace.ProgramRunq}}, out)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if st := s.TracerStatus(); len(st) != 1 || st[trace.ProgramRunq] != rundir.TracerAttached {
		t.Fatalf("tracer status %v, want runq attached and nothing else", st)
	}
	snapshot := func() []rundir.Record {
		t.Helper()
		if err := s.Snapshot(time.Now()); err != nil {
			t.Fatal(err)
		}
		return out.last()
	}
	snapshot()
	time.Sleep(500 * time.Millisecond)
	if n := count(snapshot(), rundir.MetricRunqLatency, cg); n != 1 {
		t.Fatalf("%d run-queue latency records of the waking cgroup, want 1", n)
	}
	// Seen by the tracer, the cgroup is now sampled too.
	if n := count(snapshot(), rundir.MetricCPUUsage, cg); n != 1 {
		t.Errorf("%d CPU usage records of the followed cgroup, want 1", n)
	}

	stop()
	snapshot() // the waker's last waits
	if n := count(snapshot(), rundir.MetricRunqLatency, cg); n != 0 {
		t.Errorf("a quiet cgroup's unchanged run-queue latency was recorded again (%d records)", n)
	}
}

// CgroupExists answers the looks of one collection with one stat a cgroup, or none for one a
// followed resolver knows: a cgroup removed right after a look is still there for a look
// within existsFor, and gone for the next.
func TestCgroupExistsKeepsAnAnswerForOneCollection(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes cgroups")
	}
	layout, err := cgroup.Detect(host.Default().Cgroupfs)
	if err != nil {
		t.Fatal(err)
	}
	for _, followed := range []bool{false, true} {
		t.Run(map[bool]string{false: "stat", true: "followed"}[followed], func(t *testing.T) {
			var res *cgroup.Resolver
			if followed {
				names, err := cgnames.New(slog.Default())
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { names.Close() })
				res = cgroup.NewResolver(layout)
				if err := res.Follow(names.Feed); err != nil {
					t.Fatal(err)
				}
				_, done := res.Sweep(cgroup.CPU) // walks the hierarchy: the feed says the rest
				done()
			}
			cg := fmt.Sprintf("%s/exists-test-%d-%08x", cgroup.Parent, os.Getpid(), rand.Uint32())
			if err := layout.Create(cg, cgroup.Limits{}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := layout.Remove(cg); err != nil {
					t.Error(err)
				}
				if err := layout.Prune(cgroup.Parent); err != nil {
					t.Error(err)
				}
			})
			if followed {
				if live, ok := res.LivePaths(cgroup.CPU); !ok || !live[cg] {
					t.Fatalf("the followed resolver does not know %s (it follows: %v)", cg, ok)
				}
			}
			exists := CgroupExists(layout, res)
			if !exists(cg) {
				t.Fatalf("%s: not there after it was made", cg)
			}
			if err := layout.Remove(cg); err != nil {
				t.Fatal(err)
			}
			if !exists(cg) {
				t.Errorf("%s: gone within the look that found it, want the answer kept for %s", cg, existsFor)
			}
			time.Sleep(existsFor + 100*time.Millisecond)
			if exists(cg) {
				t.Errorf("%s: still there %s after it was removed", cg, existsFor)
			}
		})
	}
}
