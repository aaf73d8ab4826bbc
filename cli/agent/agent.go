// Package agent is `nodectl agent`: the always-on node agent, and the commands that ask it
// (status, incidents, watch) or read its flight recorder (export).
package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/nodectl/nodectl/agent"
	"github.com/nodectl/nodectl/agent/exporter"
	"github.com/nodectl/nodectl/agent/flightrec"
	"github.com/nodectl/nodectl/agent/recorded"
	"github.com/nodectl/nodectl/agent/rpc"
	agentv1 "github.com/nodectl/nodectl/api/agent/v1"
	"github.com/nodectl/nodectl/cli/internal/agentsrc"
	"github.com/nodectl/nodectl/cli/internal/buildinfo"
	"github.com/nodectl/nodectl/cli/internal/console"
	"github.com/nodectl/nodectl/cli/internal/interrupt"
	"github.com/nodectl/nodectl/cli/internal/pathflags"
	"github.com/nodectl/nodectl/cli/internal/privilege"
	"github.com/nodectl/nodectl/cli/internal/remote"
	"github.com/nodectl/nodectl/host"
	"github.com/nodectl/nodectl/host/daemons"
	"github.com/nodectl/nodectl/internal/badvalue"
	"github.com/nodectl/nodectl/internal/metricserver"
	"github.com/nodectl/nodectl/internal/quantity"
	"github.com/nodectl/nodectl/record/session"
	"github.com/nodectl/nodectl/rundir"
)

