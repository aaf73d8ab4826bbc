package rpc

import (
	"fmt"
	"path"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/nodectl/nodectl/api/agent/v1"
)

// Bounds of a request: past them a request would make the agent read or hold more than a
// node agent should for one client.
const (
	MaxQueryWindow    = 7 * 24 * time.Hour // the store's retention is days, not weeks
	MaxAnalyzeWindow  = 24 * time.Hour
	MaxBaseline       = 24 * time.Hour
	DefaultListLimit  = 100
	MaxListLimit      = 10000
	maxIncidentIDSize = 256
)

// invalid is the InvalidArgument error of one field of a request.
func invalid(field, format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, "%s: %s", field, fmt.Sprintf(format, args...))
}

// timestamp is a required timestamp field.
func timestamp(field string, ts *timestamppb.Timestamp) (time.Time, error) {
	if ts == nil {
		return time.Time{}, invalid(field, "missing")
	}
	if err := ts.CheckValid(); err != nil {
		return time.Time{}, invalid(field, "invalid timestamp")
	}
	return ts.AsTime(), nil
}

// duration is an optional, non-negative duration of at most max; absent is zero.
func duration(field string, d *durationpb.Duration, max time.Duration) (time.Duration, error) {
	if d == nil {
		return 0, nil
	}
	if err := d.CheckValid(); err != nil {
		return 0, invalid(field, "invalid duration")
	}
	v := d.AsDuration()
	switch {
	case v < 0:
		return 0, invalid(field, "negative")
	case v > max:
		return 0, invalid(field, "longer than %v", max)
	}
	return v, nil
}

// window is a required [from, to] of at most max.
func window(from, to *timestamppb.Timestamp, max time.Duration) (time.Time, time.Time, error) {
	f, err := timestamp("from", from)
	if err != nil {
		return f, f, err
	}
	t, err := timestamp("to", to)
	if err != nil {
		return f, t, err
	}
	switch {
	case t.Before(f):
		return f, t, invalid("to", "before from")
	case t.Equal(f):
		return f, t, invalid("to", "equal to from: the window is empty")
	case t.Sub(f) > max: // Sub saturates: no overflow across the timestamps' range
		return f, t, invalid("to", "window of %v longer than %v", t.Sub(f), max)
	}
	return f, t, nil
}

// cgroupPath is an optional cgroup path, cleaned; it must be absolute, as rundir's are.
func cgroupPath(field, p string) (string, error) {
	if p == "" {
		return "", nil
	}
	if !strings.HasPrefix(p, "/") {
		return "", invalid(field, "%q is not an absolute cgroup path", p)
	}
	return path.Clean(p), nil
}

// queryArgs is a valid QueryRequest.
type queryArgs struct {
	from, to     time.Time
	step         time.Duration
	metric       string
	cgroupPrefix string
}

func validateQuery(r *agentv1.QueryRequest) (queryArgs, error) {
	var a queryArgs
	var err error
	if a.from, a.to, err = window(r.GetFrom(), r.GetTo(), MaxQueryWindow); err != nil {
		return a, err
	}
	if a.step, err = duration("step", r.GetStep(), MaxQueryWindow); err != nil {
		return a, err
	}
	if a.cgroupPrefix, err = cgroupPath("cgroup_prefix", r.GetCgroupPrefix()); err != nil {
		return a, err
	}
	a.metric = r.GetMetric()
	return a, nil
}

// analyzeArgs is a valid AnalyzeRequest.
type analyzeArgs struct {
	from, to time.Time
	baseline time.Duration
	cgroup   string
}

func validateAnalyze(r *agentv1.AnalyzeRequest) (analyzeArgs, error) {
	var a analyzeArgs
	var err error
	if a.from, a.to, err = window(r.GetFrom(), r.GetTo(), MaxAnalyzeWindow); err != nil {
		return a, err
	}
	if a.baseline, err = duration("baseline", r.GetBaseline(), MaxBaseline); err != nil {
		return a, err
	}
	a.cgroup, err = cgroupPath("cgroup", r.GetCgroup())
	return a, err
}

// validateList returns the request's since (zero when absent: every incident) and limit.
func validateList(r *agentv1.ListIncidentsRequest) (time.Time, int, error) {
	var since time.Time
	if r.GetSince() != nil {
		var err error
		if since, err = timestamp("since", r.GetSince()); err != nil {
			return since, 0, err
		}
	}
	switch l := r.GetLimit(); {
	case l == 0:
		return since, DefaultListLimit, nil
	case l > MaxListLimit:
		return since, 0, invalid("limit", "above %d", MaxListLimit)
	default:
		return since, int(l), nil
	}
}

func validateGetIncident(r *agentv1.GetIncidentRequest) (string, error) {
	switch id := r.GetId(); {
	case id == "":
		return "", invalid("id", "empty")
	case len(id) > maxIncidentIDSize:
		return "", invalid("id", "longer than %d bytes", maxIncidentIDSize)
	default:
		return id, nil
	}
}

// watchFilter is a valid WatchRequest.
type watchFilter struct {
	metric       string
	cgroupPrefix string
}

func validateWatch(r *agentv1.WatchRequest) (watchFilter, error) {
	p, err := cgroupPath("cgroup_prefix", r.GetCgroupPrefix())
	return watchFilter{metric: r.GetMetric(), cgroupPrefix: p}, err
}

// keeps says whether the watch wants a record with this metric and cgroup.
func (f watchFilter) keeps(metric, cgroup string) bool {
	return (f.metric == "" || metric == f.metric) && (f.cgroupPrefix == "" || CgroupUnder(cgroup, f.cgroupPrefix))
}

// CgroupUnder says whether cgroup is prefix or below it, path element by path element
// ("/a/b" is under "/a" but "/ab" is not): the meaning of a request's cgroup_prefix, which the
// agent's Query applies as Watch does.
func CgroupUnder(cgroup, prefix string) bool {
	if prefix == "/" {
		return strings.HasPrefix(cgroup, "/")
	}
	rest, ok := strings.CutPrefix(cgroup, prefix)
	return ok && (rest == "" || rest[0] == '/')
}
