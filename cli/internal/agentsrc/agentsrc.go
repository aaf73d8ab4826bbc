// Package agentsrc is the CLI's way to the agent's flight recorder: the flags that name it (the
// running agent, on this machine or on --node, or a data directory copied off a broken node), a
// window's flags, and a window explained, with its HTML page drawn from the same read.
package agentsrc

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/nodectl/nodectl/agent/recorded"
	"github.com/nodectl/nodectl/agent/rpc"
	"github.com/nodectl/nodectl/analyzer"
	agentv1 "github.com/nodectl/nodectl/api/agent/v1"
	"github.com/nodectl/nodectl/cli/internal/remote"
	"github.com/nodectl/nodectl/report"
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

// Open reaches the recorder the flags name: cmd's --node one through the API server, else a
// data directory or the local agent.
func Open(cmd *cobra.Command, f Flags) (recorded.Recorder, error) {
	ctx := cmd.Context()
	if remote.FromCommand(cmd).Node != "" {
		if f.DataDir != "" {
			return nil, fmt.Errorf("--data-dir and --%s: choose one (--data-dir reads a directory on this machine)", remote.FlagNode)
		}
		c, closer, err := Dial(cmd, f.Dial)
		if err != nil {
			return nil, err
		}
		return recorded.FromAgent(c, closer), nil
	}
	if f.DataDir != "" {
		return recorded.OpenDataDir(f.DataDir)
	}
	c, closer, err := rpc.Dial(ctx, f.Dial)
	if err != nil {
		return nil, fmt.Errorf("%w (or read a data directory with --data-dir)", err)
	}
	return recorded.FromAgent(c, closer), nil
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

// Explain is the analyzer's report on w. With an html path it also writes the HTML report
// (package report), and then reads the window here, once, into memory: the analysis and the
// page's charts come from that one read. Without, the recorder analyzes it where it is (the
// agent, within its own memory bounds).
func Explain(ctx context.Context, rec recorded.Recorder, w recorded.Window, html string) (*analyzer.Report, error) {
	if html == "" {
		return rec.Analyze(ctx, w)
	}
	meta, err := rec.Meta(ctx)
	if err != nil {
		return nil, err
	}
	run, err := w.Run(rec.Source(ctx), meta)
	if err != nil {
		return nil, err
	}
	rep, err := analyzer.Analyze(run)
	if err != nil {
		return nil, err
	}
	if err := report.WriteFile(html, report.FromRun(run, rep)); err != nil {
		return nil, fmt.Errorf("--html: %w", err)
	}
	return rep, nil
}