// New returns the agent command and its subcommands.
func New() *cobra.Command {
	cfg := agent.ServeConfig{Config: agent.Config{Host: host.Default(), Triggers: agent.DefaultTriggers, Windows: recorded.DefaultWindows}}
	var daemonList, memLimit, pprofListen, runAs string
	var kc kubeFlags
	var verbose bool
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run the always-on node agent: flight recorder, incidents, gRPC API, Prometheus metrics",
		Long: `Traces and samples every cgroup of the node continuously (run-queue waits with their
preemptor, fsync, block I/O, reclaim and OOM kills, throttling, memory, swap, PSI) and keeps it
in a flight recorder in --data-dir that survives restarts, bounded by --retention-size and
--retention-age. Live triggers (an OOM kill, memory PSI full, a run-queue stall, a system
daemon's long run-queue wait, swap thrashing) open incidents; once an incident's window has
passed, the agent analyzes it against the quiet window before and keeps the findings.

Ask it with 'nodectl agent status|incidents|watch', 'nodectl postmortem' and 'nodectl analyze
--from --to'; those also read a data directory directly with --data-dir when the agent is not
running. The API listens on --socket (mode 0600) and, with mTLS only, on --listen-tcp.`,
		Example: `  sudo nodectl agent --metrics-listen :9560
  sudo nodectl agent status
  sudo nodectl postmortem --incident 20261201-030000-runq_stall-1`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.Interval < 100*time.Millisecond {
				return fmt.Errorf("--interval %s: must be at least 100ms", cfg.Interval)
			}
			if cfg.MaxCgroups < 1 {
				return fmt.Errorf("--max-cgroups %d: must be at least 1", cfg.MaxCgroups)
			}
			if cfg.MetricsSeriesBudget < minSeriesBudget {
				return fmt.Errorf("--metrics-series-budget %d: must be at least %d (the node's and the agent's own series)", cfg.MetricsSeriesBudget, minSeriesBudget)
			}
			if err := checkFlags(cfg); err != nil {
				return err
			}
			names, err := agentDaemons(daemonList)
			if err != nil {
				return err
			}
			if err := setMemoryLimit(memLimit); err != nil {
				return err
			}
			cfg.Log = console.Logger(cmd.ErrOrStderr(), verbose)
			if cfg.Kube, err = kc.kube(cfg.Log); err != nil {
				return err
			}
			// The profiles tell what the agent holds (pod names, its maps): never off loopback.
			if pprofListen != "" {
				if err := rpc.CheckLoopback(pprofListen); err != nil {
					return fmt.Errorf("--pprof-listen %s: %w", pprofListen, err)
				}
			}
			// The settings first, so that a mistake is told before privileges are asked for.
			// The least set, measured (docs/deploy.md): the rest only makes some parts
			// better, and the agent says what it lacks.
			if err := privilege.Need("nodectl agent", map[int]string{
				privilege.CapBPF: "loading the eBPF programs", privilege.CapPerfmon: "loading and attaching tracing programs"}); err != nil {
				return err
			}
			if runAs != "" {
				if err := becomeUser(runAs, cfg.DataDir, cfg.API.Socket); err != nil {
					return err
				}
			}
			cfg.Daemons = names
			cfg.Version = buildinfo.Version
			ctx, stop := interrupt.SignalContext(cmd.Context(), cmd.ErrOrStderr())
			defer stop()
			if pprofListen != "" {
				srv, err := servePprof(pprofListen)
				if err != nil {
					return err
				}
				defer srv.Close()
			}
			cfg.Ready = func(_ *agent.Agent, api *rpc.Server, metrics *metricserver.Server) {
				fmt.Fprintf(cmd.ErrOrStderr(), "nodectl agent: recording to %s; API on %s", cfg.DataDir, cfg.API.Socket)
				if metrics != nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "; metrics on %s", metrics.URL())
				}
				fmt.Fprintln(cmd.ErrOrStderr())
			}
			return badvalue.Name(agent.Serve(ctx, cfg), settingFlags)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.DataDir, "data-dir", agent.DefaultDataDir, "the flight recorder and incidents")
	f.DurationVar(&cfg.Interval, "interval", time.Second, "sampling interval")
	f.IntVar(&cfg.MaxCgroups, "max-cgroups", session.DefaultMaxCgroups, "most cgroups followed by the samplers and given series of their own in the metrics; more are counted as overflow")
	f.Int64Var(&cfg.Retention.MaxBytes, "retention-size", flightrec.DefaultMaxBytes, "most bytes the flight recorder keeps; the oldest segments go first (pinned incidents stay)")
	f.DurationVar(&cfg.Retention.MaxAge, "retention-age", flightrec.DefaultMaxAge, "oldest data the flight recorder keeps")
	f.DurationVar(&cfg.Retention.SegmentSpan, "segment-span", flightrec.DefaultSegmentSpan, "time covered by one flight recorder segment: retention removes and incidents pin whole segments (at least "+minRecorderSpan.String()+")")
	f.DurationVar(&cfg.Retention.SeriesIdle, "series-idle", flightrec.DefaultSeriesIdle, "a series with no sample for this long (its cgroup removed) is left out of the next segments and forgotten; shorter gives a churn's memory back sooner, but a counter unchanged that long is then not read until it changes (at least "+minRecorderSpan.String()+")")
	f.DurationVar(&cfg.Triggers.RunqStall, "trigger-runq-stall", cfg.Triggers.RunqStall, "a run-queue wait at least this long opens an incident (waits are known to a power of two: from the first at or above this)")
	f.Float64Var(&cfg.Triggers.MemoryPSIFull, "trigger-memory-psi-full", cfg.Triggers.MemoryPSIFull, "a cgroup's or the node's memory PSI full share of an interval (0..1) that opens an incident")
	f.DurationVar(&cfg.Triggers.DaemonWait, "trigger-daemon-wait", cfg.Triggers.DaemonWait, "a system daemon's run-queue wait at least this long opens an incident")
	f.Float64Var(&cfg.Triggers.SwapPagesPerSecond, "trigger-swap-pages", cfg.Triggers.SwapPagesPerSecond, "the node swapping this many pages a second both in and out opens an incident")
	f.DurationVar(&cfg.Triggers.LeaseLate, "trigger-lease-late", cfg.Triggers.LeaseLate, "a renewal of the node's Lease this much later than the kubelet's renew interval (10s of a 40s Lease) opens an incident (Kubernetes only)")
	f.DurationVar(&cfg.Triggers.FsyncStall, "trigger-fsync-stall", cfg.Triggers.FsyncStall, "a cgroup's fsync, fdatasync or sync_file_range at least this long opens an incident (known to a power of two: from the first at or above this)")
	f.DurationVar(&cfg.Triggers.BlkRequestWait, "trigger-blk-request-wait", cfg.Triggers.BlkRequestWait, "a block request waiting at least this long in its device's queue (insert to issue) or in the device (issue to completion) opens an incident for the node (known to a power of two)")
	f.DurationVar(&cfg.Windows.Before, "incident-before", cfg.Windows.Before, "an incident's window starts this long before its trigger")
	f.DurationVar(&cfg.Windows.After, "incident-after", cfg.Windows.After, "and ends this long after; then it is analyzed")
	f.DurationVar(&cfg.Windows.Baseline, "incident-baseline", cfg.Windows.Baseline, "the quiet stretch before the window that it is compared with")
	f.StringVar(&daemonList, "daemons", strings.Join(agent.DefaultDaemons, ","), "system daemons to follow (program names, comma-separated; none for none)")
	f.StringVar(&cfg.API.Socket, "socket", rpc.DefaultSocket, "the API's unix socket (mode 0600)")
	f.StringVar(&runAs, "run-as", "", "UID:GID to run as after start, keeping CAP_BPF and CAP_PERFMON alone: --data-dir and the socket's directory are given to it (CAP_CHOWN, CAP_SETUID and CAP_SETGID needed at start); empty: stay as started")
	f.StringVar(&cfg.API.TCP, "listen-tcp", "", "also serve the API on this host:port, with mTLS only (needs --tls-cert, --tls-key, --tls-client-ca)")
	f.StringVar(&cfg.API.CertFile, "tls-cert", "", "the agent's certificate (PEM) for --listen-tcp")
	f.StringVar(&cfg.API.KeyFile, "tls-key", "", "the agent's key (PEM) for --listen-tcp")
	f.StringVar(&cfg.API.ClientCAFile, "tls-client-ca", "", "CA certificates (PEM) clients' certificates must chain to, for --listen-tcp")
	f.StringVar(&cfg.API.Loopback, "api-listen", "", "also serve the API in plaintext on this loopback host:port (127.0.0.1:9562), for `nodectl --node NODE` through the API server's port-forward; empty: none")
	f.StringVar(&cfg.API.Health, "health-listen", "", "also serve the gRPC health service alone, in plaintext, on this host:port (for the kubelet's grpc probe, which cannot dial the socket or do TLS); empty: none")
	f.StringVar(&cfg.MetricsListen, "metrics-listen", "", "serve Prometheus metrics at http://HOST:PORT/metrics (e.g. :9560); empty: none")
	f.IntVar(&cfg.MetricsSeriesBudget, "metrics-series-budget", exporter.DefaultSeriesBudget, "most series in a scrape of the metrics: past it, the workloads whose tasks waited and ran least count in _overflow's series instead of their own (docs/metrics.md)")
	f.StringVar(&memLimit, "memory-limit", "40Mi", "the Go runtime's soft memory limit (GOMEMLIMIT, which overrides it): the garbage collector works harder near it; the agent's RSS is about this plus the pages of its binary it runs (about 16 MiB once it gave back its start's, 30 s in); 0 for none")
	f.StringVar(&pprofListen, "pprof-listen", "", "serve Go's profiles (net/http/pprof) at http://HOST:PORT/debug/pprof/, for finding where the agent's CPU and memory go; a loopback address only (127.0.0.1:6060)")
	f.BoolVarP(&verbose, "verbose", "v", false, "log debug detail to stderr")
	pathflags.HostPathFlags(f, &cfg.Host)
	kc.register(f)
	cmd.AddCommand(statusCmd(), incidentsCmd(), watchCmd(), exportCmd())
	return cmd
}

