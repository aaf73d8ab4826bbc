package rpc

import (
	"fmt"

	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/nodectl/nodectl/api/agent/v1"
	"github.com/nodectl/nodectl/rundir"
	"github.com/nodectl/nodectl/rundir/hist"
)

// RecordToProto is r on the wire. It shares r's labels and histogram buckets rather than copy
// them for every watcher: neither may change while the message is in use.
func RecordToProto(r rundir.Record) *agentv1.Record {
	p := &agentv1.Record{
		Type:     r.Type,
		Time:     timestamppb.New(r.Time),
		Metric:   r.Metric,
		Cgroup:   r.Cgroup,
		Workload: r.Workload,
		Labels:   r.Labels,
		Value:    r.Value,
		Name:     r.Name,
		Event:    r.Event,
		Message:  r.Message,
	}
	if r.Hist != nil {
		p.Hist = &agentv1.Histogram{Buckets: r.Hist.Buckets, Count: r.Hist.Count, SumNs: r.Hist.SumNs}
	}
	return p
}

// RecordFromProto is the record p carries, as a client writes it to a run directory. It
// refuses what no agent sends: a record without a valid time, a histogram with more buckets
// than hist.Slots.
func RecordFromProto(p *agentv1.Record) (rundir.Record, error) {
	if p == nil {
		return rundir.Record{}, fmt.Errorf("record: missing")
	}
	if err := p.GetTime().CheckValid(); err != nil {
		return rundir.Record{}, fmt.Errorf("record time: %w", err)
	}
	r := rundir.Record{
		Type:     p.GetType(),
		Time:     p.GetTime().AsTime(),
		Metric:   p.GetMetric(),
		Cgroup:   p.GetCgroup(),
		Workload: p.GetWorkload(),
		Name:     p.GetName(),
		Event:    p.GetEvent(),
		Message:  p.GetMessage(),
	}
	if len(p.GetLabels()) > 0 {
		r.Labels = p.GetLabels()
	}
	if p.Value != nil {
		v := p.GetValue()
		r.Value = &v
	}
	if h := p.GetHist(); h != nil {
		if len(h.GetBuckets()) > hist.Slots {
			return rundir.Record{}, fmt.Errorf("record histogram: %d buckets, at most %d", len(h.GetBuckets()), hist.Slots)
		}
		l := hist.FromSlots(h.GetBuckets(), h.GetCount(), h.GetSumNs())
		r.Hist = &l
	}
	return r, nil
}
