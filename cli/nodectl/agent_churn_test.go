package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nodectl/nodectl/host/cgroup"
)

// agentStatus is what the churn test reads of `agent status -o json`.
type agentStatus struct {
	TrackedCgroups string `json:"trackedCgroups"`
	RSSBytes       string `json:"rssBytes"`
	Maps           []struct {
		Program string  `json:"program"`
		Fill    float64 `json:"fill"`
	} `json:"maps"`
}

func (s agentStatus) tracked() int { n, _ := strconv.Atoi(s.TrackedCgroups); return n }
func (s agentStatus) rss() float64 { n, _ := strconv.ParseFloat(s.RSSBytes, 64); return n }
func (s agentStatus) fill() map[string]float64 {
	m := map[string]float64{}
	for _, x := range s.Maps {
		m[x.Program] = x.Fill
	}
	return m
}

func statusOf(t *testing.T, sock string) agentStatus {
	t.Helper()
	out, err := nodectl(t, "agent", "status", "--socket", sock, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var st agentStatus
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	return st
}

// metricsURL reads where the agent serves its metrics from its log.
func metricsURL(t *testing.T, logPath string) string {
	t.Helper()
	b, _ := os.ReadFile(logPath)
	m := regexp.MustCompile(`metrics on (http://\S+)`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("the agent's log names no metrics address:\n%s", b)
	}
	return string(m[1])
}

// scrape reads the agent's metrics.
func scrape(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// heapInuse reads the Go heap's bytes in spans in use from a scrape of the agent's metrics.
func heapInuse(t *testing.T, url string) float64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^go_memstats_heap_inuse_bytes (\S+)$`).FindSubmatch(scrape(t, url))
	if m == nil {
		t.Fatalf("no go_memstats_heap_inuse_bytes in the agent's metrics")
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}

// churnedSeries counts the series of the churned cgroups in a scrape (their workload identity
// is nodectl/c<n>).
func churnedSeries(t *testing.T, url string) int {
	t.Helper()
	return strings.Count(string(scrape(t, url)), `workload="nodectl/c`)
}

// churn makes n cgroups below parent, each with a process that wakes every 100 ms for a second
// (so the tracer sees it and the agent follows it), then removes them all; four workers share
// the cgroups, as a node starting pods does.
func churn(t *testing.T, l *cgroup.Layout, parent string, n int) {
	t.Helper()
	const workers = 4
	errs := make(chan error, workers)
	for w := range workers {
		go func() { errs <- churnSome(l, parent, w, n, workers) }()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// churnSome does churn's work for the cgroups i ≡ w (mod every).
func churnSome(l *cgroup.Layout, parent string, w, n, every int) error {
	var cmds []*exec.Cmd
	defer func() {
		for _, cmd := range cmds {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	var cgs []string
	defer func() {
		for _, cg := range cgs {
			_ = l.Remove(cg)
		}
	}()
	for i := w; i < n; i += every {
		cg := fmt.Sprintf("%s/c%05d", parent, i)
		if err := l.Create(cg, cgroup.Limits{}); err != nil {
			return err
		}
		cgs = append(cgs, cg)
		cmd := exec.Command("sh", "-c", "read go; for i in 1 2 3 4 5 6 7 8 9 10; do sleep 0.1; done")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return err
		}
		cmds = append(cmds, cmd)
		if err := l.AddProc(cg, cmd.Process.Pid); err != nil {
			return err
		}
		fmt.Fprintln(stdin)
	}
	for _, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			return err
		}
	}
	cmds = nil
	return nil
}

// 4,000 cgroups made, used and removed under the agent (NODECTL_CHURN=10000 for the figures in
// docs/agent.md): the cgroups it tracks, its maps' fill, its metric series, its heap and its
// RSS come back to where they were. Each batch of 1,000 takes this machine about 50 s and the
// agent forgets a batch within 14 s, so batches beyond a few repeat what the first ones show.
func TestAgentForgetsRemovedCgroups(t *testing.T) {
	requireRoot(t)
	l, err := cgroup.Detect("/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	parent := fmt.Sprintf("%s/test-churn-%d", cgroup.Parent, os.Getpid())
	if err := l.Create(parent, cgroup.Limits{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Remove(parent); err != nil {
			t.Error(err)
		}
		if err := l.Prune(cgroup.Parent); err != nil {
			t.Error(err)
		}
	})
	// A short interval: the agent looks for removed cgroups every 30 intervals.
	// The recorder keeps a removed cgroup's series for --series-idle, and compacts its tables
	// at the next segment's start: short ones, so that its memory comes back within the test.
	ag := startAgent(t, filepath.Join(t.TempDir(), "agent"), "--interval", "200ms", "--metrics-listen", "127.0.0.1:0",
		"--segment-span", "10s", "--series-idle", "10s")
	sock, metrics := ag.sock, metricsURL(t, ag.log)
	time.Sleep(5 * time.Second)
	before, heapBefore := statusOf(t, sock), heapInuse(t, metrics)
	n := 4000
	if v := os.Getenv("NODECTL_CHURN"); v != "" { // a quicker look while developing
		n, _ = strconv.Atoi(v)
	}
	var peakTracked, peakSeries int
	var peakRSS float64
	start := time.Now()
	for done := 0; done < n; done += 1000 {
		churn(t, l, parent, min(1000, n-done))
		st := statusOf(t, sock)
		peakTracked, peakRSS = max(peakTracked, st.tracked()), max(peakRSS, st.rss())
		peakSeries = max(peakSeries, churnedSeries(t, metrics))
	}
	t.Logf("churned %d cgroups in %s; before: %d tracked, RSS %.1f MiB, fill %v; peak %d tracked, %d series of churned cgroups, RSS %.1f MiB",
		n, time.Since(start).Round(time.Second), before.tracked(), before.rss()/(1<<20), before.fill(), peakTracked, peakSeries, peakRSS/(1<<20))
	if peakTracked <= before.tracked() || peakSeries == 0 {
		t.Fatalf("the agent never followed the churned cgroups (peak %d tracked, before %d; peak %d series)", peakTracked, before.tracked(), peakSeries)
	}
	// Removed cgroups are looked for every 30 intervals, the tracer forgets every 30 reads and
	// the exporter drops late values for 40 batches: 14 s at 200 ms, with room to spare. The
	// node's own series may grow meanwhile (a device or a syscall seen for the first time);
	// the churned cgroups' must all go.
	var after agentStatus
	var churned int
	for deadline := time.Now().Add(40 * time.Second); ; time.Sleep(time.Second) {
		after, churned = statusOf(t, sock), churnedSeries(t, metrics)
		back := after.tracked() <= before.tracked()+5 && churned == 0
		for prog, f := range after.fill() {
			back = back && f <= before.fill()[prog]+0.01
		}
		if back {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("40s after the churn: %d tracked (before %d), %d series of churned cgroups, fill %v (before %v)",
				after.tracked(), before.tracked(), churned, after.fill(), before.fill())
		}
	}
	t.Logf("after: %d tracked, RSS %.1f MiB, fill %v", after.tracked(), after.rss()/(1<<20), after.fill())
	// Then the memory: the recorder drops the churned series --series-idle after their last
	// sample and compacts its tables at the next segment's start; the agent hands free heap
	// back to the kernel at its next look (docs/agent.md, "Removed cgroups"). The heap in use
	// comes back to where it was, give or take a collection's garbage (it peaked at 40 MiB and
	// more); the RSS to within what the Go runtime never returns (its collector's metadata,
	// sized for the peak heap: 4 MiB here) and the free heap left to its scavenger (up to the
	// live heap, or 8 MiB). Polled: the heap in use moves with the collector's cycles.
	const heapSlack, rssSlack = 8 << 20, 16 << 20
	var heap float64
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(2 * time.Second) {
		after, heap = statusOf(t, sock), heapInuse(t, metrics)
		if heap <= heapBefore+heapSlack && after.rss() <= before.rss()+rssSlack {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("60s after the churn was forgotten: heap in use %.1f MiB (before %.1f), RSS %.1f MiB (before %.1f; peak %.1f)",
				heap/(1<<20), heapBefore/(1<<20), after.rss()/(1<<20), before.rss()/(1<<20), peakRSS/(1<<20))
		}
	}
	t.Logf("memory: heap in use %.1f MiB before, %.1f after; RSS %.1f MiB before, %.1f at the peak, %.1f after",
		heapBefore/(1<<20), heap/(1<<20), before.rss()/(1<<20), peakRSS/(1<<20), after.rss()/(1<<20))
	ag.stop(t)
}
