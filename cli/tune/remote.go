package tune

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/nodectl/nodectl/cli/internal/interrupt"
	"github.com/nodectl/nodectl/cli/internal/podrun"
	"github.com/nodectl/nodectl/cli/internal/remote"
	"github.com/nodectl/nodectl/stress"
	"github.com/nodectl/nodectl/tuner/profile"
)

// With --node, a tune command runs on that node in a short-lived privileged tuner pod
// (podrun.Tune), created through the API server in a namespace of its own: the agent has no
// right to change the node, and nothing listens on the node for it.

// hostFlagNames are the flags that say where this machine's node is; on --node the tuner pod
// sees the node's root at podrun.HostRoot and its state file where a tune on the node keeps it.
var hostFlagNames = []string{"host-root", "procfs", "sysfs", "cgroupfs", "state"}

// tunerStepTimeout bounds one tuner pod, from its create call to its end: a pod that never
// starts (a node that is not ready) must not hold a validation's rollback forever.
const tunerStepTimeout = 5 * time.Minute

// onNode is the node a tune command acts on through the API server, "" for this machine.
func onNode(cmd *cobra.Command) (string, error) {
	node := remote.FromCommand(cmd).Node
	if node == "" {
		return "", nil
	}
	for _, name := range hostFlagNames {
		if f := cmd.Flags().Lookup(name); f != nil && f.Changed {
			return "", fmt.Errorf("--%s: not with --%s (the tuner pod sees the node's root at %s)", name, remote.FlagNode, podrun.HostRoot)
		}
	}
	return node, nil
}

// profileArgs are the tuner pod's --profile flags: a built-in by name, a file by its content
// (it is on this machine, not the node), parsed here first so that a bad file is refused
// before any pod is made.
func profileArgs(ref string) ([]string, error) {
	if ref == "" || slices.Contains(profile.Builtins(), ref) {
		if ref == "" {
			return nil, nil
		}
		return []string{"--profile", ref}, nil
	}
	data, err := os.ReadFile(ref)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("--profile %s is neither a built-in (%s) nor a file: %w", ref, strings.Join(profile.Builtins(), ", "), err)
		}
		return nil, fmt.Errorf("--profile %s: %w", ref, err)
	}
	if _, err := profile.Parse(data, ref); err != nil {
		return nil, fmt.Errorf("--profile %s: %w", ref, err)
	}
	return []string{"--profile", ref, "--" + flagProfileYAML, string(data)}, nil
}

// nodeTuner runs tune commands on a node through tuner pods of one run's namespace.
type nodeTuner struct {
	run     *podrun.Run
	profile []string // the tuner pod's --profile flags
	// applied is set once an apply pod was made: the node may hold the profile until a
	// rollback pod succeeds, and the namespace, with the apply pod in it, stays until then
	// so that `stress clean --node` finds and rolls it back.
	applied, rolledBack bool
}

// startNodeTuner checks the user's rights and makes the run's namespace on node.
func startNodeTuner(ctx context.Context, cmd *cobra.Command, node, what string) (*nodeTuner, error) {
	c, err := remote.Connect(remote.FromCommand(cmd))
	if err != nil {
		return nil, err
	}
	run, err := podrun.StartTuner(ctx, c, node, stress.NewRunID(what), cmd.ErrOrStderr())
	if err != nil {
		return nil, err
	}
	return &nodeTuner{run: run}, nil
}

// step runs one tune command in a pod named name and fails unless it exits 0.
func (t *nodeTuner) step(ctx context.Context, name, command string, keep bool, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, tunerStepTimeout)
	defer cancel()
	res, err := t.run.Tune(ctx, name, command, keep, args...)
	if err != nil {
		return nil, err
	}
	if res.ExitCode != 0 {
		return res.Log, fmt.Errorf("nodectl tune %s on node %s (pod %s) exited %d:\n%s", command, t.run.Node, res.Pod, res.ExitCode, strings.TrimSpace(string(res.Log)))
	}
	return res.Log, nil
}

// Applied is the profile `tune status` finds applied on the node.
func (t *nodeTuner) Applied(ctx context.Context) (string, error) {
	log, err := t.step(ctx, "tune-status", "status", false, "-o", "json")
	if err != nil {
		return "", err
	}
	var s status
	if err := decodeFromLog(log, &s); err != nil {
		return "", fmt.Errorf("tune status on node %s: %w", t.run.Node, err)
	}
	if s.Applied {
		return s.Profile, nil
	}
	return "", nil
}

// Apply applies the profile in an apply pod, which is kept as the mark that the node may hold
// it. A failed apply is rolled back at once (validate rolls back only what applied): the
// engine restores on a failure it sees, but not when its own restore failed, nor when the
// apply's end is unknown (the API server lost, the pod gone); nothing applied is fine.
func (t *nodeTuner) Apply(ctx context.Context) ([]string, error) {
	t.applied = true
	log, err := t.step(ctx, "tune-apply", "apply", true, append(slices.Clone(t.profile), "-o", "json")...)
	if err != nil {
		return nil, errors.Join(err, t.Rollback(ctx))
	}
	var res struct {
		Changed []string `json:"changed"`
	}
	if err := decodeFromLog(log, &res); err != nil {
		return nil, errors.Join(fmt.Errorf("tune apply on node %s: %w", t.run.Node, err), t.Rollback(ctx))
	}
	return res.Changed, nil
}

