package podrun

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/nodectl/nodectl/stress"
	"github.com/nodectl/nodectl/stress/workload"
)

// stormPods is what the pods placement keeps of an fsync storm's writers (stress.Stormer).
type stormPods struct {
	names    []string
	gos      []*io.PipeWriter // each writer's standard input, attached through the API server
	failed   chan error       // an attach that ended while the run went on
	detach   func()
	interval time.Duration // the agent's sampling interval
}

// Arm creates the writer pods with their standard input open, waits until they run, attaches
// to each (pods/attach), and sends each writer's measurements as its attached output carries
// them. A writer's first ready came before the attach: it is read from its log.
func (p *Placement) Arm(ctx context.Context, ws []stress.Planned, events chan<- stress.StormEvent) error {
	meta, err := p.rec.Meta(ctx)
	if err != nil {
		return err
	}
	s := &p.storm
	s.interval = time.Duration(meta.Interval)
	if p.start.IsZero() {
		p.start = time.Now()
	}
	var specs []Spec
	for _, w := range ws {
		specs = append(specs, Spec{Name: w.Name, MemoryLimit: w.Limits.MemoryBytes, RuntimeClass: p.class, Stdin: true,
			Args: workload.Command{Run: p.run.ID, Config: w.Config}.Args()})
	}
	if err := p.run.LaunchAndWait(ctx, specs...); err != nil {
		return err
	}
	actx, detach := context.WithCancel(ctx)
	s.detach, s.failed = detach, make(chan error, len(specs))
	send := func(ev stress.StormEvent) {
		select { // never blocks an attach's stream
		case events <- ev:
		default:
		}
	}
	for i, spec := range specs {
		pr, pw := io.Pipe()
		s.names, s.gos = append(s.names, spec.Name), append(s.gos, pw)
		out := &lineWriter{fn: func(line []byte) {
			var m workload.Measurement
			if json.Unmarshal(line, &m) == nil && m.Metric != "" {
				send(stress.StormEvent{Writer: i, Measurement: m})
			}
		}}
		go func() {
			err := p.run.c.Attach(actx, p.run.Namespace, spec.Name, spec.Name, pr, out)
			if actx.Err() == nil {
				s.failed <- fmt.Errorf("writer %s/%s: its attached output ended: %v", p.run.Namespace, spec.Name, err)
			}
		}()
	}
	for i, name := range s.names {
		for {
			ms, err := p.run.Measurements(ctx, name, time.Time{})
			if err != nil {
				return err
			}
			if j := slices.IndexFunc(ms, func(m workload.Measurement) bool { return m.Metric == workload.MetricStormReady }); j >= 0 {
				send(stress.StormEvent{Writer: i, Measurement: ms[j]})
				break
			}
			if err := SleepCtx(ctx, 250*time.Millisecond); err != nil {
				return err
			}
		}
	}
	return nil
}

// Release writes the go to every writer's attached standard input at once: each write returns
// once its stream took the line.
func (p *Placement) Release(context.Context) error {
	s := &p.storm
	var wg sync.WaitGroup
	errs := make([]error, len(s.gos))
	for i, pw := range s.gos {
		wg.Go(func() { _, errs[i] = io.WriteString(pw, workload.StormGo) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return fmt.Errorf("releasing %s: %w", s.names[i], err)
		}
	}
	return nil
}

// Check fails when a writer's attached output ended or one of the run's pods failed.
func (p *Placement) Check(ctx context.Context) error {
	select {
	case err := <-p.storm.failed:
		return err
	default:
	}
	return p.run.Check(ctx)
}

// Settle waits past the agent's next read: it reads the device's and the cgroups' counters
// every interval, not at a phase's edges as a local run does, so a storm's phase ends past its
// first read after the last fsync and a storm shorter than an interval still has its I/O inside.
func (p *Placement) Settle(ctx context.Context) error {
	return SleepCtx(ctx, p.storm.interval*3/2)
}

// lineWriter calls fn with each complete line written to it.
type lineWriter struct {
	buf []byte
	fn  func([]byte)
}

func (l *lineWriter) Write(b []byte) (int, error) {
	l.buf = append(l.buf, b...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			return len(b), nil
		}
		l.fn(l.buf[:i])
		l.buf = l.buf[i+1:]
	}
}
