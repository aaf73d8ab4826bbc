package rpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/nodectl/nodectl/api/agent/v1"
	"github.com/nodectl/nodectl/rundir"
)

// fakeBackend answers from its fields and remembers the arguments it was called with.
type fakeBackend struct {
	status    *agentv1.Status
	meta      rundir.Meta
	records   []rundir.Record // Query hands them over perCall at a time
	perCall   int
	report    *agentv1.Report
	incidents []*agentv1.Incident

	mu       sync.Mutex
	query    queryArgs
	analyze  analyzeArgs
	since    time.Time
	limit    int
	analyzed chan struct{} // closed by Analyze when set, which then waits for its context
}

func (b *fakeBackend) Status(context.Context) (*agentv1.Status, error) { return b.status, nil }
func (b *fakeBackend) Meta() rundir.Meta                               { return b.meta }

func (b *fakeBackend) Query(_ context.Context, from, to time.Time, step time.Duration, metric, prefix string, fn func([]rundir.Record) error) error {
	b.mu.Lock()
	b.query = queryArgs{from: from, to: to, step: step, metric: metric, cgroupPrefix: prefix}
	b.mu.Unlock()
	for i := 0; i < len(b.records); i += b.perCall {
		if err := fn(b.records[i:min(i+b.perCall, len(b.records))]); err != nil {
			return err
		}
	}
	return nil
}