// settingFlags maps the agent's settings to the flags that set them, for errors.
var settingFlags = map[string]string{
	agent.FieldRunqStall: "--trigger-runq-stall", agent.FieldDaemonWait: "--trigger-daemon-wait",
	agent.FieldMemoryPSIFull: "--trigger-memory-psi-full", agent.FieldSwapPagesPerSecond: "--trigger-swap-pages",
	agent.FieldLeaseLate: "--trigger-lease-late", agent.FieldFsyncStall: "--trigger-fsync-stall", agent.FieldBlkRequestWait: "--trigger-blk-request-wait",
	recorded.FieldBefore: "--incident-before", recorded.FieldAfter: "--incident-after", recorded.FieldBaseline: "--incident-baseline",
	rpc.FieldSocket: "--socket", rpc.FieldTCP: "--listen-tcp", rpc.FieldCertFile: "--tls-cert",
	rpc.FieldKeyFile: "--tls-key", rpc.FieldClientCAFile: "--tls-client-ca",
	rpc.FieldHealth: "--health-listen", rpc.FieldLoopback: "--api-listen",
}

// minRecorderSpan is the shortest segment span and series idle time the agent takes.
const minRecorderSpan = 10 * time.Second

// minSeriesBudget leaves room for the node's and the agent's own series (about 150 on a node
// of a few disks), which are always exported, and _overflow's.
const minSeriesBudget = 500

