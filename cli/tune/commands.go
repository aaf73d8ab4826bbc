package tune

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/nodectl/nodectl/cli/internal/console"
	"github.com/nodectl/nodectl/cli/internal/interrupt"
	"github.com/nodectl/nodectl/stress"
	"github.com/nodectl/nodectl/tuner"
	"github.com/nodectl/nodectl/tuner/profile"
)

// rollbackHint is what to run after a second Ctrl-C left a change half done.
const rollbackHint = "run 'nodectl tune rollback' to restore what was applied"

// report is what plan and verify print.
type report struct {
	Profile   string       `json:"profile"`
	Source    string       `json:"source,omitempty"`
	HostRoot  string       `json:"host_root"`
	CPUs      int          `json:"node_cpus,omitempty"`
	Applied   string       `json:"applied_profile,omitempty"` // what the state file holds
	Settings  []tuner.Item `json:"settings"`
	Changes   int          `json:"changes"`  // plan: settings apply would change; verify: drifted ones
	Restarts  []string     `json:"restarts"` // daemons that must restart for a setting to take effect
	Unchecked []string     `json:"unchecked,omitempty"`
}

func newReport(l *loaded, items []tuner.Item) *report {
	r := &report{Profile: l.profile.Name, Source: l.profile.Source, HostRoot: l.host.Root, CPUs: l.cpus,
		Settings: items, Unchecked: l.profile.Unchecked, Restarts: []string{}}
	r.count()
	return r
}

func (r *report) count() {
	for _, it := range r.Settings {
		if it.Change {
			r.Changes++
		}
		if it.Pending && it.Restart != "" && !slices.Contains(r.Restarts, it.Restart) {
			r.Restarts = append(r.Restarts, it.Restart)
		}
	}
}

func (r *report) json(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// table prints one line per setting; verb is what a differing setting is called.
func (r *report) table(w io.Writer, verb string) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SETTING\tCURRENT\tDESIRED\t")
	for _, it := range r.Settings {
		state := "ok"
		if it.Change {
			state = verb
		}
		if it.Restart != "" && it.Pending {
			state += ", pending " + it.Restart + " restart"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", it.ID, show(it.Current, it.Present), it.Desired, state)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, it := range r.Settings {
		if it.Note != "" {
			fmt.Fprintf(w, "note: %s: %s\n", it.ID, it.Note)
		}
		for _, s := range it.Suspects {
			fmt.Fprintf(w, "  %s may have been changed by: %s\n", it.ID, s)
		}
	}
	for _, u := range r.Unchecked {
		fmt.Fprintf(w, "not checked: %s\n", u)
	}
	return nil
}

func show(v string, present bool) string {
	if !present {
		return "(absent)"
	}
	if v == "" {
		return `""`
	}
	return v
}

func newPlan() *cobra.Command {
	var o opts
	cmd := &cobra.Command{
		Use:   "plan",
		Short: "Show, per setting, the node's current value, the profile's desired value and what needs a restart",
		Long: `plan reads every setting the profile names and prints its current and desired value, whether
apply would change it, and which daemon (the kubelet, for reserved CPUs) must restart before
it takes effect. It changes nothing. Exit status 0 whether or not changes are planned.
-o yaml prints the profile itself, resolved against this node (built-in merged, CPUs sized).`,
		Example: `  nodectl tune plan
  nodectl tune plan --profile my-profile.yaml -o json
  nodectl tune plan --profile my-profile.yaml -o yaml
  nodectl tune plan --host-root /host`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.output != "yaml" {
				if err := console.CheckOutput(o.output); err != nil {
					return fmt.Errorf("%w, or yaml (the resolved profile)", err)
				}
			}
			l, err := o.load(cmd)
			if err != nil {
				return err
			}
			if o.output == "yaml" {
				b, err := l.profile.YAML()
				if err != nil {
					return err
				}
				if !bytes.HasSuffix(b, []byte("\n")) {
					b = append(b, '\n')
				}
				_, err = cmd.OutOrStdout().Write(b)
				return err
			}
			items, err := l.engine.Current(cmd.Context(), false)
			if err != nil {
				return err
			}
			r := newReport(l, items)
			if st, _ := tuner.LoadState(l.engine.State); st != nil {
				r.Applied = st.Profile
			}
			if o.output == "json" {
				return r.json(cmd.OutOrStdout())
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "Profile %s (%s) on a node with %d CPUs, host root %s\n\n", r.Profile, r.Source, r.CPUs, r.HostRoot)
			if err := r.table(w, "change"); err != nil {
				return err
			}
			fmt.Fprintf(w, "\n%d of %d settings would change", r.Changes, len(r.Settings))
			if len(r.Restarts) > 0 {
				fmt.Fprintf(w, "; needs a restart of: %s", strings.Join(r.Restarts, ", "))
			}
			fmt.Fprintln(w, ".")
			if r.Applied != "" {
				fmt.Fprintf(w, "Profile %q is applied on this node (state %s).\n", r.Applied, l.engine.State)
			}
			return nil
		},
	}
	o.hostFlags(cmd.Flags())
	o.profileFlag(cmd.Flags(), "sandbox-density")
	cmd.Flags().StringVarP(&o.output, "output", "o", "text", "output format: text, json, or yaml (the profile resolved against this node)")
	return cmd
}

