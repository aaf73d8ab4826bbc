package kube

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/nodectl/nodectl/testcluster"
)

// kubeletRenewals is what a kubelet asks of the API server for its own heartbeats: a Lease
// update every 10 s, 360 an hour. An agent beside it is to cost no more, steady.
const kubeletRenewals = 360

// apiRequest is one request an agent made.
type apiRequest struct {
	at       time.Time
	verb     string // get, list or watch
	resource string
	timeout  int // a watch's timeoutSeconds
}

// apiCounter counts what one agent asks of the API server and the bytes it reads back, from
// under its client's transport.
type apiCounter struct {
	mu       sync.Mutex
	requests []apiRequest
	bytes    atomic.Int64
}

func (c *apiCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTrip(func(r *http.Request) (*http.Response, error) {
		q := r.URL.Query()
		segs := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
		req := apiRequest{at: time.Now(), verb: "get", resource: segs[len(segs)-1]}
		switch {
		case q.Get("watch") == "true" || q.Get("watch") == "1":
			req.verb, req.timeout = "watch", atoiOr0(q.Get("timeoutSeconds"))
		case slices.Contains([]string{"pods", "nodes", "leases"}, req.resource):
			req.verb = "list"
		default:
			req.resource = segs[len(segs)-2]
		}
		c.mu.Lock()
		c.requests = append(c.requests, req)
		c.mu.Unlock()
		resp, err := rt.RoundTrip(r)
		if resp != nil {
			resp.Body = countingBody{resp.Body, &c.bytes}
		}
		return resp, err
	})
}

// since returns the requests made at or after t.
func (c *apiCounter) since(t time.Time) []apiRequest {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []apiRequest
	for _, r := range c.requests {
		if !r.at.Before(t) {
			out = append(out, r)
		}
	}
	return out
}

// lastWatches returns the timeoutSeconds of the last watch of each resource.
func (c *apiCounter) lastWatches() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for _, r := range c.requests {
		if r.verb == "watch" {
			out[r.resource] = r.timeout
		}
	}
	return out
}

type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

func atoiOr0(s string) int { n, _ := strconv.Atoi(s); return n }