// checkFlags names the flag of a bad trigger, window or retention.
// becomeUser makes the agent the user spec names (UID:GID), keeping the two capabilities it
// needs; the data directory (with all below) and the socket's directory become that user's.
// A socket's directory anyone may write (/tmp) is refused: it is not the agent's to give.
func becomeUser(spec, dataDir, socket string) error {
	u, g, ok := strings.Cut(spec, ":")
	uid, uerr := strconv.Atoi(u)
	gid, gerr := strconv.Atoi(g)
	if !ok || uerr != nil || gerr != nil || uid <= 0 || gid <= 0 {
		return fmt.Errorf("--run-as %q: want UID:GID, both numbers above 0, e.g. 65532:65532", spec)
	}
	sockDir := filepath.Dir(socket)
	// Parents the user can pass through; the data directory its alone. The socket's holds the
	// socket (mode 0600), and root without CAP_DAC_READ_SEARCH passes through it at the next
	// start.
	for _, dir := range []string{filepath.Dir(dataDir), sockDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("--run-as: %w", err)
		}
	}
	if err := os.Mkdir(dataDir, 0o750); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("--run-as: %w", err)
	}
	if fi, err := os.Stat(sockDir); err != nil {
		return fmt.Errorf("--run-as: %w", err)
	} else if fi.Mode()&(os.ModeSticky|0o002) != 0 {
		return fmt.Errorf("--run-as %s: the socket's directory %s is shared (anyone may write there); give --socket a directory of its own", spec, sockDir)
	}
	return privilege.Become(uid, gid, []int{privilege.CapBPF, privilege.CapPerfmon}, []string{dataDir}, []string{sockDir})
}

func checkFlags(cfg agent.ServeConfig) error {
	switch {
	case cfg.Retention.MaxBytes < 0:
		return fmt.Errorf("--retention-size %d: must not be negative", cfg.Retention.MaxBytes)
	case cfg.Retention.MaxAge < 0:
		return fmt.Errorf("--retention-age %s: must not be negative", cfg.Retention.MaxAge)
	case cfg.Retention.SegmentSpan < minRecorderSpan:
		return fmt.Errorf("--segment-span %s: must be at least %s (each segment is a file, compressed when sealed)", cfg.Retention.SegmentSpan, minRecorderSpan)
	case cfg.Retention.SeriesIdle < minRecorderSpan:
		return fmt.Errorf("--series-idle %s: must be at least %s", cfg.Retention.SeriesIdle, minRecorderSpan)
	}
	return badvalue.Name(errors.Join(cfg.Triggers.Validate(), cfg.Windows.Validate()), settingFlags)
}

// servePprof serves the runtime's profiles on addr.
func servePprof(addr string) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--pprof-listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	return srv, nil
}

// setMemoryLimit sets the runtime's soft memory limit unless GOMEMLIMIT does.
func setMemoryLimit(v string) error {
	if v == "0" || os.Getenv("GOMEMLIMIT") != "" {
		return nil
	}
	n, err := quantity.ParseSize(v)
	if err != nil {
		return fmt.Errorf("--memory-limit %q: want a size such as 40Mi, or 0 for none", v)
	}
	debug.SetMemoryLimit(n)
	return nil
}

