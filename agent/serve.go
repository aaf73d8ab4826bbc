package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/nodectl/nodectl/agent/exporter"
	"github.com/nodectl/nodectl/agent/recorded"
	"github.com/nodectl/nodectl/agent/rpc"
	"github.com/nodectl/nodectl/internal/metricserver"
	"github.com/nodectl/nodectl/rundir"
)

// ServeConfig adds to an agent's Config where it answers.
type ServeConfig struct {
	Config
	API rpc.Config
	// MetricsListen is the host:port of the Prometheus metrics; "" serves none.
	MetricsListen string
	// MetricsSeriesBudget bounds the series of a scrape (exporter.Config.SeriesBudget).
	MetricsSeriesBudget int
	// Ready, if set, is called once the agent records and listens.
	Ready func(a *Agent, api *rpc.Server, metrics *metricserver.Server)
}

// Serve runs the agent with its gRPC API and Prometheus metrics until ctx is done, then stops
// all of it. A listener that fails stops the agent with its error.
func Serve(ctx context.Context, cfg ServeConfig) (err error) {
	a, err := Start(cfg.Config)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, a.Close()) }()

	var api *rpc.Server
	api, err = rpc.New(cfg.API, backend{a: a, srv: func() *rpc.Server { return api }})
	if err != nil {
		return err
	}
	defer api.Close()
	a.OnBatch(api.PublishSamples)
	a.OnIncident(func(in recorded.Incident) { api.PublishIncident(recorded.IncidentToProto(in)) })

	var metrics *metricserver.Server
	if cfg.MetricsListen != "" {
		ecfg := exporter.Config{MaxSeries: cfg.MaxCgroups, SeriesBudget: cfg.MetricsSeriesBudget, Self: func() exporter.Self { return a.selfMetrics(api.Dropped()) }}
		if a.kube != nil {
			ecfg.Classify = a.kube.classify
		}
		exp := exporter.New(ecfg)
		reg := prometheus.NewRegistry()
		if err := reg.Register(exp); err != nil {
			return fmt.Errorf("registering the agent's metrics: %w", err)
		}
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		a.OnBatch(func(_ time.Time, batch []rundir.Record) { exp.Observe(batch) })
		a.OnForget(func(cgroups []string) {
			for _, c := range cgroups {
				exp.Forget(c)
			}
		})
		if metrics, err = metricserver.Listen(cfg.MetricsListen, reg); err != nil {
			return err
		}
		defer metrics.Close()
	}
	errc := make(chan error, 1)
	go func() { errc <- api.Serve(ctx) }()
	api.SetServing(true)
	if cfg.Ready != nil {
		cfg.Ready(a, api, metrics)
	}
	var merr <-chan error
	if metrics != nil {
		merr = metrics.Err()
	}
	select {
	case <-ctx.Done():
		api.Close()
		return <-errc
	case err := <-errc:
		return err
	case err := <-merr:
		return err
	}
}

// selfMetrics is the agent's own figures for the exporter.
func (a *Agent) selfMetrics(watchDrops uint64) exporter.Self {
	st := a.Status(watchDrops)
	self := exporter.Self{TrackedCgroups: st.TrackedCgroups, OverflowCgroups: st.OverflowCgroups,
		BPFMaps: st.MapFill, StoreBytes: st.Store.Bytes, StoreOldest: st.Store.Oldest,
		StoreWritable: st.Store.Writable, WriteFailures: uint64(st.Store.WriteFailures), Incidents: map[string]exporter.Incidents{}}
	sum := func(stage string) (n uint64) {
		for _, v := range st.Drops[stage] {
			n += v
		}
		return n
	}
	self.Lost = exporter.Lost{KernelMapFull: sum(StageMapFull), RingBuffer: sum(StageRingBuffer), Store: sum(StageStore), Watch: sum(StageWatch)}
	opened, open := a.inc.byTrigger()
	for _, trig := range TriggerNames {
		self.Incidents[trig] = exporter.Incidents{Total: opened[trig], Open: open[trig]}
	}
	if a.kube != nil {
		a.kube.self(&self)
	}
	return self
}
