// Package rpc serves the node agent's gRPC API (api/agent/v1, docs/api.md) on a unix
// socket and, with mTLS, on TCP: requests are checked here, answered by the agent through
// Backend, and live samples and incidents are fanned out to watchers without ever blocking the
// agent's collector. Dial is the client side, for the CLI.
package rpc

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"runtime/debug"
	"sync"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/nodectl/nodectl/api/agent/v1"
	"github.com/nodectl/nodectl/internal/badvalue"
	"github.com/nodectl/nodectl/rundir"
)

// Backend is the agent behind the API. An error carrying a gRPC status (status.Error) keeps
// its code; a context's error becomes Canceled or DeadlineExceeded; any other is Unknown.
type Backend interface {
	// Status is the agent's view of itself.
	Status(ctx context.Context) (*agentv1.Status, error)
	// Query calls fn with the records of [from, to], oldest first, in as many calls as it
	// likes, down-sampled to one record per series and step when step is not zero, and kept to
	// metric and to the cgroups CgroupUnder cgroupPrefix when they are not empty. The server
	// keeps fn's records until the RPC ends: their labels and histograms must not be reused.
	// An error of fn ends the query: return it.
	Query(ctx context.Context, from, to time.Time, step time.Duration, metric, cgroupPrefix string, fn func([]rundir.Record) error) error
	// Meta describes the agent's recording as a run directory's meta.json would.
	Meta() rundir.Meta
	// Analyze is the analyzer's report of [from, to], compared with the baseline before from
	// (the agent's default when zero), for the victim cgroup (every cgroup when empty).
	Analyze(ctx context.Context, from, to time.Time, baseline time.Duration, cgroup string) (*agentv1.Report, error)
	// Incidents lists at most limit incidents opened at or after since, newest first, in
	// messages of the caller's own: the server leaves reports out of them to bound its reply.
	Incidents(since time.Time, limit int) []*agentv1.Incident
	// Incident is the incident of that id, if the agent has it.
	Incident(id string) (*agentv1.Incident, bool)
}

// DefaultSocket is where the agent listens and the CLI dials.
const DefaultSocket = "/run/nodectl/agent.sock"

// Fan-out bounds (docs/api.md, "Watching"). A watcher may fall watchQueue batches behind; one
// losing every batch for watchStuckAfter is disconnected. An incident watcher cannot lose an
// update and stay right, so it is disconnected at its first loss and lists again.
const (
	watchQueue      = 32
	watchStuckAfter = time.Minute
	incidentQueue   = 64
	maxWatchers     = 64
	// maxStreamsPerConn bounds the calls under way on one client connection.
	maxStreamsPerConn = 32
)

// closeGrace is how long Close lets running RPCs finish before cutting them off.
const closeGrace = 5 * time.Second

// Config says where the API listens.
type Config struct {
	// Socket is the unix socket, mode 0600, in a directory created 0700; DefaultSocket when
	// empty.
	Socket string
	// TCP is an optional host:port served with mTLS only: it needs CertFile, KeyFile and
	// ClientCAFile.
	TCP string
	// CertFile and KeyFile are the agent's certificate and key (PEM) on TCP.
	CertFile, KeyFile string
	// ClientCAFile holds the CA certificates (PEM) that clients' certificates must chain to.
	ClientCAFile string
	// Health is an optional host:port serving the health service alone, in plaintext: the
	// kubelet's gRPC probe can neither dial a unix socket nor do TLS. It answers what the API's
	// health service answers and nothing else.
	Health string
	// Loopback is an optional loopback host:port serving the whole API in plaintext, for
	// the API server's port-forward (the kubelet connects to localhost in the pod's network
	// namespace), so that `nodectl --node` reaches the agent with the user's RBAC and no port
	// opened off the pod. The API only reads, but in a hostNetwork pod every local user of
	// the node could read it too.
	Loopback string
	// Log receives the server's events; slog.Default() when nil.
	Log *slog.Logger
}

// Names of Config's and DialConfig's settings in errors (badvalue.Error's Field); the CLI names
// its flags instead.
const (
	FieldSocket       = "Socket"
	FieldTCP          = "TCP"
	FieldCertFile     = "CertFile"
	FieldKeyFile      = "KeyFile"
	FieldClientCAFile = "ClientCAFile"
	FieldCAFile       = "CAFile"
	FieldHealth       = "Health"
	FieldLoopback     = "Loopback"
)