func agentDaemons(list string) ([]string, error) {
	names, err := daemons.Parse(list)
	if err != nil {
		return nil, fmt.Errorf("--daemons: %w", err)
	}
	return names, nil
}

// dial connects to the running agent: --node's through the API server, else the local one.
func dial(cmd *cobra.Command, d rpc.DialConfig) (agentv1.AgentClient, io.Closer, error) {
	return agentsrc.Dial(cmd, d)
}

func statusCmd() *cobra.Command {
	var d rpc.DialConfig
	var output string
	var allNodes bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "What the running agent traces, what it dropped, its store and incidents",
		Long: `What the running agent traces, what it dropped, its store and incidents: the agent on
this machine, the one of --node through the API server, or with --all-nodes a table of every
node's agent, the worst first (critical: no answer or its store not writable; warning: an
incident open or events dropped).`,
		Example: `  sudo nodectl agent status
  nodectl --node gke-pool-1-abcd agent status
  nodectl agent status --all-nodes --context prod`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := console.CheckOutput(output); err != nil {
				return err
			}
			if allNodes {
				return poolStatus(cmd, output)
			}
			c, closer, err := dial(cmd, d)
			if err != nil {
				return err
			}
			defer closer.Close()
			st, err := c.GetStatus(cmd.Context(), &agentv1.GetStatusRequest{})
			if err != nil {
				return err
			}
			if output == "json" {
				return writeProtoJSON(cmd.OutOrStdout(), st)
			}
			return renderStatus(cmd.OutOrStdout(), st)
		},
	}
	agentsrc.DialFlags(cmd.Flags(), &d)
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text or json")
	cmd.Flags().BoolVar(&allNodes, "all-nodes", false, "every node's agent in the cluster (--kubeconfig, --context), through the API server")
	return remote.Supports(cmd)
}

func writeProtoJSON(w io.Writer, m proto.Message) error {
	b, err := protojson.MarshalOptions{Multiline: true, EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}

func renderStatus(w io.Writer, st *agentv1.Status) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "agent\t%s on %s (kernel %s), up since %s\n", st.GetVersion(), st.GetNode(), st.GetKernel(), st.GetStartTime().AsTime().Local().Format(time.RFC3339))
	fmt.Fprintf(tw, "cgroups\t%d tracked, %d beyond --max-cgroups\n", st.GetTrackedCgroups(), st.GetOverflowCgroups())
	progs := make([]string, 0, len(st.GetTracer()))
	for p := range st.GetTracer() {
		progs = append(progs, p)
	}
	slices.Sort(progs)
	for _, p := range progs {
		fmt.Fprintf(tw, "program %s\t%s\n", p, st.GetTracer()[p])
	}
	for _, m := range st.GetMaps() {
		fmt.Fprintf(tw, "map %s\t%s %.1f%% full\n", m.GetProgram(), m.GetMap(), 100*m.GetFill())
	}
	s := st.GetStore()
	state := "writable"
	if !s.GetWritable() {
		state = "NOT WRITABLE: " + s.GetLastError()
	}
	fmt.Fprintf(tw, "store\t%s, %d segments, %.1f MiB (%.1f MiB pinned), %d write failures\n", state, s.GetSegments(),
		float64(s.GetBytes())/(1<<20), float64(s.GetPinnedBytes())/(1<<20), s.GetWriteFailures())
	if s.GetOldest() != nil {
		fmt.Fprintf(tw, "data\tfrom %s to %s\n", s.GetOldest().AsTime().Local().Format(time.RFC3339), s.GetNewest().AsTime().Local().Format(time.RFC3339))
	}
	for _, d := range st.GetDrops() {
		if d.GetCount() > 0 {
			fmt.Fprintf(tw, "dropped\t%d at %s (%s)\n", d.GetCount(), d.GetStage(), d.GetWhat())
		}
	}
	fmt.Fprintf(tw, "memory\t%.1f MiB resident\n", float64(st.GetRssBytes())/(1<<20))
	fmt.Fprintf(tw, "incidents\t%d open, %d kept\n", st.GetIncidentsOpen(), st.GetIncidentsTotal())
	return tw.Flush()
}

