//go:build linux

package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodectl/nodectl/agent/recorded"
	"github.com/nodectl/nodectl/agent/rpc"
	agentv1 "github.com/nodectl/nodectl/api/agent/v1"
	"github.com/nodectl/nodectl/bench/internal/proc"
)

// daemonSetMemoryLimit is the agent container's memory limit in deploy/base.
const daemonSetMemoryLimit = 128 << 20

// Eight post-mortems of a 4-minute window of 1,000 cgroups asked of the agent at once: it
// analyzes one at a time and queues four (the rest are refused with RESOURCE_EXHAUSTED), and
// its peak resident set stays under the DaemonSet's memory limit. A post-mortem whose client
// gives up stops: the agent's CPU over the second after the first one after the cancellation
// is a small share of what an analysis takes.
func TestConcurrentPostmortemsStayBounded(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the agent's BPF programs")
	}
	if testing.Short() {
		t.Skip("writes 9 minutes of 1,000 cgroups and runs the agent")
	}
	dir := t.TempDir()
	bin, err := proc.Nodectl(dir)
	if err != nil {
		t.Fatal(err)
	}
	d := recorded.DefaultWindows
	to := time.Now().UTC().Truncate(time.Second).Add(-10 * time.Second)
	w := recorded.Window{BaselineFrom: to.Add(-4*time.Minute - d.Baseline), From: to.Add(-4 * time.Minute), To: to}
	st, err := writeWindow(filepath.Join(dir, "data"), w)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s of %d series (%.1f MB)", w.To.Sub(w.BaselineFrom), st.Series, float64(st.Bytes)/1e6)
	ag, err := proc.StartAgent(bin, dir, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := ag.Stop(); err != nil {
			t.Error(err)
		}
	}()
	c, closer, err := rpc.Dial(context.Background(), rpc.DialConfig{Socket: filepath.Join(dir, "agent.sock")})
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	req := &agentv1.AnalyzeRequest{From: timestamppb.New(w.From), To: timestamppb.New(w.To)}

	// The peak from here on (clear_refs 5 resets the high-water mark).
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", ag.Pid), []byte("5"), 0); err != nil {
		t.Fatal(err)
	}
	cpu0, err := proc.CPUTime(ag.Pid)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	codesOf := make([]codes.Code, 8)
	var wg sync.WaitGroup
	for i := range codesOf {
		wg.Go(func() {
			_, err := c.Analyze(context.Background(), req)
			codesOf[i] = status.Code(err)
			if err != nil && codesOf[i] != codes.ResourceExhausted {
				t.Errorf("post-mortem %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	wall := time.Since(start)
	cpu1, err := proc.CPUTime(ag.Pid)
	if err != nil {
		t.Fatal(err)
	}
	rss, peak, err := proc.Memory(ag.Pid)
	if err != nil {
		t.Fatal(err)
	}
	served := 0
	for _, code := range codesOf {
		if code == codes.OK {
			served++
		}
	}
	rate := (cpu1 - cpu0).Seconds() / wall.Seconds()
	t.Logf("8 post-mortems at once: %d served, %d refused in %s; the agent used %.2f CPU-s (%.0f%% of a CPU); RSS %.1f MiB, peak %.1f MiB (limit %d MiB)",
		served, len(codesOf)-served, wall.Round(time.Millisecond), (cpu1 - cpu0).Seconds(), 100*rate, float64(rss)/(1<<20), float64(peak)/(1<<20), daemonSetMemoryLimit>>20)
	if served == 0 || served == len(codesOf) {
		t.Errorf("%d of %d post-mortems served: want some served and the rest refused", served, len(codesOf))
	}
	if peak > daemonSetMemoryLimit {
		t.Errorf("the agent peaked at %.1f MiB, over the DaemonSet's %d MiB limit", float64(peak)/(1<<20), daemonSetMemoryLimit>>20)
	}

	// A post-mortem given up on after a quarter of an analysis.
	give := max(wall/time.Duration(4*served), 50*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), give)
	_, err = c.Analyze(ctx, req)
	cancel()
	if code := status.Code(err); code != codes.DeadlineExceeded && code != codes.Canceled {
		t.Fatalf("a post-mortem given up on after %s: %v, want it cut short", give, err)
	}
	time.Sleep(time.Second)
	a, err := proc.CPUTime(ag.Pid)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	b, err := proc.CPUTime(ag.Pid)
	if err != nil {
		t.Fatal(err)
	}
	after := (b - a).Seconds()
	t.Logf("given up on after %s: the agent used %.3f CPU-s over the second after the next, against %.2f a second analyzing", give, after, rate)
	if after > 0.1*rate {
		t.Errorf("the agent used %.3f CPU-s a second after the post-mortem was given up on, over a tenth of the %.2f it uses analyzing", after, rate)
	}
}
