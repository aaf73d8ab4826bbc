package agent

import (
	"context"
	"errors"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodectl/nodectl/agent/recorded"
	"github.com/nodectl/nodectl/agent/rpc"
	agentv1 "github.com/nodectl/nodectl/api/agent/v1"
	"github.com/nodectl/nodectl/rundir"
)

// backend answers the gRPC API from the agent.
type backend struct {
	a   *Agent
	srv func() *rpc.Server // the server, for its watchers' drops; set once it listens
}

var _ rpc.Backend = backend{}

func (b backend) Status(context.Context) (*agentv1.Status, error) {
	var watchDrops uint64
	if s := b.srv(); s != nil {
		watchDrops = s.Dropped()
	}
	return StatusToProto(b.a.Status(watchDrops), b.a.Meta()), nil
}

// StatusToProto is the API's form of a status.
func StatusToProto(st Status, meta rundir.Meta) *agentv1.Status {
	p := &agentv1.Status{Version: st.Version, StartTime: timestamppb.New(st.Started), Node: meta.Node, Kernel: meta.Kernel,
		Tracer: st.Programs, TrackedCgroups: uint64(st.TrackedCgroups), OverflowCgroups: uint64(st.OverflowCgroups),
		RssBytes: st.RSSBytes, IncidentsOpen: uint64(st.IncidentsOpen), IncidentsTotal: uint64(st.IncidentsTotal)}
	for _, prog := range sortedKeys(st.MapFill) {
		// The tracer knows its fullest map's fill, not its entries: per mille of it.
		p.Maps = append(p.Maps, &agentv1.MapFill{Program: prog, Map: "fullest keyed by cgroup", Fill: st.MapFill[prog]})
	}
	for _, stage := range sortedKeys(st.Drops) {
		for _, what := range sortedKeys(st.Drops[stage]) {
			p.Drops = append(p.Drops, &agentv1.Drop{Stage: stage, What: what, Count: st.Drops[stage][what]})
		}
	}
	s := st.Store
	p.Store = &agentv1.Store{Bytes: uint64(s.Bytes), Segments: uint64(s.Segments), Writable: s.Writable, LastError: s.LastError,
		WriteFailures: uint64(s.WriteFailures), TornBytes: uint64(s.TornBytes), PinnedBytes: uint64(s.PinnedBytes)}
	if !s.Oldest.IsZero() {
		p.Store.Oldest, p.Store.Newest = timestamppb.New(s.Oldest), timestamppb.New(s.Newest)
	}
	if !s.LastErrorTime.IsZero() {
		p.Store.LastErrorTime = timestamppb.New(s.LastErrorTime)
	}
	return p
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func (b backend) Query(ctx context.Context, from, to time.Time, step time.Duration, metric, prefix string, fn func([]rundir.Record) error) error {
	const chunk = 2048
	buf := make([]rundir.Record, 0, chunk)
	err := b.a.Read(from, to, step, func(r rundir.Record) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		if metric != "" && r.Metric != metric || prefix != "" && !rpc.CgroupUnder(r.Cgroup, prefix) {
			return nil
		}
		if buf = append(buf, r); len(buf) == chunk {
			err := fn(buf)
			buf = make([]rundir.Record, 0, chunk)
			return err
		}
		return nil
	})
	if err == nil && len(buf) > 0 {
		err = fn(buf)
	}
	return err
}

func (b backend) Meta() rundir.Meta { return b.a.Meta() }

func (b backend) Analyze(ctx context.Context, from, to time.Time, baseline time.Duration, cgroup string) (*agentv1.Report, error) {
	if baseline == 0 {
		baseline = b.a.cfg.Windows.Baseline
	}
	w := recorded.Window{BaselineFrom: from.Add(-baseline), From: from, To: to, Cgroup: cgroup}
	rep, err := b.a.Analyze(ctx, w)
	switch {
	case errors.Is(err, errBusy):
		return nil, status.Error(codes.ResourceExhausted, err.Error())
	case ctx.Err() != nil && err != nil:
		return nil, status.FromContextError(ctx.Err()).Err()
	case err != nil:
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	return recorded.ReportToProto(rep), nil
}

func (b backend) Incidents(since time.Time, limit int) []*agentv1.Incident {
	var out []*agentv1.Incident
	for _, in := range b.a.Incidents(since, limit) {
		out = append(out, recorded.IncidentToProto(in))
	}
	return out
}

func (b backend) Incident(id string) (*agentv1.Incident, bool) {
	in, ok := b.a.Incident(id)
	if !ok {
		return nil, false
	}
	return recorded.IncidentToProto(in), true
}