func incidentsCmd() *cobra.Command {
	var src agentsrc.Flags
	var output, since string
	var limit int
	var allNodes bool
	cmd := &cobra.Command{
		Use:   "incidents",
		Short: "The incidents the agent opened, newest first, with their findings",
		Long: `The incidents the agent opened, newest first, with their findings: the agent on this
machine (or its --data-dir), the one of --node through the API server, or with --all-nodes
every node's, the most severe first (the worst finding of each incident), then the newest.`,
		Example: `  sudo nodectl agent incidents --since 24h
  nodectl --node gke-pool-1-abcd agent incidents -o json
  nodectl agent incidents --all-nodes --limit 20`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := console.CheckOutput(output); err != nil {
				return err
			}
			if limit < 0 {
				return fmt.Errorf("--limit %d: must not be negative", limit)
			}
			var from time.Time
			if since != "" {
				var err error
				if from, err = agentsrc.ParseTime("since", since, time.Now()); err != nil {
					return err
				}
			}
			if allNodes {
				if src.DataDir != "" {
					return errors.New("--all-nodes and --data-dir: choose one")
				}
				return poolIncidents(cmd, from, limit, output)
			}
			rec, err := agentsrc.Open(cmd, src)
			if err != nil {
				return err
			}
			defer rec.Close()
			list, err := rec.Incidents(cmd.Context(), from, limit)
			if err != nil {
				return err
			}
			if output == "json" {
				if list == nil {
					list = []recorded.Incident{}
				}
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(list)
			}
			return renderIncidents(cmd.OutOrStdout(), list)
		},
	}
	src.Register(cmd.Flags())
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text or json")
	cmd.Flags().StringVar(&since, "since", "", "only incidents opened since (RFC 3339, or a duration before now: 24h)")
	cmd.Flags().IntVar(&limit, "limit", 50, "most incidents listed; 0 for all")
	cmd.Flags().BoolVar(&allNodes, "all-nodes", false, "every node's agent in the cluster (--kubeconfig, --context), through the API server")
	return remote.Supports(cmd)
}

func renderIncidents(w io.Writer, list []recorded.Incident) error {
	if len(list) == 0 {
		_, err := fmt.Fprintln(w, "no incidents")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tOPENED\tTRIGGER\tWHERE\tSTATE\tFINDINGS")
	for _, in := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", in.ID, in.Opened.Local().Format(time.RFC3339), in.Trigger, in.Where(), in.State, findingsLine(in))
	}
	return tw.Flush()
}

// findingsLine sums up an incident's findings: id, victim and culprits of each.
func findingsLine(in recorded.Incident) string {
	if in.AnalysisError != "" {
		return "analysis failed: " + in.AnalysisError
	}
	rep := in.Report
	if rep == nil {
		return "-"
	}
	if len(rep.Findings) == 0 {
		return "none"
	}
	var parts []string
	for _, f := range rep.Findings {
		p := f.ID + " " + f.Victim
		if len(f.Culprits) > 0 {
			p += " ← " + strings.Join(f.Culprits, ", ")
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "; ")
}

func watchCmd() *cobra.Command {
	var d rpc.DialConfig
	var metric, prefix, output string
	cmd := &cobra.Command{
		Use:   "watch",
		Short: "Stream the agent's samples live (Ctrl-C ends it)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := console.CheckOutput(output); err != nil {
				return err
			}
			c, closer, err := dial(cmd, d)
			if err != nil {
				return err
			}
			defer closer.Close()
			ctx, stop := interrupt.SignalContext(cmd.Context(), cmd.ErrOrStderr())
			defer stop()
			stream, err := c.Watch(ctx, &agentv1.WatchRequest{Metric: metric, CgroupPrefix: prefix})
			if err != nil {
				return err
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			for {
				b, err := stream.Recv()
				if err != nil {
					if ctx.Err() != nil || errors.Is(err, io.EOF) {
						return nil
					}
					return err
				}
				if n := b.GetDroppedBatches(); n > 0 {
					fmt.Fprintf(cmd.ErrOrStderr(), "nodectl agent watch: %d batches lost (this client was too slow)\n", n)
				}
				for _, p := range b.GetRecords() {
					r, err := rpc.RecordFromProto(p)
					if err != nil {
						return err
					}
					if output == "json" {
						if err := enc.Encode(r); err != nil {
							return err
						}
						continue
					}
					fmt.Fprintln(cmd.OutOrStdout(), recordLine(r))
				}
			}
		},
	}
	agentsrc.DialFlags(cmd.Flags(), &d)
	cmd.Flags().StringVar(&metric, "metric", "", "only this metric (e.g. "+rundir.MetricRunqLatency+")")
	cmd.Flags().StringVar(&prefix, "cgroup", "", "only cgroups at or below this path")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text, or json (one record per line, as in a run directory)")
	return remote.Supports(cmd)
}