func newApply() *cobra.Command {
	var o opts
	cmd := &cobra.Command{
		Use:   "apply",
		Short: "Apply a profile all or nothing, recording every earlier value first",
		Long: `apply reads every setting, records their values in the state file before changing any, then
applies them in order (sysctls, swap, journald, the journal's storage, the kubelet drop-in,
the live CPU partition) and reads each back. When one fails, everything already applied is
restored in reverse order and the state file is put back as it was: the node is left as it
was found; Ctrl-C between two settings does the same. Applying again a profile that is
applied and holds changes nothing. A different profile is refused until the applied one is
rolled back.`,
		Example: `  sudo nodectl tune apply
  sudo nodectl tune apply --profile my-profile.yaml -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := console.CheckOutput(o.output); err != nil {
				return err
			}
			l, err := o.load(cmd)
			if err != nil {
				return err
			}
			if err := needRoot("apply"); err != nil {
				return err
			}
			// Ctrl-C stops apply between two settings and undoes what it applied.
			ctx, stop := interrupt.SignalContextHint(cmd.Context(), cmd.ErrOrStderr(), rollbackHint)
			defer stop()
			res, err := l.engine.Apply(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return fmt.Errorf("%w: %w", stress.ErrInterrupted, err)
				}
				return err
			}
			items, err := l.engine.Current(cmd.Context(), false)
			if err != nil {
				return err
			}
			r := newReport(l, items)
			if o.output == "json" {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(struct {
					*tuner.ApplyResult
					Restarts []string `json:"restarts"`
					State    string   `json:"state"`
				}{res, r.Restarts, l.engine.State})
			}
			w := cmd.OutOrStdout()
			if len(res.Changed) == 0 {
				fmt.Fprintf(w, "Profile %s already holds on this node: nothing changed.\n", l.profile.Name)
			} else {
				fmt.Fprintf(w, "Applied profile %s: changed %d settings (%s); %d already held.\n", l.profile.Name,
					len(res.Changed), strings.Join(res.Changed, ", "), len(res.Held))
			}
			for _, it := range items {
				if it.Note != "" {
					fmt.Fprintf(w, "note: %s: %s\n", it.ID, it.Note)
				}
			}
			if len(r.Restarts) > 0 {
				fmt.Fprintf(w, "Pending until restarted: %s.\n", strings.Join(r.Restarts, ", "))
			}
			fmt.Fprintf(w, "Earlier values are in %s; nodectl tune rollback restores them.\n", l.engine.State)
			return nil
		},
	}
	o.hostFlags(cmd.Flags())
	o.profileFlag(cmd.Flags(), "sandbox-density")
	o.outputFlag(cmd.Flags())
	return cmd
}

func newVerify() *cobra.Command {
	var o opts
	cmd := &cobra.Command{
		Use:   "verify",
		Short: "Report drift: which settings no longer hold and who may have changed them",
		Long: `verify reads every setting of the applied profile (from the state file) or of --profile, and
reports each that differs from the desired value, with who may have changed it (a sysctl.d
file, a later drop-in, a process known to tune nodes). A setting waiting for a daemon's
restart is reported as pending, not as drift. Exit status: 0 when everything holds, 3 on
drift, 1 on error. --profile checks a profile (or a GKE node system config) that was never
applied, e.g. whether a node pool's config reached this node.`,
		Example: `  nodectl tune verify
  nodectl tune verify -o json
  nodectl tune verify --profile swap-dedicated-lssd.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := console.CheckOutput(o.output); err != nil {
				return err
			}
			l, err := o.verifyTarget(cmd)
			if err != nil {
				return err
			}
			items, err := l.engine.Current(cmd.Context(), true)
			if err != nil {
				return err
			}
			r := newReport(l, items)
			if o.output == "json" {
				if err := r.json(cmd.OutOrStdout()); err != nil {
					return err
				}
			} else {
				w := cmd.OutOrStdout()
				if err := r.table(w, "DRIFT"); err != nil {
					return err
				}
				if r.Changes == 0 {
					fmt.Fprintf(w, "\nProfile %s holds: all %d settings as desired.\n", r.Profile, len(r.Settings))
				} else {
					fmt.Fprintf(w, "\nProfile %s: %d of %d settings drifted.\n", r.Profile, r.Changes, len(r.Settings))
				}
			}
			if r.Changes > 0 {
				return fmt.Errorf("%w: %d of %d settings of profile %s differ", ErrDrift, r.Changes, len(r.Settings), r.Profile)
			}
			return nil
		},
	}
	o.hostFlags(cmd.Flags())
	o.profileFlag(cmd.Flags(), "")
	o.outputFlag(cmd.Flags())
	return cmd
}

// recordedProfile stands for the profile of a state file when the profile itself is not at hand.
func recordedProfile(st *tuner.State) *profile.Profile {
	return &profile.Profile{Name: st.Profile, Source: "recorded in the state file"}
}

// verifyTarget is --profile when given, else the applied profile's recorded settings.
func (o *opts) verifyTarget(cmd *cobra.Command) (*loaded, error) {
	if o.profile != "" {
		return o.load(cmd)
	}
	h, err := o.host()
	if err != nil {
		return nil, err
	}
	e := o.engineAt(cmd, h)
	st, err := tuner.LoadState(e.State)
	if err != nil {
		return nil, err
	}
	if st == nil {
		return nil, fmt.Errorf("no profile is applied (no state at %s): pass --profile to check one", e.State)
	}
	if !st.Complete() {
		return nil, fmt.Errorf("%w: profile %q (state %s, started %s): run nodectl tune rollback", tuner.ErrUnfinished, st.Profile, e.State, st.Started.Format(time.RFC3339))
	}
	if e.Settings, err = e.Recorded(st); err != nil {
		return nil, err
	}
	e.Profile = st.Profile
	return &loaded{host: h, engine: e, profile: recordedProfile(st)}, nil
}

func newRollback() *cobra.Command {
	var (
		o         opts
		missingOK bool
	)
	cmd := &cobra.Command{
		Use:   "rollback",
		Short: "Restore exactly what apply recorded and remove the state file",
		Long: `rollback restores, in reverse order, every setting apply changed to the value recorded before
the change, reads each back, and removes the state file. It needs no profile: the state file
holds everything. A setting that fails to restore stays in the state file, so rollback can be
run again after fixing the cause. Also finishes an apply that died half-way. With
--missing-ok, a node where no profile is applied is not an error.`,
		Example: `  sudo nodectl tune rollback
  sudo nodectl tune rollback --missing-ok`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := console.CheckOutput(o.output); err != nil {
				return err
			}
			if err := needRoot("rollback"); err != nil {
				return err
			}
			h, err := o.host()
			if err != nil {
				return err
			}
			e := o.engineAt(cmd, h)
			if missingOK {
				if st, err := tuner.LoadState(e.State); err != nil {
					return err
				} else if st == nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "No profile is applied on this node (no state at %s): nothing to roll back.\n", e.State)
					return nil
				}
			}
			// A first Ctrl-C does not stop a rollback half-way; a second one exits.
			ctx, stop := interrupt.SignalContextHint(cmd.Context(), cmd.ErrOrStderr(), rollbackHint)
			defer stop()
			res, err := e.Rollback(context.WithoutCancel(ctx))
			if res != nil && o.output == "json" {
				if jerr := json.NewEncoder(cmd.OutOrStdout()).Encode(res); jerr != nil {
					return jerr
				}
			} else if res != nil {
				fmt.Fprintf(cmd.OutOrStdout(), "Rolled back profile %s: restored %d settings (%s).\n", res.Profile,
					len(res.Restored), strings.Join(res.Restored, ", "))
			}
			return err
		},
	}
	o.hostFlags(cmd.Flags())
	o.outputFlag(cmd.Flags())
	cmd.Flags().BoolVar(&missingOK, "missing-ok", false, "succeed when no profile is applied (nothing to roll back)")
	return cmd
}

// status is what `tune status` prints.
type status struct {
	Applied  bool           `json:"applied"`
	State    string         `json:"state"`
	Profile  string         `json:"profile,omitempty"`
	Started  time.Time      `json:"started_at,omitzero"`
	Finished time.Time      `json:"applied_at,omitzero"`
	Complete bool           `json:"complete"`
	Settings []statusRecord `json:"settings,omitempty"`
}

type statusRecord struct {
	tuner.Item
	Previous string `json:"previous"`
	Changed  bool   `json:"changed"`
}

func newStatus() *cobra.Command {
	var o opts
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the applied profile: when, each setting's earlier and current value, pending restarts",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := console.CheckOutput(o.output); err != nil {
				return err
			}
			h, err := o.host()
			if err != nil {
				return err
			}
			e := o.engineAt(cmd, h)
			st, err := tuner.LoadState(e.State)
			if err != nil {
				return err
			}
			out := status{State: e.State}
			if st != nil {
				out.Applied, out.Profile, out.Started, out.Finished, out.Complete = true, st.Profile, st.Started, st.Finished, st.Complete()
				if e.Settings, err = e.Recorded(st); err != nil {
					return err
				}
				items, err := e.Current(cmd.Context(), false)
				if err != nil {
					return err
				}
				for i, it := range items {
					r := st.Settings[i]
					out.Settings = append(out.Settings, statusRecord{Item: it, Previous: show(r.Previous.Text, r.Previous.Present), Changed: r.Changed})
				}
			}
			if o.output == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(out)
			}
			return out.text(cmd.OutOrStdout())
		},
	}
	o.hostFlags(cmd.Flags())
	o.outputFlag(cmd.Flags())
	return cmd
}

func (s status) text(w io.Writer) error {
	if !s.Applied {
		fmt.Fprintf(w, "No profile is applied on this node (no state at %s).\n", s.State)
		return nil
	}
	if !s.Complete {
		fmt.Fprintf(w, "Profile %s: an apply started %s did not finish; run nodectl tune rollback.\n", s.Profile, s.Started.Format(time.RFC3339))
	} else {
		fmt.Fprintf(w, "Profile %s applied %s (state %s).\n\n", s.Profile, s.Finished.Format(time.RFC3339), s.State)
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SETTING\tBEFORE\tDESIRED\tNOW\t")
	for _, r := range s.Settings {
		now := "holds"
		if r.Change {
			now = "DRIFT: " + show(r.Current, r.Present)
		}
		if !r.Changed {
			now += " (held before apply)"
		}
		if r.Restart != "" && r.Pending {
			now += ", pending " + r.Restart + " restart"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.ID, r.Previous, r.Desired, now)
	}
	return tw.Flush()
}