// Server is the API server. New listens; Serve serves until its context ends or Close.
type Server struct {
	log        *slog.Logger
	health     *health.Server
	svc        *service
	servers    []*grpc.Server // one per listener: the unix socket's has no TLS, TCP's requires it
	lis        []net.Listener
	tcp        net.Addr
	healthAddr net.Addr // the health-only listener's
	loopback   net.Addr

	closeOnce sync.Once
}

// New listens on cfg's socket (and TCP address) for backend. The health service reports
// NOT_SERVING until SetServing(true).
func New(cfg Config, backend Backend) (*Server, error) {
	if cfg.Socket == "" {
		cfg.Socket = DefaultSocket
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	var tcpOpt grpc.ServerOption
	if cfg.TCP != "" {
		creds, err := serverTLS(cfg)
		if err != nil {
			return nil, err
		}
		tcpOpt = grpc.Creds(creds)
	}
	s := &Server{
		log:    cfg.Log,
		health: health.NewServer(),
		svc: &service{
			backend:   backend,
			log:       cfg.Log,
			samples:   newHub[sampleBatch]("sample batch", watchQueue, maxWatchers, watchStuckAfter),
			incidents: newHub[*agentv1.Incident]("incident update", incidentQueue, maxWatchers, 0),
		},
	}
	s.SetServing(false)
	unix, err := listenUnix(cfg.Socket)
	if err != nil {
		return nil, err
	}
	s.add(unix)
	if cfg.TCP != "" {
		tcp, err := net.Listen("tcp", cfg.TCP)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.tcp = tcp.Addr()
		s.add(tcp, tcpOpt)
	}
	if cfg.Loopback != "" {
		l, err := listenLoopback(cfg.Loopback)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.loopback = l.Addr()
		s.add(l)
	}
	if cfg.Health != "" {
		l, err := net.Listen("tcp", cfg.Health)
		if err != nil {
			s.Close()
			return nil, badvalue.New(FieldHealth, cfg.Health, err)
		}
		s.healthAddr = l.Addr()
		g := grpc.NewServer()
		healthpb.RegisterHealthServer(g, s.health)
		s.servers = append(s.servers, g)
		s.lis = append(s.lis, l)
	}
	return s, nil
}

// HealthAddr is the address of the health-only listener (its port when Config.Health asked
// for port 0), nil without one.
func (s *Server) HealthAddr() net.Addr { return s.healthAddr }

// add serves the API and the health service on l.
func (s *Server) add(l net.Listener, opts ...grpc.ServerOption) {
	// Server pings find a frozen or vanished client, whose stuck streams would hold a
	// goroutine and a flow-control window each forever.
	opts = append(opts, grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		// One connection holds at most this many calls at once; more wait for one to end. A
		// client cannot open streams without bound (each a goroutine and buffers).
		grpc.MaxConcurrentStreams(maxStreamsPerConn))
	// A request that trips a bug fails alone, with the panic logged: it must not take the
	// node's agent, and its flight recorder's writer, down with it.
	onPanic := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		method, _ := grpc.Method(ctx)
		s.log.Error("an API request panicked", "method", method, "panic", p, "stack", string(debug.Stack()))
		return status.Errorf(codes.Internal, "%s failed: the agent hit a bug (%v); its log has the stack", method, p)
	})
	opts = append(opts, grpc.ChainUnaryInterceptor(recovery.UnaryServerInterceptor(onPanic)),
		grpc.ChainStreamInterceptor(recovery.StreamServerInterceptor(onPanic)))
	g := grpc.NewServer(opts...)
	agentv1.RegisterAgentServer(g, s.svc)
	healthpb.RegisterHealthServer(g, s.health)
	s.servers = append(s.servers, g)
	s.lis = append(s.lis, l)
}

// LoopbackAddr is the plaintext loopback listener's address, nil without one.
func (s *Server) LoopbackAddr() net.Addr { return s.loopback }

// TCPAddr is the TCP address listened on (its port when Config.TCP asked for port 0), nil
// without TCP.
func (s *Server) TCPAddr() net.Addr { return s.tcp }