func (b *fakeBackend) Analyze(ctx context.Context, from, to time.Time, baseline time.Duration, cgroup string) (*agentv1.Report, error) {
	b.mu.Lock()
	b.analyze = analyzeArgs{from: from, to: to, baseline: baseline, cgroup: cgroup}
	b.mu.Unlock()
	if b.analyzed != nil {
		close(b.analyzed)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return b.report, nil
}

func (b *fakeBackend) Incidents(since time.Time, limit int) []*agentv1.Incident {
	b.mu.Lock()
	b.since, b.limit = since, limit
	b.mu.Unlock()
	// The caller's own messages, as the agent's backend makes them.
	out := make([]*agentv1.Incident, 0, min(limit, len(b.incidents)))
	for _, in := range b.incidents[:min(limit, len(b.incidents))] {
		out = append(out, proto.CloneOf(in))
	}
	return out
}

func (b *fakeBackend) Incident(id string) (*agentv1.Incident, bool) {
	for _, inc := range b.incidents {
		if inc.Id == id {
			return inc, true
		}
	}
	return nil, false
}

func testIncident(id string) *agentv1.Incident {
	return &agentv1.Incident{Id: id, Opened: ts(0), Trigger: "oom_kill", Cgroup: "/kubepods/pod1", Workload: "web",
		Evidence: "oom kill of pid 7 (java)", WindowFrom: ts(-time.Minute), WindowTo: ts(time.Minute),
		BaselineFrom: ts(-6 * time.Minute), BaselineTo: ts(-time.Minute), State: "closed",
		Report: &agentv1.Report{Run: &agentv1.RunInfo{Id: "agent-" + id}}}
}

func newFake() *fakeBackend {
	return &fakeBackend{
		status: &agentv1.Status{Version: "v1.2.3", StartTime: ts(0), Node: "node-1", Kernel: "6.1.0",
			Tracer: map[string]string{"runq": rundir.TracerAttached, "fsync": "no BTF"},
			Maps:   []*agentv1.MapFill{{Program: "runq", Map: "hists", Entries: 10, MaxEntries: 1024}},
			Drops:  []*agentv1.Drop{{Stage: "ring_buffer", What: "oom events", Count: 2}},
			Store:  &agentv1.Store{Bytes: 1 << 30, Segments: 4, Oldest: ts(-time.Hour), Newest: ts(0), Writable: true},
		},
		meta:    rundir.Meta{Format: rundir.FormatVersionSegmented, ID: "agent-node-1", Scenario: "record", Node: "node-1", Start: t0},
		records: testRecords(t0),
		perCall: 3,
		report: &agentv1.Report{Run: &agentv1.RunInfo{Id: "agent-node-1"}, Findings: []*agentv1.Finding{{Id: "cpu-contention", Severity: "warning",
			Evidence: []*agentv1.Evidence{{Metric: "runq_wait_seconds", Value: 1.5, Histogram: &agentv1.Histogram{Buckets: []uint64{0, 3}, Count: 3, SumNs: 7}}}}}},
		incidents: []*agentv1.Incident{testIncident("inc-2"), testIncident("inc-1")},
	}
}

// start serves b on a socket in a fresh directory until the test ends.
func start(t *testing.T, cfg Config, b Backend) *Server {
	t.Helper()
	if cfg.Socket == "" {
		cfg.Socket = filepath.Join(t.TempDir(), "agent.sock")
	}
	cfg.Log = slog.New(slog.DiscardHandler)
	s, err := New(cfg, b)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return s
}

// socketOf is the socket s listens on.
func socketOf(s *Server) string { return s.lis[0].Addr().String() }

func dial(t *testing.T, s *Server) agentv1.AgentClient {
	t.Helper()
	c, closer, err := Dial(context.Background(), DialConfig{Socket: socketOf(s)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closer.Close() })
	return c
}

func TestRoundTrips(t *testing.T) {
	b := newFake()
	c := dial(t, start(t, Config{}, b))
	ctx := context.Background()

	st, err := c.GetStatus(ctx, &agentv1.GetStatusRequest{})
	if err != nil || !proto.Equal(st, b.status) {
		t.Errorf("GetStatus: %v, %v", st, err)
	}
	if m, err := c.GetMeta(ctx, &agentv1.GetMetaRequest{}); err != nil {
		t.Errorf("GetMeta: %v", err)
	} else {
		var meta rundir.Meta
		if err := json.Unmarshal([]byte(m.MetaJson), &meta); err != nil || meta.Node != b.meta.Node {
			t.Errorf("GetMeta: %q (%v), want the backend's meta", m.MetaJson, err)
		}
	}

	stream, err := c.Query(ctx, &agentv1.QueryRequest{From: ts(0), To: ts(time.Hour), Step: durationpb.New(time.Second),
		Metric: "m", CgroupPrefix: "/kubepods/"})
	if err != nil {
		t.Fatal(err)
	}
	chunks, recs := 0, []rundir.Record(nil)
	for {
		chunk, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if chunks == 0 {
			var meta rundir.Meta
			if err := json.Unmarshal([]byte(chunk.MetaJson), &meta); err != nil || !reflect.DeepEqual(meta, b.meta) {
				t.Errorf("first chunk's meta: %+v, %v", meta, err)
			}
		} else if chunk.MetaJson != "" {
			t.Errorf("chunk %d carries the meta again", chunks)
		}
		chunks++
		for _, p := range chunk.Records {
			r, err := RecordFromProto(p)
			if err != nil {
				t.Fatal(err)
			}
			recs = append(recs, r)
		}
	}
	if !reflect.DeepEqual(recs, b.records) {
		t.Errorf("Query records:\n got %+v\nwant %+v", recs, b.records)
	}
	if want := (queryArgs{from: t0, to: t0.Add(time.Hour), step: time.Second, metric: "m", cgroupPrefix: "/kubepods"}); !reflect.DeepEqual(b.query, want) {
		t.Errorf("Query asked the backend for %+v, want %+v", b.query, want)
	}

	an, err := c.Analyze(ctx, &agentv1.AnalyzeRequest{From: ts(0), To: ts(time.Minute), Baseline: durationpb.New(5 * time.Minute), Cgroup: "/kubepods/pod1"})
	if err != nil || !proto.Equal(an.GetReport(), b.report) {
		t.Errorf("Analyze: %v, %v", an, err)
	}
	if want := (analyzeArgs{from: t0, to: t0.Add(time.Minute), baseline: 5 * time.Minute, cgroup: "/kubepods/pod1"}); !reflect.DeepEqual(b.analyze, want) {
		t.Errorf("Analyze asked the backend for %+v, want %+v", b.analyze, want)
	}

	list, err := c.ListIncidents(ctx, &agentv1.ListIncidentsRequest{Since: ts(-time.Hour)})
	if err != nil || len(list.Incidents) != 2 || !proto.Equal(list.Incidents[0], b.incidents[0]) {
		t.Errorf("ListIncidents: %v, %v", list, err)
	}
	if !b.since.Equal(t0.Add(-time.Hour)) || b.limit != DefaultListLimit {
		t.Errorf("ListIncidents asked the backend for %v, %d", b.since, b.limit)
	}

	inc, err := c.GetIncident(ctx, &agentv1.GetIncidentRequest{Id: "inc-1"})
	if err != nil || !proto.Equal(inc, b.incidents[1]) {
		t.Errorf("GetIncident: %v, %v", inc, err)
	}
	if _, err := c.GetIncident(ctx, &agentv1.GetIncidentRequest{Id: "inc-9"}); status.Code(err) != codes.NotFound {
		t.Errorf("GetIncident of an unknown id: %v", err)
	}
}

// A node's incidents, each with a 20 KB report, fill 10 MB: the list carries the newest whole,
// the others without their report (GetIncident has it), and stays under what a client takes by
// default; 10,000 incidents of long cgroup paths fill 3 MiB without reports: the oldest are left
// off and counted.
func TestListIncidentsBounded(t *testing.T) {
	b := newFake()
	b.incidents = nil
	for i := range 500 {
		in := testIncident(fmt.Sprintf("inc-%03d", 500-i))
		in.Report.Notes = []string{strings.Repeat("n", 20<<10)}
		b.incidents = append(b.incidents, in)
	}
	c := dial(t, start(t, Config{}, b))
	ctx := context.Background()
	list, err := c.ListIncidents(ctx, &agentv1.ListIncidentsRequest{Limit: 500})
	if err != nil {
		t.Fatalf("ListIncidents of 500 incidents with 20 KB reports: %v", err)
	}
	whole := 0
	for i, in := range list.Incidents {
		switch {
		case in.GetReport() != nil && !in.GetReportOmitted():
			if whole++; whole != i+1 {
				t.Fatalf("incident %d has its report after one without", i)
			}
		case in.GetReport() != nil || !in.GetReportOmitted():
			t.Fatalf("incident %d: report %v, omitted %v", i, in.GetReport() != nil, in.GetReportOmitted())
		}
	}
	size := proto.Size(list)
	t.Logf("%d incidents, %d with their report, %d bytes", len(list.Incidents), whole, size)
	if len(list.Incidents) != 500 || list.LeftOff != 0 || whole < 50 || size > listMaxBytes {
		t.Errorf("%d incidents listed, %d left off, %d whole, %d bytes: want all 500, the newest whole, under %d bytes",
			len(list.Incidents), list.LeftOff, whole, size, listMaxBytes)
	}
	if got, err := c.GetIncident(ctx, &agentv1.GetIncidentRequest{Id: list.Incidents[499].Id}); err != nil || got.GetReport() == nil {
		t.Errorf("GetIncident of an incident listed without its report: %v, %v", got.GetReport() != nil, err)
	}

	b.incidents = nil
	for i := range MaxListLimit {
		in := testIncident(fmt.Sprintf("inc-%05d", i))
		in.Cgroup = "/kubepods.slice/" + strings.Repeat("p", 300)
		b.incidents = append(b.incidents, in)
	}
	list, err = c.ListIncidents(ctx, &agentv1.ListIncidentsRequest{Limit: MaxListLimit})
	if err != nil {
		t.Fatalf("ListIncidents of %d incidents: %v", MaxListLimit, err)
	}
	if size := proto.Size(list); list.LeftOff == 0 || len(list.Incidents)+int(list.LeftOff) != MaxListLimit || size > listMaxBytes {
		t.Errorf("%d listed, %d left off, %d bytes: want the oldest left off and counted, under %d bytes", len(list.Incidents), list.LeftOff, size, listMaxBytes)
	}
}

// A query larger than a chunk comes in several, the meta in the first alone.
func TestQueryChunks(t *testing.T) {
	b := newFake()
	big := strings.Repeat("x", 64<<10)
	b.records = nil
	for i := range 40 { // 2.5 MiB of messages
		b.records = append(b.records, rundir.Record{Type: rundir.TypeEvent, Time: t0.Add(time.Duration(i)), Message: big})
	}
	c := dial(t, start(t, Config{}, b))
	stream, err := c.Query(context.Background(), &agentv1.QueryRequest{From: ts(0), To: ts(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	chunks, n := 0, 0
	for {
		chunk, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if (chunks == 0) != (chunk.MetaJson != "") {
			t.Errorf("chunk %d: meta %q", chunks, chunk.MetaJson)
		}
		chunks++
		n += len(chunk.Records)
	}
	if chunks < 3 || n != len(b.records) {
		t.Errorf("%d records in %d chunks", n, chunks)
	}
}

// An empty answer still brings the meta.
func TestQueryEmpty(t *testing.T) {
	b := newFake()
	b.records = nil
	c := dial(t, start(t, Config{}, b))
	stream, _ := c.Query(context.Background(), &agentv1.QueryRequest{From: ts(0), To: ts(time.Hour)})
	chunk, err := stream.Recv()
	if err != nil || chunk.MetaJson == "" || len(chunk.Records) != 0 {
		t.Fatalf("%v, %v", chunk, err)
	}
	if _, err := stream.Recv(); err != io.EOF {
		t.Errorf("then %v", err)
	}
}

// A client that gives up cancels the backend's work.
func TestAnalyzeCanceled(t *testing.T) {
	b := newFake()
	b.analyzed = make(chan struct{})
	c := dial(t, start(t, Config{}, b))
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-b.analyzed; cancel() }()
	if _, err := c.Analyze(ctx, &agentv1.AnalyzeRequest{From: ts(0), To: ts(time.Minute)}); status.Code(err) != codes.Canceled {
		t.Errorf("Analyze: %v", err)
	}
}

func TestInvalidArgumentOverTheWire(t *testing.T) {
	c := dial(t, start(t, Config{}, newFake()))
	ctx := context.Background()
	recv := func(s interface {
		Recv() (*agentv1.QueryChunk, error)
	}, err error) error {
		if err != nil {
			return err
		}
		_, err = s.Recv()
		return err
	}
	_, err := c.Analyze(ctx, &agentv1.AnalyzeRequest{From: ts(time.Hour), To: ts(0)})
	wantInvalid(t, err, "to")
	wantInvalid(t, recv(c.Query(ctx, &agentv1.QueryRequest{From: ts(0), To: ts(time.Hour), Step: durationpb.New(-1)})), "step")
	_, err = c.ListIncidents(ctx, &agentv1.ListIncidentsRequest{Limit: MaxListLimit + 1})
	wantInvalid(t, err, "limit")
	_, err = c.GetIncident(ctx, &agentv1.GetIncidentRequest{})
	wantInvalid(t, err, "id")
	w, err := c.Watch(ctx, &agentv1.WatchRequest{CgroupPrefix: "kubepods"})
	if err == nil {
		_, err = w.Recv()
	}
	wantInvalid(t, err, "cgroup_prefix")
}

func TestSocket(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run", "nodectl")
	sock := filepath.Join(dir, "agent.sock")
	s, err := New(Config{Socket: sock, Log: slog.New(slog.DiscardHandler)}, newFake())
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]os.FileMode{dir: os.ModeDir | 0o700, sock: os.ModeSocket | 0o600} {
		if fi, err := os.Stat(path); err != nil || fi.Mode() != want {
			t.Errorf("%s: %v, %v, want %v", path, fi.Mode(), err, want)
		}
	}
	// A second agent on the same socket is refused and leaves it alone.
	if _, err := New(Config{Socket: sock}, newFake()); err == nil || !strings.Contains(err.Error(), "another agent is listening") {
		t.Errorf("second agent: %v", err)
	}
	if _, err := os.Stat(sock); err != nil {
		t.Errorf("the live socket is gone: %v", err)
	}
	s.Close()
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket after Close: %v", err)
	}
}

func TestStaleSocketReplaced(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false) // as an agent killed with SIGKILL leaves it
	l.Close()
	dial(t, start(t, Config{Socket: sock}, newFake()))
}

