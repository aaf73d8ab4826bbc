package launch

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodectl/nodectl/stress/workload"
)

// The test binary doubles as a workload: with this variable set it waits for the launcher's go,
// prints one measurement carrying the time it started, and runs until SIGTERM.
const childEnv = "NODECTL_LAUNCH_TEST_CHILD"

// With childEchoEnv set the child also reads a line from its input and reports its length; with
// childMountEnv it writes a file in that directory.
const (
	childEchoEnv  = "NODECTL_LAUNCH_TEST_ECHO"
	childMountEnv = "NODECTL_LAUNCH_TEST_MOUNT"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		defer stop()
		if err := WaitStart(ctx); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		if dir := os.Getenv(childMountEnv); dir != "" {
			if err := os.WriteFile(filepath.Join(dir, "written"), []byte("x"), 0o644); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(3)
			}
		}
		out := json.NewEncoder(os.Stdout)
		_ = out.Encode(workload.Measurement{T: time.Now(), Metric: "started", Value: 1})
		if os.Getenv(childEchoEnv) == "1" {
			line, _ := bufio.NewReader(os.Stdin).ReadString('\n')
			_ = out.Encode(workload.Measurement{T: time.Now(), Metric: "echo", Value: float64(len(strings.TrimSpace(line)))})
		}
		<-ctx.Done()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// placer records when the launcher placed each pid; placing is slow on purpose, so a workload
// that started before being placed would show it.
type placer struct {
	mu     sync.Mutex
	placed map[int]time.Time
	fail   bool
}

func (p *placer) AddProc(_ string, pid int) error {
	if p.fail {
		return fmt.Errorf("no such cgroup")
	}
	time.Sleep(200 * time.Millisecond)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.placed[pid] = time.Now()
	return nil
}

func TestWorkloadStartsOnlyOncePlaced(t *testing.T) {
	t.Setenv(childEnv, "1")
	pl := &placer{placed: map[int]time.Time{}}
	got := make(chan workload.Measurement, 1)
	p, err := Start(os.Args[0], pl, Spec{Name: "w", Cgroup: "/nodectl/x/w", Log: os.Stderr}, func(name string, m workload.Measurement) {
		if name == "w" {
			got <- m
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop(time.Second)
	var m workload.Measurement
	select {
	case m = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the workload's measurement never arrived")
	}
	pl.mu.Lock()
	placedAt, ok := pl.placed[p.cmd.Process.Pid]
	pl.mu.Unlock()
	if !ok {
		t.Fatal("the workload was never placed")
	}
	if m.T.Before(placedAt) {
		t.Errorf("the workload started %s before it was placed in its cgroup", placedAt.Sub(m.T))
	}
	p.Stop(5 * time.Second)
	select {
	case <-p.Done():
	default:
		t.Fatal("Stop returned before the workload exited")
	}
	if p.Err() != nil {
		t.Errorf("workload stopped with SIGTERM exited with %v, want a clean exit", p.Err())
	}
}

func TestFailedPlacementKillsTheWorkload(t *testing.T) {
	t.Setenv(childEnv, "1")
	_, err := Start(os.Args[0], &placer{fail: true}, Spec{Name: "w", Cgroup: "/nodectl/x/w", Log: os.Stderr}, nil)
	if err == nil {
		t.Fatal("Start succeeded although the workload could not be placed")
	}
}

func TestStopAllStopsTogether(t *testing.T) {
	t.Setenv(childEnv, "1")
	pl := &placer{placed: map[int]time.Time{}}
	var procs []*Process
	for i := range 3 {
		p, err := Start(os.Args[0], pl, Spec{Name: fmt.Sprint("w", i), Cgroup: "/nodectl/x/w", Log: os.Stderr}, nil)
		if err != nil {
			t.Fatal(err)
		}
		procs = append(procs, p)
	}
	StopAll(procs, 5*time.Second)
	for _, p := range procs {
		select {
		case <-p.Done():
		default:
			t.Fatalf("%s still runs after StopAll", p.Name)
		}
	}
}