// A fleet of agents against one API server, each with its own node, Lease and pods, renewed
// by a kubelet of the test's every 10 s: once started, an agent lists nothing, and asks the
// API server less than its node's kubelet does for its heartbeats alone (docs/agent.md, "API
// cost"): its watches, opened again when the server ends them, are all it keeps.
func TestFleetCost(t *testing.T) {
	if os.Getenv(testcluster.EnvVar) != "1" {
		t.Skipf("starts etcd and kube-apiserver: set %s=1 (make test-cluster)", testcluster.EnvVar)
	}
	const agents, podsPerNode, steady = 20, 5, 90 * time.Second
	// The followers' watches end every 20-30 s here, so that the window sees them opened
	// again; the requests an hour are reckoned with the agent's own timeout.
	prodTimeout := watchTimeout
	watchTimeout = 30 * time.Second
	defer func() { watchTimeout = prodTimeout }()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cp, err := testcluster.StartControlPlane(ctx, t.TempDir(), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	admin := cp.Client
	cfg := agentConfig(ctx, t, cp, admin)

	leases := admin.CoordinationV1().Leases(NodeLeaseNamespace)
	nodes := make([]string, agents)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("fleet-%02d", i)
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodes[i]}}
		if _, err := admin.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := leases.Create(ctx, liveLease(nodes[i], time.Now()), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		for p := range podsPerNode {
			pod := itPod(fmt.Sprintf("%s-%d", nodes[i], p), nodes[i], corev1.ResourceRequirements{})
			if _, err := admin.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The kubelets: every node's Lease renewed every 10 s (but while the test restarts the
	// API server).
	var restarting atomic.Bool
	run, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for tick := time.NewTicker(10 * time.Second); ; {
			select {
			case <-run.Done():
				tick.Stop()
				return
			case <-tick.C:
			}
			for _, n := range nodes {
				l, err := leases.Get(run, n, metav1.GetOptions{})
				if err == nil {
					l.Spec.RenewTime = ptrMicro(time.Now())
					_, err = leases.Update(run, l, metav1.UpdateOptions{})
				}
				if err != nil && run.Err() == nil && !restarting.Load() {
					t.Errorf("renewing %s: %v", n, err)
				}
			}
		}
	}()

	// The agents: each its own client, its Lease, Node and pods followed as the agent does.
	counters := make([]*apiCounter, agents)
	var renewed, named atomic.Int64
	lastRenewal := make([]atomic.Int64, agents) // unix ns of each agent's last renewal seen
	pods := make([]*Pods, agents)
	for i, n := range nodes {
		c := &apiCounter{}
		counters[i] = c
		acfg := rest.CopyConfig(cfg)
		acfg.UserAgent, acfg.QPS, acfg.Burst = userAgent, 5, 10
		acfg.WrapTransport = c.wrap
		api, err := newRESTAPI(acfg)
		if err != nil {
			t.Fatal(err)
		}
		var first atomic.Bool
		pods[i] = NewPods(api, n, log)
		wg.Add(3)
		go func() { defer wg.Done(); pods[i].Run(run) }()
		go func() {
			defer wg.Done()
			WatchLease(run, api, n, func(Renewal) {
				lastRenewal[i].Store(time.Now().UnixNano())
				if first.CompareAndSwap(false, true) {
					renewed.Add(1)
				}
			}, log)
		}()
		go func() { defer wg.Done(); WatchNode(run, api, n, func(_, _ Node) { named.Add(1) }, log) }()
	}
	for deadline := time.Now().Add(time.Minute); renewed.Load() < agents || named.Load() < agents || !allSynced(pods); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after a minute: %d agents saw their Lease, %d their Node", renewed.Load(), named.Load())
		}
	}
	for i, p := range pods {
		if got := len(p.List()); got != podsPerNode {
			t.Errorf("agent %d names %d pods, want %d", i, got, podsPerNode)
		}
	}

	// Steady: what each agent asks and reads for a while after its start.
	time.Sleep(5 * time.Second)
	from := time.Now()
	bytesBefore := make([]int64, agents)
	for i, c := range counters {
		bytesBefore[i] = c.bytes.Load()
	}
	time.Sleep(steady)
	var perHour, bytesPerMin []float64
	for i, c := range counters {
		reqs := c.since(from)
		rewatched := map[string]int{}
		for _, r := range reqs {
			switch r.verb {
			case "list", "get":
				t.Errorf("agent %d: %s %s after its start", i, r.verb, r.resource)
			case "watch":
				rewatched[r.resource]++
			}
		}
		// The Lease's and the Node's watches ended in the window and were opened again from
		// their last version, with no Get.
		if rewatched["leases"] == 0 || rewatched["nodes"] == 0 {
			t.Errorf("agent %d: watches opened again in the window %v, want the Lease's and the Node's", i, rewatched)
		}
		// Steady, an agent keeps one watch per resource open and opens it again when the
		// server ends it: a request per timeout, the followers' at least 4/5 of watchTimeout,
		// the pod informer's as its last watch asked.
		bound := 2 * 3600 / (0.8 * prodTimeout.Seconds())
		if timeout := c.lastWatches()["pods"]; timeout >= 60 {
			bound += 3600 / float64(timeout)
		} else {
			t.Errorf("agent %d: its pods watch ends after %d s", i, timeout)
		}
		perHour = append(perHour, bound)
		bytesPerMin = append(bytesPerMin, float64(c.bytes.Load()-bytesBefore[i])*float64(time.Minute)/float64(steady))
		if bound > kubeletRenewals {
			t.Errorf("agent %d: %.0f requests an hour by its watches' timeouts, more than its kubelet's %d renewals", i, bound, kubeletRenewals)
		}
	}
	slices.Sort(perHour)
	slices.Sort(bytesPerMin)
	t.Logf("%d agents, steady %s: requests an hour per agent at most %.0f-%.0f (a kubelet's Lease renewals: %d); bytes read a minute per agent %.0f-%.0f (watches ended every 24-30 s here)",
		agents, steady, perHour[0], perHour[len(perHour)-1], kubeletRenewals, bytesPerMin[0], bytesPerMin[len(bytesPerMin)-1])

	// The API server restarts, as in an upgrade: every agent loses it at once. Each comes
	// back, and not in step: their first requests to the server once it is up again (the
	// Lease's and the Node's) spread over the waits drawn at random, where waits doubled in
	// step would bring them all within a few milliseconds, in one or two 100 ms slots.
	restarting.Store(true)
	down := time.Now()
	if err := cp.RestartAPIServer(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	restarting.Store(false)
	time.Sleep(40 * time.Second)
	slots := map[int64]bool{}
	var back []time.Duration
	for i, c := range counters {
		after := c.since(up)
		for _, r := range after {
			if r.resource == "leases" || r.resource == "nodes" {
				back = append(back, r.at.Sub(up))
				slots[r.at.Sub(up).Milliseconds()/100] = true
				break
			}
		}
		// Back, the Lease's follower watches on after a Get and a watch or two, not a loop.
		// The Node's, here, gets its Node every retry until the Node changes: the restarted
		// server's watch cache starts past the Node's version, and the test's etcd (3.4)
		// lacks the progress notifications a watch from now needs (follower, fromNow); a
		// kubelet writes its Node at least every 5 minutes.
		per := map[string]int{}
		for _, r := range after {
			per[r.resource]++
		}
		if per["leases"] > 6 {
			t.Errorf("agent %d: %v requests in the 40 s after the API server came back", i, per)
		}
		if i == 0 {
			t.Logf("agent 0: %v requests in the 40 s after the API server came back", per)
		}
		if time.Unix(0, lastRenewal[i].Load()).Before(up) {
			t.Errorf("agent %d saw no renewal in the 40 s after the API server came back", i)
		}
	}
	slices.Sort(back)
	t.Logf("API server down %s; the agents' first requests after it was up: %v, in %d slots of 100 ms", up.Sub(down).Round(time.Millisecond), back, len(slots))
	if len(back) != agents {
		t.Errorf("%d agents came back, want %d", len(back), agents)
	}
	if len(slots) < agents/4 {
		t.Errorf("the agents came back in step: in %d slots of 100 ms, want %d at least", len(slots), agents/4)
	}
}

func allSynced(ps []*Pods) bool {
	for _, p := range ps {
		if !p.Synced() {
			return false
		}
	}
	return true
}