func TestNotASocketKept(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.sock")
	if err := os.WriteFile(path, []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Socket: path}, newFake()); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("New: %v", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "data" {
		t.Errorf("the file was touched")
	}
}

func TestDialNoAgent(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	want := "no agent listening on " + sock + ": is `nodectl agent` running?"
	if _, _, err := Dial(context.Background(), DialConfig{Socket: sock}); err == nil || err.Error() != want {
		t.Errorf("missing socket: %v", err)
	}
	l, _ := net.Listen("unix", sock)
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	if _, _, err := Dial(context.Background(), DialConfig{Socket: sock}); err == nil || err.Error() != want {
		t.Errorf("stale socket: %v", err)
	}
}

func TestHealth(t *testing.T) {
	s := start(t, Config{}, newFake())
	conn, err := grpc.NewClient("unix://"+socketOf(s), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	h := healthpb.NewHealthClient(conn)
	check := func(service string) healthpb.HealthCheckResponse_ServingStatus {
		r, err := h.Check(context.Background(), &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			t.Fatal(err)
		}
		return r.Status
	}
	want := func(st healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		for _, svc := range []string{"", agentv1.Agent_ServiceDesc.ServiceName} {
			if got := check(svc); got != st {
				t.Errorf("service %q: %v, want %v", svc, got, st)
			}
		}
	}
	want(healthpb.HealthCheckResponse_NOT_SERVING) // until the agent says it records
	s.SetServing(true)
	want(healthpb.HealthCheckResponse_SERVING)
	s.SetServing(false)
	want(healthpb.HealthCheckResponse_NOT_SERVING)
}

// waitSubscribers waits until h has n subscribers: a stream is subscribed only once its
// handler runs, after the client's call returned.
func waitSubscribers[T any](t *testing.T, h *hub[T], n int) {
	t.Helper()
	for {
		h.mu.Lock()
		got := len(h.subs)
		h.mu.Unlock()
		if got == n {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// batchAt is the i-th test batch: its time says which it is.
func batchAt(i int, payload string) (time.Time, []rundir.Record) {
	at := t0.Add(time.Duration(i) * time.Second)
	return at, []rundir.Record{{Type: rundir.TypeEvent, Time: at, Name: "tick", Cgroup: "/kubepods/pod1", Message: payload}}
}

// A client that stops reading never blocks the publisher: it loses batches, counted, and once
// it reads again each batch says how many it lost just before it.
func TestWatchStuckClientLosesBatches(t *testing.T) {
	s := start(t, Config{}, newFake())
	// A fixed flow-control window (no BDP growth): what the client does not read stays in a
	// known, small buffer, so the stream's sends block early.
	conn, err := grpc.NewClient("unix://"+socketOf(s), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := agentv1.NewAgentClient(conn).Watch(ctx, &agentv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	waitSubscribers(t, s.svc.samples, 1)

	// 5000 batches of 1 KiB: far more than the window and the queue hold. Had one publish
	// blocked on the client, which reads nothing yet, the loop would never end.
	const n = 5000
	payload := strings.Repeat("p", 1<<10)
	for i := range n {
		s.PublishSamples(batchAt(i, payload))
	}
	lost := s.Dropped()
	if lost == 0 || lost >= n {
		t.Fatalf("%d of %d batches lost", lost, n)
	}

	// Now read until a marker published after the n: each batch's time follows the
	// previous one's by its losses and one.
	done := make(chan error, 1)
	var seenLost uint64
	go func() {
		var prev uint64
		for first := true; ; first = false {
			b, err := w.Recv()
			if err != nil {
				done <- err
				return
			}
			seq := uint64(b.Time.AsTime().Sub(t0) / time.Second)
			if first && seq != b.DroppedBatches || !first && seq != prev+1+b.DroppedBatches {
				done <- fmt.Errorf("batch %d after %d with %d lost", seq, prev, b.DroppedBatches)
				return
			}
			prev, seenLost = seq, seenLost+b.DroppedBatches
			if seq >= n {
				done <- nil
				return
			}
		}
	}()
	// Markers until one gets through: the queue may still be full for the first.
	for i := n; ; i++ {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			if seenLost < lost || seenLost > s.Dropped() {
				t.Errorf("the batches said %d were lost, the server counted %d then %d", seenLost, lost, s.Dropped())
			}
			return
		default:
			s.PublishSamples(batchAt(i, payload))
			time.Sleep(time.Millisecond)
		}
	}
}

// A client losing every batch for long enough is disconnected with ResourceExhausted.
func TestWatchStuckClientDisconnected(t *testing.T) {
	s := start(t, Config{}, newFake())
	s.svc.samples.stuckAfter = 0
	c := dial(t, s)
	w, err := c.Watch(context.Background(), &agentv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	waitSubscribers(t, s.svc.samples, 1)
	for i := 0; s.Dropped() == 0; i++ { // the client does not read until the first loss
		s.PublishSamples(batchAt(i, ""))
	}
	for {
		_, err := w.Recv()
		if err != nil {
			if status.Code(err) != codes.ResourceExhausted {
				t.Errorf("stream ended with %v", err)
			}
			return
		}
	}
}

func TestWatchFilters(t *testing.T) {
	s := start(t, Config{}, newFake())
	c := dial(t, s)
	w, err := c.Watch(context.Background(), &agentv1.WatchRequest{Metric: "cpu_usage_seconds", CgroupPrefix: "/kubepods"})
	if err != nil {
		t.Fatal(err)
	}
	waitSubscribers(t, s.svc.samples, 1)
	recs := append(testRecords(t0), rundir.Record{Type: rundir.TypeSample, Time: t0, Metric: "cpu_usage_seconds", Cgroup: "/system.slice/kubelet.service"})
	s.PublishSamples(t0, recs)
	b, err := w.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Records) != 1 || b.Records[0].Cgroup != "/kubepods/pod1" || !b.Time.AsTime().Equal(t0) || b.DroppedBatches != 0 {
		t.Errorf("got %v", b)
	}
}

func TestWatchIncidents(t *testing.T) {
	s := start(t, Config{}, newFake())
	c := dial(t, s)
	w, err := c.WatchIncidents(context.Background(), &agentv1.WatchIncidentsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	waitSubscribers(t, s.svc.incidents, 1)
	inc := testIncident("inc-3")
	inc.State = "open"
	s.PublishIncident(inc)
	inc.State = "closed" // the agent goes on with its own copy
	s.PublishIncident(inc)
	for _, want := range []string{"open", "closed"} {
		got, err := w.Recv()
		if err != nil {
			t.Fatal(err)
		}
		inc.State = want
		if !proto.Equal(got, inc) {
			t.Errorf("got %v, want %v", got, inc)
		}
	}
}

// One connection holds maxStreamsPerConn calls at once: with that many watches open, a
// further call waits (here until its deadline) and goes through once a watch ends.
func TestStreamsPerConnectionBounded(t *testing.T) {
	s := start(t, Config{}, newFake())
	c := dial(t, s)
	var cancels []context.CancelFunc
	for range maxStreamsPerConn {
		ctx, cancel := context.WithCancel(context.Background())
		cancels = append(cancels, cancel)
		if _, err := c.WatchIncidents(ctx, &agentv1.WatchIncidentsRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		for _, cancel := range cancels {
			cancel()
		}
	}()
	waitSubscribers(t, s.svc.incidents, maxStreamsPerConn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_, err := c.GetStatus(ctx, &agentv1.GetStatusRequest{})
	cancel()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a call beside %d open watches: %v, want it held until its deadline", maxStreamsPerConn, err)
	}
	cancels[0]()
	if _, err := c.GetStatus(context.Background(), &agentv1.GetStatusRequest{}); err != nil {
		t.Errorf("a call once a watch ended: %v", err)
	}
}

// Closing the server ends the watches with Unavailable.
func TestCloseEndsWatches(t *testing.T) {
	s := start(t, Config{}, newFake())
	c := dial(t, s)
	w, err := c.WatchIncidents(context.Background(), &agentv1.WatchIncidentsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	waitSubscribers(t, s.svc.incidents, 1)
	s.Close()
	if _, err := w.Recv(); status.Code(err) != codes.Unavailable {
		t.Errorf("after Close: %v", err)
	}
}

// panicky is a backend whose Status and Query trip a bug.
type panicky struct{ *fakeBackend }

func (panicky) Status(context.Context) (*agentv1.Status, error) { panic("status bug") }
func (panicky) Query(context.Context, time.Time, time.Time, time.Duration, string, string, func([]rundir.Record) error) error {
	panic("query bug")
}

// A request that panics fails alone with Internal; the server goes on answering.
func TestPanickingRequestFailsAlone(t *testing.T) {
	c := dial(t, start(t, Config{}, panicky{newFake()}))
	ctx := context.Background()
	if _, err := c.GetStatus(ctx, &agentv1.GetStatusRequest{}); status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "status bug") {
		t.Errorf("GetStatus of a panicking backend: %v, want Internal naming the panic", err)
	}
	stream, err := c.Query(ctx, &agentv1.QueryRequest{From: ts(0), To: ts(time.Hour)})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "query bug") {
		t.Errorf("Query of a panicking backend: %v, want Internal naming the panic", err)
	}
	if _, err := c.GetMeta(ctx, &agentv1.GetMetaRequest{}); err != nil {
		t.Errorf("GetMeta after two panics: %v", err)
	}
}
