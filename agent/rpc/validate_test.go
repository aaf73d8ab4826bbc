package rpc

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/nodectl/nodectl/api/agent/v1"
)

var t0 = time.Date(2026, 5, 4, 10, 0, 0, 0, time.UTC)

func ts(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(t0.Add(d)) }

// wantInvalid checks that err is InvalidArgument naming field.
func wantInvalid(t *testing.T, err error, field string) {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != codes.InvalidArgument || !strings.HasPrefix(st.Message(), field+": ") {
		t.Errorf("error %v, want InvalidArgument naming %s", err, field)
	}
}

func TestValidateNamesTheField(t *testing.T) {
	badTime := &timestamppb.Timestamp{Seconds: math.MaxInt64}
	for _, c := range []struct {
		name  string
		err   error
		field string
	}{
		{"query nil", errOf(validateQuery(nil)), "from"},
		{"query no to", errOf(validateQuery(&agentv1.QueryRequest{From: ts(0)})), "to"},
		{"query bad from", errOf(validateQuery(&agentv1.QueryRequest{From: badTime, To: ts(0)})), "from"},
		{"query to before from", errOf(validateQuery(&agentv1.QueryRequest{From: ts(time.Hour), To: ts(0)})), "to"},
		{"query empty window", errOf(validateQuery(&agentv1.QueryRequest{From: ts(0), To: ts(0)})), "to"},
		{"query too long", errOf(validateQuery(&agentv1.QueryRequest{From: ts(0), To: ts(MaxQueryWindow + 1)})), "to"},
		{"query negative step", errOf(validateQuery(&agentv1.QueryRequest{From: ts(0), To: ts(time.Hour), Step: durationpb.New(-time.Second)})), "step"},
		{"query bad step", errOf(validateQuery(&agentv1.QueryRequest{From: ts(0), To: ts(time.Hour), Step: &durationpb.Duration{Seconds: 1, Nanos: -1}})), "step"},
		{"query relative prefix", errOf(validateQuery(&agentv1.QueryRequest{From: ts(0), To: ts(time.Hour), CgroupPrefix: "kubepods"})), "cgroup_prefix"},
		{"analyze nil", errOf(validateAnalyze(nil)), "from"},
		{"analyze too long", errOf(validateAnalyze(&agentv1.AnalyzeRequest{From: ts(0), To: ts(MaxAnalyzeWindow + 1)})), "to"},
		{"analyze negative baseline", errOf(validateAnalyze(&agentv1.AnalyzeRequest{From: ts(0), To: ts(time.Hour), Baseline: durationpb.New(-1)})), "baseline"},
		{"analyze long baseline", errOf(validateAnalyze(&agentv1.AnalyzeRequest{From: ts(0), To: ts(time.Hour), Baseline: durationpb.New(MaxBaseline + 1)})), "baseline"},
		{"analyze relative cgroup", errOf(validateAnalyze(&agentv1.AnalyzeRequest{From: ts(0), To: ts(time.Hour), Cgroup: "victim"})), "cgroup"},
		{"list limit", listErr(&agentv1.ListIncidentsRequest{Limit: MaxListLimit + 1}), "limit"},
		{"list bad since", listErr(&agentv1.ListIncidentsRequest{Since: badTime}), "since"},
		{"get nil", errOf(validateGetIncident(nil)), "id"},
		{"get long id", errOf(validateGetIncident(&agentv1.GetIncidentRequest{Id: strings.Repeat("x", maxIncidentIDSize+1)})), "id"},
		{"watch relative prefix", errOf(validateWatch(&agentv1.WatchRequest{CgroupPrefix: "a/b"})), "cgroup_prefix"},
	} {
		t.Run(c.name, func(t *testing.T) { wantInvalid(t, c.err, c.field) })
	}
}

func errOf[T any](_ T, err error) error { return err }

func listErr(r *agentv1.ListIncidentsRequest) error {
	_, _, err := validateList(r)
	return err
}

func TestValidateDefaults(t *testing.T) {
	q, err := validateQuery(&agentv1.QueryRequest{From: ts(0), To: ts(time.Hour), CgroupPrefix: "/kubepods/"})
	if err != nil || q.step != 0 || q.cgroupPrefix != "/kubepods" || !q.from.Equal(t0) {
		t.Errorf("query: %+v, %v", q, err)
	}
	since, limit, err := validateList(&agentv1.ListIncidentsRequest{})
	if err != nil || !since.IsZero() || limit != DefaultListLimit {
		t.Errorf("list: %v %d %v", since, limit, err)
	}
	if _, limit, _ := validateList(&agentv1.ListIncidentsRequest{Limit: MaxListLimit}); limit != MaxListLimit {
		t.Errorf("list at the bound: limit %d", limit)
	}
}