// Rollback restores the node in a rollback pod; a node where nothing is applied (the apply
// restored it itself) is fine.
func (t *nodeTuner) Rollback(ctx context.Context) error {
	log, err := t.step(ctx, "tune-rollback", "rollback", false, "--missing-ok")
	if err != nil {
		return err
	}
	t.rolledBack = true
	fmt.Fprintf(t.run.Progress(), "%s", log)
	return nil
}

// finish deletes the run's namespace, unless a profile the run applied may still hold on the
// node: the namespace then stays, so that `stress clean --node` rolls it back.
func (t *nodeTuner) finish(ctx context.Context, keep bool) {
	if t.applied && !t.rolledBack && !keep {
		fmt.Fprintf(t.run.Progress(), "nodectl: profile not rolled back on node %s: namespace %s is kept; nodectl --node %s stress clean rolls it back and removes it\n",
			t.run.Node, t.run.Namespace, t.run.Node)
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Minute)
	defer cancel()
	if err := t.run.Delete(dctx); err != nil {
		fmt.Fprintf(t.run.Progress(), "nodectl: %v\n", err)
	}
}

// decodeFromLog decodes the JSON object a tune command printed with -o json from its pod's
// log, which holds its standard error too: from the first line that opens an object.
func decodeFromLog(log []byte, v any) error {
	for off := 0; off < len(log); {
		line := log[off:]
		if i := bytes.IndexByte(line, '\n'); i >= 0 {
			line = line[:i+1]
		}
		if bytes.HasPrefix(line, []byte("{")) {
			if err := json.NewDecoder(bytes.NewReader(log[off:])).Decode(v); err == nil {
				return nil
			}
		}
		off += len(line)
	}
	return fmt.Errorf("no JSON result in its output:\n%s", strings.TrimSpace(string(log)))
}

// passOn is the command line of a tune command for its pod on the node: the flags given, the
// profile file's content with it.
func passOn(cmd *cobra.Command) ([]string, error) {
	var args []string
	var err error
	local := cmd.LocalFlags()
	cmd.Flags().Visit(func(f *pflag.Flag) {
		switch {
		case local.Lookup(f.Name) == nil: // the root's: --node and its kin
		case f.Name == "profile":
			var p []string
			if p, err = profileArgs(f.Value.String()); err == nil {
				args = append(args, p...)
			}
		case f.Name != flagProfileYAML:
			args = append(args, "--"+f.Name+"="+f.Value.String())
		}
	})
	return args, err
}

// runOnNode runs a tune command on node in a tuner pod and prints what it printed; its exit
// code is the command's (3 for verify's drift).
func runOnNode(cmd *cobra.Command, node string) error {
	args, err := passOn(cmd)
	if err != nil {
		return err
	}
	ctx, stop := remoteSignals(cmd)
	defer stop()
	t, err := startNodeTuner(ctx, cmd, node, "tune-"+cmd.Name())
	if err != nil {
		return err
	}
	defer t.finish(ctx, true)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tunerStepTimeout)
	defer cancel()
	res, err := t.run.Tune(ctx, "tune-"+cmd.Name(), cmd.Name(), false, args...)
	if err != nil {
		return err
	}
	if _, err := io.Copy(cmd.OutOrStdout(), bytes.NewReader(res.Log)); err != nil {
		return err
	}
	switch res.ExitCode {
	case 0:
		return nil
	case 3:
		return fmt.Errorf("%w on node %s", ErrDrift, node)
	default:
		return fmt.Errorf("nodectl tune %s on node %s (pod %s) exited %d", cmd.Name(), node, res.Pod, res.ExitCode)
	}
}

// validateOnNode is `tune validate` on node: the stress runs are runs of pods on it, the
// profile is applied and rolled back by tuner pods.
func validateOnNode(cmd *cobra.Command, node string, o *opts, stressArgs []string, out, html string, keep bool) error {
	for _, a := range stressArgs {
		name, _, _ := strings.Cut(a, "=")
		if slices.Contains([]string{"--" + remote.FlagNode, "--" + remote.FlagKubeconfig, "--" + remote.FlagContext, "--" + remote.FlagNamespace}, name) {
			return fmt.Errorf("stress flag %s: give it before tune (nodectl %s ... tune validate), for the tuner and both runs", name, name)
		}
	}
	prof, err := profileArgs(o.profile)
	if err != nil {
		return err
	}
	if out == "" {
		out = filepath.Join(os.TempDir(), "nodectl-validate", time.Now().UTC().Format("20060102-150405"))
	}
	rf := remote.FromCommand(cmd)
	root := []string{"--" + remote.FlagNode, node, "--" + remote.FlagNamespace, rf.Namespace}
	if rf.Kubeconfig != "" {
		root = append(root, "--"+remote.FlagKubeconfig, rf.Kubeconfig)
	}
	if rf.Context != "" {
		root = append(root, "--"+remote.FlagContext, rf.Context)
	}
	ctx, stop := remoteSignals(cmd)
	defer stop()
	t, err := startNodeTuner(ctx, cmd, node, "tune-validate")
	if err != nil {
		return err
	}
	t.profile = prof
	defer t.finish(ctx, keep)
	return runValidate(ctx, cmd, o, t, o.profile, append(root, stressArgs...), out, html, keep)
}

// remoteSignals is the signal context of a tune on a node: a second Ctrl-C leaves the
// namespace, and maybe the profile, for stress clean.
func remoteSignals(cmd *cobra.Command) (context.Context, context.CancelFunc) {
	return interrupt.SignalContextHint(cmd.Context(), cmd.ErrOrStderr(), fmt.Sprintf("run 'nodectl --node %s stress clean' to roll back and remove what is left", remote.FromCommand(cmd).Node))
}