// Serve serves until ctx ends or Close is called, then closes the server. It returns the
// first listener's failure, nil on a clean stop.
func (s *Server) Serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, s.Close)
	defer stop()
	errc := make(chan error, len(s.servers))
	for i, g := range s.servers {
		s.log.Info("agent API listening", "addr", s.lis[i].Addr().String())
		go func() { errc <- g.Serve(s.lis[i]) }()
	}
	var first error
	for range s.servers {
		// ErrServerStopped: Close came before this listener's Serve started.
		if err := <-errc; err != nil && !errors.Is(err, grpc.ErrServerStopped) && first == nil {
			first = err
			s.Close()
		}
	}
	return first
}

// Close ends the watch streams, lets running RPCs finish for a while, stops serving and
// removes the socket. It may be called more than once, and without Serve.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		s.health.Shutdown()
		s.svc.samples.close()
		s.svc.incidents.close()
		var wg sync.WaitGroup
		for _, g := range s.servers {
			wg.Go(func() {
				done := make(chan struct{})
				go func() { g.GracefulStop(); close(done) }()
				select {
				case <-done:
				case <-time.After(closeGrace):
					g.Stop()
				}
			})
		}
		wg.Wait()
		// A listener never served is not closed by its server; closing the unix one
		// removes the socket.
		for _, l := range s.lis {
			l.Close()
		}
	})
}