func TestCgroupUnder(t *testing.T) {
	for _, c := range []struct {
		cgroup, prefix string
		want           bool
	}{
		{"/a/b", "/a", true},
		{"/a", "/a", true},
		{"/ab", "/a", false},
		{"/a/b/c", "/a/b", true},
		{"", "/", false},
		{"/x", "/", true},
		{"", "/a", false},
	} {
		if got := CgroupUnder(c.cgroup, c.prefix); got != c.want {
			t.Errorf("CgroupUnder(%q, %q) = %v", c.cgroup, c.prefix, got)
		}
	}
}

// fuzzRequest feeds arbitrary bytes to a validator as a request of type M: it must not panic,
// and must either accept the request (check then holds) or refuse it as InvalidArgument
// naming one of fields.
func fuzzRequest[M proto.Message](f *testing.F, seeds []M, fields []string, validate func(M) (func() string, error)) {
	for _, s := range seeds {
		b, err := proto.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0x02, 0x08, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		var zero M
		m := zero.ProtoReflect().New().Interface().(M)
		if proto.Unmarshal(b, m) != nil {
			return
		}
		broken, err := validate(m)
		if err == nil {
			if why := broken(); why != "" {
				t.Fatalf("accepted %v: %s", m, why)
			}
			return
		}
		st, _ := status.FromError(err)
		field, _, _ := strings.Cut(st.Message(), ": ")
		if st.Code() != codes.InvalidArgument || !slices.Contains(fields, field) {
			t.Fatalf("refused %v with %v", m, err)
		}
	})
}

// window's invariants, "" when they hold.
func badWindow(from, to time.Time, max time.Duration) string {
	if !to.After(from) || to.Sub(from) > max {
		return "window " + from.String() + " to " + to.String()
	}
	return ""
}

func FuzzValidateQuery(f *testing.F) {
	fuzzRequest(f, []*agentv1.QueryRequest{
		{From: ts(0), To: ts(time.Hour), Step: durationpb.New(time.Second), Metric: "m", CgroupPrefix: "/a"},
		{From: ts(time.Hour), To: ts(0)},
		{From: &timestamppb.Timestamp{Seconds: -1 << 40}, To: ts(0)},
	}, []string{"from", "to", "step", "cgroup_prefix"}, func(r *agentv1.QueryRequest) (func() string, error) {
		a, err := validateQuery(r)
		return func() string {
			if a.step < 0 || (a.cgroupPrefix != "" && a.cgroupPrefix[0] != '/') {
				return "step or prefix"
			}
			return badWindow(a.from, a.to, MaxQueryWindow)
		}, err
	})
}

func FuzzValidateAnalyze(f *testing.F) {
	fuzzRequest(f, []*agentv1.AnalyzeRequest{
		{From: ts(0), To: ts(time.Minute), Baseline: durationpb.New(time.Minute), Cgroup: "/v"},
		{From: ts(0), To: ts(time.Minute), Baseline: &durationpb.Duration{Seconds: -1, Nanos: 5}},
	}, []string{"from", "to", "baseline", "cgroup"}, func(r *agentv1.AnalyzeRequest) (func() string, error) {
		a, err := validateAnalyze(r)
		return func() string {
			if a.baseline < 0 || a.baseline > MaxBaseline {
				return "baseline"
			}
			return badWindow(a.from, a.to, MaxAnalyzeWindow)
		}, err
	})
}

func FuzzValidateListIncidents(f *testing.F) {
	fuzzRequest(f, []*agentv1.ListIncidentsRequest{{Since: ts(0), Limit: 5}, {Limit: math.MaxUint32}},
		[]string{"since", "limit"}, func(r *agentv1.ListIncidentsRequest) (func() string, error) {
			_, limit, err := validateList(r)
			return func() string {
				if limit < 1 || limit > MaxListLimit {
					return "limit"
				}
				return ""
			}, err
		})
}

func FuzzValidateGetIncident(f *testing.F) {
	fuzzRequest(f, []*agentv1.GetIncidentRequest{{Id: "inc-1"}, {}}, []string{"id"},
		func(r *agentv1.GetIncidentRequest) (func() string, error) {
			id, err := validateGetIncident(r)
			return func() string {
				if id == "" || len(id) > maxIncidentIDSize {
					return "id"
				}
				return ""
			}, err
		})
}

func FuzzValidateWatch(f *testing.F) {
	fuzzRequest(f, []*agentv1.WatchRequest{{Metric: "m", CgroupPrefix: "/a/../b"}, {CgroupPrefix: "x"}}, []string{"cgroup_prefix"},
		func(r *agentv1.WatchRequest) (func() string, error) {
			w, err := validateWatch(r)
			return func() string {
				if w.cgroupPrefix != "" && w.cgroupPrefix[0] != '/' {
					return "prefix"
				}
				return ""
			}, err
		})
}