// recordLine is a record on one line for a person.
func recordLine(r rundir.Record) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.Time.Local().Format("15:04:05"), r.Metric+r.Name)
	if r.Cgroup != "" {
		fmt.Fprintf(&b, " %s", r.Cgroup)
	}
	keys := make([]string, 0, len(r.Labels))
	for k := range r.Labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%s", k, r.Labels[k])
	}
	switch {
	case r.Value != nil:
		fmt.Fprintf(&b, " %g", *r.Value)
	case r.Hist != nil:
		fmt.Fprintf(&b, " count=%d mean=%s p99=%s", r.Hist.Count, time.Duration(r.Hist.Mean()*1e9), time.Duration(r.Hist.Quantile(0.99)*1e9))
	case r.Message != "":
		fmt.Fprintf(&b, " %s", r.Message)
	}
	return b.String()
}

func exportCmd() *cobra.Command {
	var src agentsrc.Flags
	var from, to, out, cgroup string
	var baseline time.Duration
	cmd := &cobra.Command{
		Use:   "export --from T1 --to T2 --out DIR",
		Short: "Write a window of the flight recorder as a run directory for 'analyze' and 'diff'",
		Long: `Writes the window from --from to --to, with the --baseline before it, as a run directory
(scenario agent, phases baseline and window) that 'nodectl analyze DIR' and 'nodectl diff'
read offline.`,
		Example: `  sudo nodectl agent export --from 30m --to 10m --out /tmp/window
  nodectl agent export --data-dir /mnt/broken-node/var/lib/nodectl/agent --from 2026-12-01T03:00:00Z --to 2026-12-01T03:10:00Z --out /tmp/w`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return fmt.Errorf("--out is required: the run directory to write")
			}
			w, err := agentsrc.ParseWindow(from, to, baseline, cgroup, time.Now())
			if err != nil {
				return err
			}
			rec, err := agentsrc.Open(cmd, src)
			if err != nil {
				return err
			}
			defer rec.Close()
			if err := export(cmd.Context(), rec, w, out); err != nil {
				// A half-written export is no run: leave nothing behind.
				if _, statErr := os.Stat(out); statErr == nil {
					os.RemoveAll(out)
				}
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s; explain it with: nodectl analyze %s\n", out, out)
			return nil
		},
	}
	src.Register(cmd.Flags())
	cmd.Flags().StringVar(&from, "from", "", "window start (RFC 3339, or a duration before now: 30m)")
	cmd.Flags().StringVar(&to, "to", "now", "window end (RFC 3339, now, or a duration before now)")
	cmd.Flags().DurationVar(&baseline, "baseline", recorded.DefaultWindows.Baseline, "the stretch before --from written as the baseline phase")
	cmd.Flags().StringVar(&cgroup, "cgroup", "", "the cgroup under examination (written as an observed workload)")
	cmd.Flags().StringVar(&out, "out", "", "run directory to write (must not exist or be empty)")
	return remote.Supports(cmd)
}

// export writes w as a run directory, streamed from the recorder to the file: a window of any
// length costs the memory of a batch.
func export(ctx context.Context, rec recorded.Recorder, w recorded.Window, out string) error {
	meta, err := rec.Meta(ctx)
	if err != nil {
		return err
	}
	return w.Export(rec.Source(ctx), meta, out)
}
