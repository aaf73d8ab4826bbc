// Package agentsrc reaches the agent's flight recorder for the CLI: through the running
// agent's API, or straight from a data directory when the agent is dead or the directory was
// copied off a broken node (--data-dir).
package agentsrc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodectl/nodectl/agent/flightrec"
	"github.com/nodectl/nodectl/agent/recorded"
	"github.com/nodectl/nodectl/agent/rpc"
	"github.com/nodectl/nodectl/analyzer"
	agentv1 "github.com/nodectl/nodectl/api/agent/v1"
	"github.com/nodectl/nodectl/cli/internal/remote"
	"github.com/nodectl/nodectl/report"
	"github.com/nodectl/nodectl/rundir"
)

// Flags say how to reach the recorder.
type Flags struct {
	DataDir string
	Dial    rpc.DialConfig
}

// Register adds the flags.
func (f *Flags) Register(fs *pflag.FlagSet) {
	fs.StringVar(&f.DataDir, "data-dir", "", "read the agent's data directory directly (the agent dead, or a copy off a broken node) instead of asking the running agent")
	DialFlags(fs, &f.Dial)
}

// DialFlags adds the flags that say where the running agent is.
func DialFlags(fs *pflag.FlagSet, d *rpc.DialConfig) {
	fs.StringVar(&d.Socket, "socket", rpc.DefaultSocket, "the agent's unix socket")
	fs.StringVar(&d.TCP, "agent-tcp", "", "the agent's TCP address (host:port, mTLS) instead of its socket")
	fs.StringVar(&d.CertFile, "tls-cert", "", "client certificate (PEM) for --agent-tcp")
	fs.StringVar(&d.KeyFile, "tls-key", "", "client key (PEM) for --agent-tcp")
	fs.StringVar(&d.CAFile, "tls-ca", "", "CA certificates (PEM) the agent's certificate must chain to, for --agent-tcp")
}

// Recorder is the flight recorder, however reached.
type Recorder interface {
	// Analyze is the analyzer's report on a window (Window.BaselineFrom before From).
	Analyze(ctx context.Context, w recorded.Window) (*analyzer.Report, error)
	// Incidents lists the incidents, newest first.
	Incidents(ctx context.Context, since time.Time, limit int) ([]recorded.Incident, error)
	// Export writes a window as a run directory.
	Export(ctx context.Context, w recorded.Window, dir string) error
	Close() error
}

// Open reaches the recorder the flags name: cmd's --node one through the API server, else a
// data directory or the local agent.
func Open(cmd *cobra.Command, f Flags) (Recorder, error) {
	ctx := cmd.Context()
	if remote.FromCommand(cmd).Node != "" {
		if f.DataDir != "" {
			return nil, fmt.Errorf("--data-dir and --%s: choose one (--data-dir reads a directory on this machine)", remote.FlagNode)
		}
		c, closer, err := Dial(cmd, f.Dial)
		if err != nil {
			return nil, err
		}
		return &remoteAgent{c: c, closer: closer}, nil
	}
	if f.DataDir != "" {
		rd, err := flightrec.OpenReader(f.DataDir)
		if err != nil {
			return nil, err
		}
		meta, err := recorded.ReadMeta(f.DataDir)
		if err != nil {
			return nil, err
		}
		return &dataDir{dir: f.DataDir, rd: rd, meta: meta}, nil
	}
	c, closer, err := rpc.Dial(ctx, f.Dial)
	if err != nil {
		return nil, fmt.Errorf("%w (or read a data directory with --data-dir)", err)
	}
	return &remoteAgent{c: c, closer: closer}, nil
}

// Dial connects to the running agent: cmd's --node one through the API server, else the one
// d names.
func Dial(cmd *cobra.Command, d rpc.DialConfig) (agentv1.AgentClient, io.Closer, error) {
	rf := remote.FromCommand(cmd)
	if rf.Node == "" {
		return rpc.Dial(cmd.Context(), d)
	}
	for _, name := range []string{"socket", "agent-tcp"} {
		if fl := cmd.Flags().Lookup(name); fl != nil && fl.Changed {
			return nil, nil, fmt.Errorf("--%s and --%s: choose one (--%s reaches the node's agent through the API server)", name, remote.FlagNode, remote.FlagNode)
		}
	}
	c, err := remote.Connect(rf)
	if err != nil {
		return nil, nil, err
	}
	return c.DialAgent(cmd.Context(), rf.Node)
}

// dataDir reads a data directory.
type dataDir struct {
	dir  string
	rd   *flightrec.Reader
	meta rundir.Meta
}

func (d *dataDir) Analyze(_ context.Context, w recorded.Window) (*analyzer.Report, error) {
	b, err := recorded.AnalyzeWindow(d.rd, d.meta, w)
	if err != nil {
		return nil, err
	}
	return decodeReport(b)
}

