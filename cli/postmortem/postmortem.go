// Package postmortem is `nodectl postmortem`: what the kernel saw around a moment or an
// incident, explained from the agent's flight recorder.
package postmortem

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodectl/nodectl/agent/recorded"
	"github.com/nodectl/nodectl/cli/internal/agentsrc"
	"github.com/nodectl/nodectl/cli/internal/console"
	"github.com/nodectl/nodectl/cli/internal/gate"
	"github.com/nodectl/nodectl/cli/internal/remote"
)

// New returns the postmortem command.
func New() *cobra.Command {
	var src agentsrc.Flags
	var g gate.Flags
	var at, incident, cgroup, output, html string
	var window, baseline time.Duration
	cmd := &cobra.Command{
		Use:   "postmortem [--at TIME | --incident ID]",
		Short: "Explain what slowed whom around a moment or an incident, from the agent's flight recorder",
		Long: `Analyzes a window of the agent's flight recorder against the quiet stretch before it and
prints the same findings as a stress run, with culprits named by cgroup. With --incident, the
incident's window and cgroup; with --at, the --window centred on that time (all cgroups, or
--cgroup); with neither, the latest incident. It asks the running agent, or reads a data
directory directly with --data-dir (the agent dead, or the disk copied off a broken node).`,
		Example: `  sudo nodectl postmortem
  sudo nodectl postmortem --at 2026-12-01T03:00:00Z --window 5m
  nodectl postmortem --data-dir /mnt/node-disk/var/lib/nodectl/agent --incident 20261201-030012-runq_stall-1 -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := console.CheckOutput(output); err != nil {
				return err
			}
			if err := g.Check(); err != nil {
				return err
			}
			if at != "" && incident != "" {
				return errors.New("--at and --incident: give one, not both")
			}
			if window <= 0 {
				return fmt.Errorf("--window %s: must be more than 0", window)
			}
			if baseline <= 0 {
				return fmt.Errorf("--baseline %s: must be more than 0", baseline)
			}
			rec, err := agentsrc.Open(cmd, src)
			if err != nil {
				return err
			}
			defer rec.Close()
			var w recorded.Window
			if at != "" {
				t, err := agentsrc.ParseTime("at", at, time.Now())
				if err != nil {
					return err
				}
				w = recorded.Window{BaselineFrom: t.Add(-window/2 - baseline), From: t.Add(-window / 2), To: t.Add(window / 2), Cgroup: cgroup}
			} else {
				in, err := pick(cmd, rec, incident)
				if err != nil {
					return err
				}
				w = in.Window()
				if cmd.Flags().Changed("baseline") {
					w.BaselineFrom = w.From.Add(-baseline)
				}
				if cgroup != "" {
					w.Cgroup = cgroup
				}
				if output == "text" {
					fmt.Fprintf(cmd.OutOrStdout(), "incident %s: %s in %s at %s\n  %s\n\n", in.ID, in.Trigger, in.Where(),
						in.Opened.Local().Format(time.RFC3339), in.Evidence)
				}
			}
			rep, err := agentsrc.Explain(cmd.Context(), rec, w, html)
			if err != nil {
				return err
			}
			if err := console.Render(cmd.OutOrStdout(), rep, output); err != nil {
				return err
			}
			return g.Apply(rep, "postmortem")
		},
	}
	src.Register(cmd.Flags())
	f := cmd.Flags()
	f.StringVar(&at, "at", "", "the moment to explain (RFC 3339, or a duration before now: 10m)")
	f.StringVar(&incident, "incident", "", "the incident to explain (its id, from 'nodectl agent incidents')")
	f.DurationVar(&window, "window", recorded.DefaultWindows.Before+recorded.DefaultWindows.After, "the window examined, centred on --at")
	f.DurationVar(&baseline, "baseline", recorded.DefaultWindows.Baseline, "the quiet stretch before the window it is compared with")
	f.StringVar(&cgroup, "cgroup", "", "the cgroup under examination (default: the incident's, or every cgroup whose waits rose)")
	f.StringVarP(&output, "output", "o", "text", "report format: text or json")
	f.StringVar(&html, "html", "", "also write the post-mortem as one HTML file: findings, the incident's timeline (Lease renewals, the kubelet's waits, OOM kills) and the charts of the window")
	g.Register(f)
	return remote.Supports(cmd)
}

// pick is the incident of that id, or the latest.
func pick(cmd *cobra.Command, rec recorded.Recorder, id string) (recorded.Incident, error) {
	if id != "" {
		in, ok, err := rec.Incident(cmd.Context(), id)
		if err == nil && !ok {
			err = fmt.Errorf("--incident %q: no such incident (list them with 'nodectl agent incidents')", id)
		}
		return in, err
	}
	list, err := rec.Incidents(cmd.Context(), time.Time{}, 1)
	if err != nil {
		return recorded.Incident{}, err
	}
	if len(list) == 0 {
		return recorded.Incident{}, errors.New("the agent has no incidents: give --at TIME to explain a moment")
	}
	return list[0], nil
}