// SetServing sets what the health service answers: SERVING once the agent records, NOT_SERVING
// while it cannot.
func (s *Server) SetServing(ok bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ok {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(agentv1.Agent_ServiceDesc.ServiceName, st)
}

// PublishSamples hands a collection tick's records to the Watch clients and returns at once.
// The server keeps batch: the caller must not change it afterwards.
func (s *Server) PublishSamples(t time.Time, batch []rundir.Record) {
	s.svc.samples.publish(sampleBatch{t: t, records: batch})
}

// PublishIncident hands an incident's new state to the WatchIncidents clients and returns at
// once.
func (s *Server) PublishIncident(inc *agentv1.Incident) {
	if inc != nil {
		// A copy: the agent goes on updating its incident while the streams send this one.
		s.svc.incidents.publish(proto.CloneOf(inc))
	}
}

// Dropped is how many sample batches Watch clients lost, in total since the server started
// (the agent's status reports it as the watch stage's drops).
func (s *Server) Dropped() uint64 { return s.svc.samples.lost.Load() }

// sampleBatch is one PublishSamples call.
type sampleBatch struct {
	t       time.Time
	records []rundir.Record
}

// service answers the RPCs.
type service struct {
	agentv1.UnimplementedAgentServer
	backend   Backend
	log       *slog.Logger
	samples   *hub[sampleBatch]
	incidents *hub[*agentv1.Incident]
}

// chunkBytes bounds a QueryChunk well below gRPC's default 4 MiB message limit.
const chunkBytes = 1 << 20

func (s *service) GetStatus(ctx context.Context, _ *agentv1.GetStatusRequest) (*agentv1.Status, error) {
	return s.backend.Status(ctx)
}

func (s *service) GetMeta(context.Context, *agentv1.GetMetaRequest) (*agentv1.Meta, error) {
	meta, err := json.Marshal(s.backend.Meta())
	if err != nil {
		return nil, status.Errorf(codes.Internal, "meta: %v", err)
	}
	return &agentv1.Meta{MetaJson: string(meta)}, nil
}

func (s *service) Query(req *agentv1.QueryRequest, stream grpc.ServerStreamingServer[agentv1.QueryChunk]) error {
	a, err := validateQuery(req)
	if err != nil {
		return err
	}
	meta, err := json.Marshal(s.backend.Meta())
	if err != nil {
		return status.Errorf(codes.Internal, "meta: %v", err)
	}
	chunk := &agentv1.QueryChunk{MetaJson: string(meta)}
	size := len(meta)
	send := func() error {
		err := stream.Send(chunk)
		chunk, size = &agentv1.QueryChunk{}, 0
		return err
	}
	err = s.backend.Query(stream.Context(), a.from, a.to, a.step, a.metric, a.cgroupPrefix, func(recs []rundir.Record) error {
		for _, r := range recs {
			p := RecordToProto(r)
			n := proto.Size(p)
			if size+n > chunkBytes && len(chunk.Records) > 0 {
				if err := send(); err != nil {
					return err
				}
			}
			chunk.Records = append(chunk.Records, p)
			size += n
		}
		return nil
	})
	if err != nil {
		return err
	}
	if len(chunk.Records) > 0 || chunk.MetaJson != "" {
		return send()
	}
	return nil
}

func (s *service) Analyze(ctx context.Context, req *agentv1.AnalyzeRequest) (*agentv1.AnalyzeResponse, error) {
	a, err := validateAnalyze(req)
	if err != nil {
		return nil, err
	}
	report, err := s.backend.Analyze(ctx, a.from, a.to, a.baseline, a.cgroup)
	if err != nil {
		return nil, err
	}
	return &agentv1.AnalyzeResponse{Report: report}, nil
}

func (s *service) ListIncidents(_ context.Context, req *agentv1.ListIncidentsRequest) (*agentv1.ListIncidentsResponse, error) {
	since, limit, err := validateList(req)
	if err != nil {
		return nil, err
	}
	return boundList(s.backend.Incidents(since, limit)), nil
}

// A ListIncidents reply carries reports up to listReportBytes and incidents up to
// listMaxBytes, within the 4 MiB a gRPC client receives by default: 500 incidents of a busy
// node, each with a report of a few dozen findings, would pass it.
const (
	listReportBytes = 2 << 20
	listMaxBytes    = 3 << 20
)

// boundList is the reply listing incidents (newest first): whole while it fits
// listReportBytes, then without reports (report_omitted), then, past listMaxBytes, without
// the oldest (left_off counts them).
func boundList(incidents []*agentv1.Incident) *agentv1.ListIncidentsResponse {
	resp := &agentv1.ListIncidentsResponse{}
	size := 0
	for i, in := range incidents {
		n := proto.Size(in)
		if in.GetReport() != nil && size+n > listReportBytes {
			in.Report, in.ReportOmitted = nil, true
			n = proto.Size(in)
		}
		// A field's tag and length prefix: a few bytes more than the incident itself.
		if size+n+protowireOverhead > listMaxBytes {
			resp.LeftOff = uint32(len(incidents) - i)
			break
		}
		size += n + protowireOverhead
		resp.Incidents = append(resp.Incidents, in)
	}
	return resp
}

// protowireOverhead bounds the tag and length prefix of a repeated message field's element.
const protowireOverhead = 1 + 5

func (s *service) GetIncident(_ context.Context, req *agentv1.GetIncidentRequest) (*agentv1.Incident, error) {
	id, err := validateGetIncident(req)
	if err != nil {
		return nil, err
	}
	inc, ok := s.backend.Incident(id)
	if !ok {
		return nil, status.Errorf(codes.NotFound, "incident %q: not found", id)
	}
	return inc, nil
}

func (s *service) WatchIncidents(_ *agentv1.WatchIncidentsRequest, stream grpc.ServerStreamingServer[agentv1.Incident]) error {
	return follow(s, s.incidents, stream, func(d delivery[*agentv1.Incident]) *agentv1.Incident { return d.v })
}

func (s *service) Watch(req *agentv1.WatchRequest, stream grpc.ServerStreamingServer[agentv1.SampleBatch]) error {
	f, err := validateWatch(req)
	if err != nil {
		return err
	}
	return follow(s, s.samples, stream, func(d delivery[sampleBatch]) *agentv1.SampleBatch {
		b := &agentv1.SampleBatch{Time: timestamppb.New(d.v.t), DroppedBatches: d.lost}
		for _, r := range d.v.records {
			if f.keeps(r.Metric, r.Cgroup) {
				b.Records = append(b.Records, RecordToProto(r))
			}
		}
		return b
	})
}

// follow streams what h publishes, made into messages by msg, until the client leaves or the
// hub drops it. The sends stay in the handler's goroutine: gRPC forbids sending once the
// handler returned, so a client stuck in flow control is let go only when the keepalive or
// the client itself ends the stream.
func follow[T, M any](s *service, h *hub[T], stream grpc.ServerStreamingServer[M], msg func(delivery[T]) *M) error {
	sub, err := h.subscribe()
	if err != nil {
		return err
	}
	ctx := stream.Context()
	defer func() {
		if lost := h.unsubscribe(sub); lost > 0 {
			who := "unknown"
			if p, ok := peer.FromContext(ctx); ok {
				who = p.Addr.String()
			}
			s.log.Warn("watcher too slow", "peer", who, "lost", lost, "what", h.what)
		}
	}()
	for {
		select {
		case d := <-sub.c:
			if err := stream.Send(msg(d)); err != nil {
				return err
			}
		case <-sub.gone:
			return sub.why
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}