func (d *dataDir) Incidents(_ context.Context, since time.Time, limit int) ([]recorded.Incident, error) {
	all, err := recorded.ReadIncidents(d.dir)
	if err != nil {
		return nil, err
	}
	var out []recorded.Incident
	for _, in := range all {
		if !in.Opened.Before(since) && (limit <= 0 || len(out) < limit) {
			out = append(out, in)
		}
	}
	return out, nil
}

func (d *dataDir) Export(_ context.Context, w recorded.Window, dir string) error {
	return w.Export(d.rd, d.meta, dir)
}

func (d *dataDir) Close() error { return nil }

// FromClient is the recorder of an agent already connected to; its Close closes closer (nil:
// nothing).
func FromClient(c agentv1.AgentClient, closer io.Closer) Recorder {
	return &remoteAgent{c: c, closer: closer}
}

// remoteAgent asks the running agent.
type remoteAgent struct {
	c      agentv1.AgentClient
	closer io.Closer
}

func (r *remoteAgent) Analyze(ctx context.Context, w recorded.Window) (*analyzer.Report, error) {
	resp, err := r.c.Analyze(ctx, &agentv1.AnalyzeRequest{From: timestamppb.New(w.From), To: timestamppb.New(w.To),
		Baseline: durationpb.New(w.From.Sub(w.BaselineFrom)), Cgroup: w.Cgroup})
	if err != nil {
		return nil, err
	}
	return decodeReport([]byte(resp.GetReportJson()))
}

func (r *remoteAgent) Incidents(ctx context.Context, since time.Time, limit int) ([]recorded.Incident, error) {
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
	var out []recorded.Incident
	for _, p := range resp.GetIncidents() {
		out = append(out, recorded.IncidentFromProto(p))
	}
	return out, nil
}

// Export reads the window through Query and writes it as the data directory's export would.
func (r *remoteAgent) Export(ctx context.Context, w recorded.Window, dir string) error {
	resp, err := r.c.GetMeta(ctx, &agentv1.GetMetaRequest{})
	if err != nil {
		return err
	}
	var meta rundir.Meta
	if err := json.Unmarshal([]byte(resp.GetMetaJson()), &meta); err != nil {
		return fmt.Errorf("reading the agent's meta: %w", err)
	}
	return w.Export(&querySource{ctx: ctx, c: r.c}, meta, dir)
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

func decodeReport(b []byte) (*analyzer.Report, error) {
	var rep analyzer.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, fmt.Errorf("reading the agent's report: %w", err)
	}
	return &rep, nil
}

// ParseTime reads a time flag: RFC 3339 ("2026-12-01T03:00:00Z"), "now", or a duration
// before now ("-15m", "15m").
func ParseTime(flag, s string, now time.Time) (time.Time, error) {
	if s == "now" {
		return now, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		if d > 0 {
			d = -d
		}
		return now.Add(d), nil
	}
	return time.Time{}, fmt.Errorf("--%s %q: want an RFC 3339 time (2026-12-01T03:00:00Z), now, or a duration before now (15m)", flag, s)
}

// ParseWindow reads the window flags: --from and --to (ParseTime), the --baseline before
// --from, and the --cgroup under examination.
func ParseWindow(from, to string, baseline time.Duration, cgroup string, now time.Time) (recorded.Window, error) {
	if from == "" {
		return recorded.Window{}, fmt.Errorf("--from is required: the window's start (RFC 3339, or a duration before now: 30m)")
	}
	f, err := ParseTime("from", from, now)
	if err != nil {
		return recorded.Window{}, err
	}
	t, err := ParseTime("to", to, now)
	if err != nil {
		return recorded.Window{}, err
	}
	if !t.After(f) {
		return recorded.Window{}, fmt.Errorf("--to %s is not after --from %s", t.Format(time.RFC3339), f.Format(time.RFC3339))
	}
	if baseline <= 0 {
		return recorded.Window{}, fmt.Errorf("--baseline %s: must be more than 0", baseline)
	}
	return recorded.Window{BaselineFrom: f.Add(-baseline), From: f, To: t, Cgroup: cgroup}, nil
}

// WriteHTML writes the HTML report (package report) of a window of the flight recorder: the
// window is exported to a temporary run directory, for the charts' records, removed after.
func WriteHTML(ctx context.Context, rec Recorder, w recorded.Window, rep *analyzer.Report, path string) error {
	dir, err := os.MkdirTemp("", "nodectl-window-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	run := filepath.Join(dir, "run")
	if err := rec.Export(ctx, w, run); err != nil {
		return fmt.Errorf("--html: exporting the window: %w", err)
	}
	r, err := rundir.Open(run)
	if err != nil {
		return err
	}
	return report.WriteFile(path, report.FromRun(r, rep))
}
