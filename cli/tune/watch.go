package tune

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nodectl/nodectl/cli/internal/console"
	"github.com/nodectl/nodectl/cli/internal/interrupt"
	"github.com/nodectl/nodectl/internal/metricserver"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/nodectl/nodectl/tuner/watch"
)

func newWatch() *cobra.Command {
	var (
		o        opts
		interval time.Duration
		apply    bool
		listen   string
		verbose  bool
	)
	cmd := &cobra.Command{
		Use:   "watch",
		Short: "DaemonSet mode: apply a mounted profile at start-up and re-verify it on an interval, exporting drift as metrics",
		Long: `watch is how the tuner runs in the node agent's DaemonSet: with --apply it applies the profile
once at start-up (a failure is logged and counted, and rolled back as apply always does),
then re-verifies every --interval, logging each setting that starts to drift with who may
have changed it, and serves Prometheus metrics on --listen: nodectl_tune_drifted_settings,
nodectl_tune_setting_drifted{setting,backend}, nodectl_tune_pending_restarts,
nodectl_tune_verify_total{result}, nodectl_tune_apply_total{result} and
nodectl_tune_last_verify_timestamp_seconds (docs/tuning.md). It never re-applies on drift:
drift is reported for a person to decide. Stops on SIGINT, SIGTERM or SIGHUP, leaving the profile
applied.`,
		Example: `  nodectl tune watch --host-root /host --profile /etc/nodectl/profile.yaml --apply --interval 1m --listen :9110`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if interval <= 0 {
				return fmt.Errorf("--interval %s: must be positive, e.g. 1m", interval)
			}
			l, err := o.load(cmd)
			if err != nil {
				return err
			}
			if apply {
				if err := needRoot("watch --apply"); err != nil {
					return err
				}
			}
			log := console.Logger(cmd.ErrOrStderr(), verbose)
			l.engine.Log = log
			reg := prometheus.NewRegistry()
			m := watch.NewMetrics(reg)
			ctx, stop := interrupt.SignalContext(cmd.Context(), cmd.ErrOrStderr())
			defer stop()
			var srvErr <-chan error // nil without a server: never ready
			if listen != "" {
				srv, err := metricserver.Listen(listen, reg)
				if err != nil {
					return fmt.Errorf("--listen: %w", err)
				}
				defer srv.Close()
				srvErr = srv.Err()
				fmt.Fprintf(cmd.ErrOrStderr(), "tune watch: metrics on %s\n", srv.URL())
			}
			werr := make(chan error, 1)
			go func() {
				werr <- watch.Run(ctx, watch.Config{Engine: l.engine, Interval: interval, ApplyOnStart: apply, Log: log}, m)
			}()
			select {
			case err := <-werr:
				if errors.Is(err, context.Canceled) {
					return nil
				}
				return err
			case err := <-srvErr:
				return err
			}
		},
	}
	o.hostFlags(cmd.Flags())
	o.profileFlag(cmd.Flags(), "sandbox-density")
	cmd.Flags().DurationVar(&interval, "interval", time.Minute, "how often to re-verify the profile")
	cmd.Flags().BoolVar(&apply, "apply", false, "apply the profile once at start-up")
	cmd.Flags().StringVar(&listen, "listen", ":9110", "address for Prometheus metrics at /metrics; empty for none")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "log every verification, not only changes")
	return cmd
}
