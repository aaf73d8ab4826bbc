package testcluster

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// EnvVar turns the cluster tests on: they change the host (cgroups, a bridge, mounts) and
// take minutes, so only `make test-cluster` runs them.
const EnvVar = "NODECTL_TEST_CLUSTER"

// Cluster is a control plane and one node, started for a test.
type Cluster struct {
	*ControlPlane
	Node *Node
	Dir  string
}

// stoppers are the running clusters' Stop functions, for Main's signal handler.
var (
	stopMu   sync.Mutex
	stoppers = map[*Cluster]func(){}
)

// Main runs a package's tests and stops every cluster Start made when the run is interrupted
// (SIGINT, SIGTERM), where t.Cleanup would not run. Call it from TestMain.
func Main(m *testing.M) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		s := <-sig
		fmt.Fprintf(os.Stderr, "testcluster: %v: stopping the clusters\n", s)
		stopMu.Lock()
		for _, stop := range stoppers {
			stop()
		}
		os.Exit(130)
	}()
	os.Exit(m.Run())
}

// Start starts a control plane and a node for t (skipped unless EnvVar=1 and root) in a fixed
// directory below the temporary one, so a killed run's leftovers are found and removed by the
// next. Everything is stopped and removed at t's cleanup, or by Main on a signal.
func Start(t testing.TB, log *slog.Logger) *Cluster {
	t.Helper()
	if os.Getenv(EnvVar) != "1" {
		t.Skip("the cluster tests start a real control plane and kubelet: run make test-cluster")
	}
	if os.Geteuid() != 0 {
		t.Skip("the cluster tests need root (a kubelet and containerd): run sudo make test-cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := &Cluster{Dir: filepath.Join(os.TempDir(), "nodectl-testcluster")}
	if err := Clean(filepath.Join(c.Dir, "node"), log); err != nil {
		t.Fatalf("removing a killed run's leftovers: %v", err)
	}
	if err := os.RemoveAll(c.Dir); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			if c.Node != nil {
				c.Node.Stop()
			}
			if c.ControlPlane != nil {
				c.ControlPlane.Stop()
			}
		})
	}
	stopMu.Lock()
	stoppers[c] = stop
	stopMu.Unlock()
	t.Cleanup(func() {
		stop()
		stopMu.Lock()
		delete(stoppers, c)
		stopMu.Unlock()
		if t.Failed() {
			for _, f := range []string{"cp/kube-apiserver.log", "cp/etcd.log", "node/containerd.log", "node/kubelet.log"} {
				t.Logf("--- %s (last lines)\n%s", f, tail(filepath.Join(c.Dir, f), 30))
			}
		}
		if left := Leftovers(filepath.Join(c.Dir, "node")); len(left) > 0 {
			// Kept: removing a directory with mounts below it could reach into them.
			t.Errorf("the cluster left behind (%s kept):\n%s", c.Dir, strings.Join(left, "\n"))
			return
		}
		os.RemoveAll(c.Dir)
	})
	start := time.Now()
	cp, err := StartControlPlane(ctx, filepath.Join(c.Dir, "cp"), log)
	if err != nil {
		t.Fatalf("starting the control plane: %v", err)
	}
	c.ControlPlane = cp
	t.Logf("control plane ready in %v", time.Since(start).Round(time.Millisecond))
	start = time.Now()
	if c.Node, err = StartNode(ctx, cp, filepath.Join(c.Dir, "node"), log); err != nil {
		t.Fatalf("starting the node: %v", err)
	}
	t.Logf("node %s Ready with its Lease renewed in %v", c.Node.Name, time.Since(start).Round(time.Millisecond))
	return c
}

// RSS is the resident memory of the cluster's daemons (etcd, kube-apiserver, containerd, the
// kubelet), by name, in bytes.
func (c *Cluster) RSS() map[string]int64 {
	out := map[string]int64{}
	for _, p := range []*proc{c.etcd, c.api, c.Node.containerd, c.Node.kubelet} {
		if p != nil {
			out[p.name] = rss(p.cmd.Process.Pid)
		}
	}
	return out
}

func rss(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}
