package rpc

import (
	"math"
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/nodectl/nodectl/api/agent/v1"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

// testRecords has one record of each shape: value, histogram with labels, phase, event.
func testRecords(at time.Time) []rundir.Record {
	v := 0.25
	return []rundir.Record{
		{Type: rundir.TypeSample, Time: at, Metric: "cpu_usage_seconds", Cgroup: "/kubepods/pod1", Workload: "web", Value: &v},
		{Type: rundir.TypeSample, Time: at.Add(time.Nanosecond), Metric: "runq_latency_seconds", Cgroup: "/kubepods/pod2",
			Labels: map[string]string{"cpu": "3"}, Hist: &hist.Log2{Buckets: []uint64{0, 4, 1}, Count: 5, SumNs: 17}},
		{Type: rundir.TypePhase, Time: at.Add(time.Second), Name: rundir.PhaseStress, Event: rundir.EventStart},
		{Type: rundir.TypeEvent, Time: at.Add(2 * time.Second), Name: "oom_kill", Cgroup: "/kubepods/pod1", Message: "pid 7 (java)"},
	}
}

func TestRecordRoundTrip(t *testing.T) {
	for _, r := range testRecords(t0.Add(123456789)) {
		b, err := proto.Marshal(RecordToProto(r))
		if err != nil {
			t.Fatal(err)
		}
		var p agentv1.Record
		if err := proto.Unmarshal(b, &p); err != nil {
			t.Fatal(err)
		}
		got, err := RecordFromProto(&p)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, r) {
			t.Errorf("round trip:\n got %+v\nwant %+v", got, r)
		}
	}
}

func TestRecordFromProtoRefuses(t *testing.T) {
	for name, p := range map[string]*agentv1.Record{
		"nil":          nil,
		"no time":      {Type: rundir.TypeSample},
		"bad time":     {Time: &timestamppb.Timestamp{Nanos: -1}},
		"long buckets": {Time: timestamppb.New(t0), Hist: &agentv1.Histogram{Buckets: make([]uint64, hist.Slots+1)}},
	} {
		if _, err := RecordFromProto(p); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func FuzzRecordFromProto(f *testing.F) {
	for _, r := range testRecords(t0) {
		b, _ := proto.Marshal(RecordToProto(r))
		f.Add(b)
	}
	f.Add([]byte{0x42, 0x03, 0x0a, 0x01, 0x07})
	f.Fuzz(func(t *testing.T, b []byte) {
		var p agentv1.Record
		if proto.Unmarshal(b, &p) != nil {
			return
		}
		r, err := RecordFromProto(&p)
		if err != nil {
			return
		}
		if r.Hist != nil && len(r.Hist.Buckets) > hist.Slots {
			t.Fatalf("%d buckets", len(r.Hist.Buckets))
		}
		if r.Value != nil && math.IsNaN(*r.Value) {
			return // NaN is not equal to itself
		}
		again, err := RecordFromProto(RecordToProto(r))
		if err != nil || !reflect.DeepEqual(again, r) {
			t.Fatalf("not stable: %+v then %+v (%v)", r, again, err)
		}
	})
}
