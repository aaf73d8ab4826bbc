package recorded

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodectl/nodectl/agent/flightrec"
	"github.com/nodectl/nodectl/agent/rpc"
	"github.com/nodectl/nodectl/analyzer"
	agentv1 "github.com/nodectl/nodectl/api/agent/v1"
	"github.com/nodectl/nodectl/rundir"
)

// Recorder is the agent's flight recorder however reached: a data directory read offline
// (OpenDataDir: the agent dead, or its disk copied off a broken node) or a running agent's API
// (FromAgent). A window is read once: w.Run(rec.Source(ctx), meta) holds it in memory for the
// analyzer and the HTML report alike; Analyze has it read and analyzed where the recorder is.
type Recorder interface {
	// Meta is the agent's meta now: its node, interval, pods and daemons.
	Meta(ctx context.Context) (rundir.Meta, error)
	// Source reads the recorder's records.
	Source(ctx context.Context) Source
	// Analyze is the analyzer's report on a window, read and analyzed beside the recorder.
	Analyze(ctx context.Context, w Window) (*analyzer.Report, error)
	// Incidents lists the incidents opened at or after since (zero: all), newest first, at
	// most limit of them (0: all the recorder gives).
	Incidents(ctx context.Context, since time.Time, limit int) ([]Incident, error)
	// Incident is the incident of that id; false when the recorder has none.
	Incident(ctx context.Context, id string) (Incident, bool, error)
	Close() error
}

// OpenDataDir reads the agent's data directory.
func OpenDataDir(dir string) (Recorder, error) {
	rd, err := flightrec.OpenReader(dir)
	if err != nil {
		return nil, err
	}
	meta, err := ReadMeta(dir)
	if err != nil {
		return nil, err
	}
	return &dataDir{dir: dir, rd: rd, meta: meta}, nil
}

// dataDir reads a data directory.
type dataDir struct {
	dir  string
	rd   *flightrec.Reader
	meta rundir.Meta
}

func (d *dataDir) Meta(context.Context) (rundir.Meta, error) { return d.meta, nil }

func (d *dataDir) Source(context.Context) Source { return d.rd }

// Analyze reads the window as the agent would (Bounded), so that the same window gets the same
// analysis offline as from the running agent, in as little memory.
func (d *dataDir) Analyze(_ context.Context, w Window) (*analyzer.Report, error) {
	sp, err := d.rd.Span()
	if err != nil {
		return nil, err
	}
	if w, err = w.Bounded(d.rd, d.meta, sp.Series); err != nil {
		return nil, err
	}
	return AnalyzeWindow(d.rd, d.meta, w)
}

func (d *dataDir) Incidents(_ context.Context, since time.Time, limit int) ([]Incident, error) {
	all, err := ReadIncidents(d.dir)
	if err != nil {
		return nil, err
	}
	var out []Incident
	for _, in := range all {
		if !in.Opened.Before(since) && (limit <= 0 || len(out) < limit) {
			out = append(out, in)
		}
	}
	return out, nil
}

func (d *dataDir) Incident(_ context.Context, id string) (Incident, bool, error) {
	all, err := ReadIncidents(d.dir)
	if err != nil {
		return Incident{}, false, err
	}
	for _, in := range all {
		if in.ID == id {
			return in, true, nil
		}
	}
	return Incident{}, false, nil
}

func (d *dataDir) Close() error { return nil }

// FromAgent is the recorder of a running agent, through its API; Close closes closer (nil:
// nothing).
func FromAgent(c agentv1.AgentClient, closer io.Closer) Recorder {
	return &remoteAgent{c: c, closer: closer}
}

// remoteAgent asks the running agent.
type remoteAgent struct {
	c      agentv1.AgentClient
	closer io.Closer
}

func (r *remoteAgent) Meta(ctx context.Context) (rundir.Meta, error) {
	var m rundir.Meta
	resp, err := r.c.GetMeta(ctx, &agentv1.GetMetaRequest{})
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal([]byte(resp.GetMetaJson()), &m); err != nil {
		return m, fmt.Errorf("reading the agent's meta: %w", err)
	}
	return m, nil
}

func (r *remoteAgent) Source(ctx context.Context) Source { return &querySource{ctx: ctx, c: r.c} }

func (r *remoteAgent) Analyze(ctx context.Context, w Window) (*analyzer.Report, error) {
	resp, err := r.c.Analyze(ctx, &agentv1.AnalyzeRequest{From: timestamppb.New(w.From), To: timestamppb.New(w.To),
		Baseline: durationpb.New(w.From.Sub(w.BaselineFrom)), Cgroup: w.Cgroup})
	if err != nil {
		return nil, err
	}
	if resp.GetReport() == nil {
		return nil, errors.New("the agent answered the analysis without a report")
	}
	return ReportFromProto(resp.GetReport())
}

func (r *remoteAgent) Incidents(ctx context.Context, since time.Time, limit int) ([]Incident, error) {
	// The API lists at most MaxListLimit at once: "all" asks for that.
	if limit <= 0 || limit > rpc.MaxListLimit {
		limit = rpc.MaxListLimit
	}
	req := &agentv1.ListIncidentsRequest{Limit: uint32(limit)}
	if !since.IsZero() {
		req.Since = timestamppb.New(since)
	}
	resp, err := r.c.ListIncidents(ctx, req)
	if err != nil {
		return nil, err
	}
	if n := resp.GetLeftOff(); n > 0 {
		return nil, fmt.Errorf("the agent left the %d oldest of the incidents asked for out of its reply, which would have passed "+
			"its size bound: ask for fewer (--limit) or newer ones (--since)", n)
	}
	var out []Incident
	for _, p := range resp.GetIncidents() {
		// Left out of the list to bound the reply: each comes whole on its own.
		if p.GetReportOmitted() {
			if p, err = r.c.GetIncident(ctx, &agentv1.GetIncidentRequest{Id: p.GetId()}); err != nil {
				return nil, err
			}
		}
		in, err := IncidentFromProto(p)
		if err != nil {
			return nil, err
		}
		out = append(out, in)
	}
	return out, nil
}

func (r *remoteAgent) Incident(ctx context.Context, id string) (Incident, bool, error) {
	p, err := r.c.GetIncident(ctx, &agentv1.GetIncidentRequest{Id: id})
	if status.Code(err) == codes.NotFound {
		return Incident{}, false, nil
	}
	if err != nil {
		return Incident{}, false, err
	}
	in, err := IncidentFromProto(p)
	return in, err == nil, err
}

func (r *remoteAgent) Close() error {
	if r.closer == nil {
		return nil
	}
	return r.closer.Close()
}

// querySource reads the recorder through the API's Query.
type querySource struct {
	ctx context.Context
	c   agentv1.AgentClient
}

func (q *querySource) Read(from, to time.Time, step time.Duration, fn func(rundir.Record) error) error {
	req := &agentv1.QueryRequest{From: timestamppb.New(from), To: timestamppb.New(to)}
	if step > 0 {
		req.Step = durationpb.New(step)
	}
	stream, err := q.c.Query(q.ctx, req)
	if err != nil {
		return err
	}
	for {
		chunk, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		for _, p := range chunk.GetRecords() {
			rec, err := rpc.RecordFromProto(p)
			if err != nil {
				return err
			}
			if err := fn(rec); err != nil {
				return err
			}
		}
	}
}
