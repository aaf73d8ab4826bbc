// Package tune is `nodectl tune`: plan, apply, verify, roll back and validate a node-tuning
// profile.
package tune

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nodectl/nodectl/host"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/utils/cpuset"

	"github.com/nodectl/nodectl/cli/internal/console"
	"github.com/nodectl/nodectl/cli/internal/remote"
	"github.com/nodectl/nodectl/tuner"
	"github.com/nodectl/nodectl/tuner/backends"
	"github.com/nodectl/nodectl/tuner/profile"
	"github.com/nodectl/nodectl/tuner/sysctl"
)

// ErrDrift is returned by verify when a setting differs from what is wanted; main exits 3 on
// it, so scripts tell drift (3) from failure (1).
var ErrDrift = errors.New("drift")

// New returns the tune command group.
func New() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tune",
		Short: "Tune the node for dense sandboxes: plan, apply, verify, roll back, validate",
		Long: `nodectl tune changes the node's settings from a profile, all or nothing: plan shows each
setting's current and desired value and what needs a restart; apply records every earlier
value in a state file before changing anything, applies in order and verifies each change,
and rolls back everything already applied when one fails; verify reports drift; rollback
restores exactly what apply recorded. The built-in profile sandbox-density carries the
settings of the seed report's node tuner (reserved system CPUs, ARP neighbour cache, journald
limits and storage, swap sysctls), sized from the node's CPU count. A profile is a built-in's
name, a YAML file in nodectl's format (docs/tuning-profiles.md), or a GKE node system config
file (linuxConfig.sysctl, linuxConfig.swapConfig), so a node pool's config can be checked
against a node.

With --node NODE (every command but watch) it acts on that node of a cluster through the API
server, in a short-lived privileged tuner pod pinned to the node, which needs deploy/base's
ClusterRoles nodectl-tune and nodectl-stress (docs/deploy.md).`,
		Example: `  nodectl tune plan
  sudo nodectl tune apply --profile sandbox-density
  nodectl tune verify -o json
  nodectl tune verify --profile swap-dedicated-lssd.yaml
  sudo nodectl tune rollback
  sudo nodectl tune validate --profile sandbox-density -- stress noisy --heartbeat 100ms --hog churn,count=2 --trace
  nodectl --node gke-pool-1-abcd tune status`,
	}
	for _, sub := range []*cobra.Command{newPlan(), newApply(), newVerify(), newRollback(), newStatus()} {
		cmd.AddCommand(onNodeToo(sub))
	}
	cmd.AddCommand(newValidate(), newWatch())
	return cmd
}

// onNodeToo lets a one-shot tune command run on another node with --node, in a tuner pod there
// (runOnNode); watch stays on this machine (the DaemonSet's tuner container is the node's).
func onNodeToo(c *cobra.Command) *cobra.Command {
	local := c.RunE
	c.RunE = func(cmd *cobra.Command, args []string) error {
		node, err := onNode(cmd)
		if err != nil {
			return err
		}
		if node == "" {
			return local(cmd, args)
		}
		return runOnNode(cmd, node)
	}
	return remote.Supports(c)
}

// opts are the flags every tune command shares.
type opts struct {
	hostRoot, procfs, sysfs, cgroupfs, state string
	profile                                  string
	profileYAML                              string
	output                                   string
}

func (o *opts) hostFlags(f *pflag.FlagSet) {
	f.StringVar(&o.hostRoot, "host-root", "/", "the node's root filesystem (/host in a DaemonSet; a scratch tree in tests): drop-ins, mounts and the state file are below it")
	f.StringVar(&o.procfs, "procfs", "", "procfs of the node (default <host-root>/proc)")
	f.StringVar(&o.sysfs, "sysfs", "", "sysfs of the node (default <host-root>/sys)")
	f.StringVar(&o.cgroupfs, "cgroupfs", "", "cgroup filesystem root of the node (default <sysfs>/fs/cgroup)")
	f.StringVar(&o.state, "state", "", "state file recording what apply changed (default <host-root>"+tuner.DefaultStateFile+")")
}

func (o *opts) profileFlag(f *pflag.FlagSet, def string) {
	usage := "profile: a built-in (" + strings.Join(profile.Builtins(), ", ") + "), a nodectl profile file or a GKE node system config file"
	f.StringVar(&o.profile, "profile", def, usage)
	// How `tune --node` hands a profile file on the user's machine to the tuner pod on the
	// node: the file's content, parsed as if read from --profile's path.
	f.StringVar(&o.profileYAML, flagProfileYAML, "", "the profile's YAML itself, named by --profile")
	_ = f.MarkHidden(flagProfileYAML)
}

// flagProfileYAML carries a profile file's content to a node's tuner pod.
const flagProfileYAML = "profile-yaml"

func (o *opts) outputFlag(f *pflag.FlagSet) {
	f.StringVarP(&o.output, "output", "o", "text", "output format: text or json")
}

func (o *opts) host() (host.FS, error) {
	if !filepath.IsAbs(o.hostRoot) {
		return host.FS{}, fmt.Errorf("--host-root %q: must be an absolute path", o.hostRoot)
	}
	if fi, err := os.Stat(o.hostRoot); err != nil || !fi.IsDir() {
		return host.FS{}, fmt.Errorf("--host-root %q: not a directory", o.hostRoot)
	}
	h := host.At(o.hostRoot)
	if o.procfs != "" {
		h.Procfs = o.procfs
	}
	if o.sysfs != "" {
		h.Sysfs = o.sysfs
		h.Cgroupfs = filepath.Join(o.sysfs, "fs/cgroup")
	}
	if o.cgroupfs != "" {
		h.Cgroupfs = o.cgroupfs
	}
	return h, nil
}

func (o *opts) statePath(h host.FS) string {
	if o.state != "" {
		return o.state
	}
	return h.Path(tuner.DefaultStateFile)
}

// loaded is a resolved profile with its settings on the node.
type loaded struct {
	host    host.FS
	profile *profile.Profile
	cpus    int
	engine  *tuner.Engine
}

// load reads and resolves the profile against the node and builds its engine; nothing on the
// node changes, so a bad profile is refused before anything is touched.
func (o *opts) load(cmd *cobra.Command) (*loaded, error) {
	h, err := o.host()
	if err != nil {
		return nil, err
	}
	var raw *profile.Profile
	if o.profileYAML != "" {
		raw, err = profile.Parse([]byte(o.profileYAML), o.profile)
	} else {
		raw, err = profile.Load(o.profile)
	}
	if err != nil {
		return nil, fmt.Errorf("--profile %s: %w", o.profile, err)
	}
	online, err := onlineCPUs(h)
	if err != nil {
		return nil, err
	}
	cpus := online.Size()
	p, err := raw.Resolve(profile.Node{CPUs: cpus, Online: online.String(), SysctlExists: func(k string) bool { return sysctl.Exists(h, k) }})
	if err != nil {
		return nil, fmt.Errorf("profile %s is refused, nothing was changed:\n%w", o.profile, err)
	}
	e := o.engineAt(cmd, h)
	e.Profile = p.Name
	e.Settings = backends.Settings(h, p)
	return &loaded{host: h, profile: p, cpus: cpus, engine: e}, nil
}

// engineAt is an engine without settings, for rollback and status, which work from the state
// file alone.
func (o *opts) engineAt(cmd *cobra.Command, h host.FS) *tuner.Engine {
	return &tuner.Engine{State: o.statePath(h), Decode: backends.Decoder(h), Log: console.Logger(cmd.ErrOrStderr(), false)}
}

// onlineCPUs are the node's online CPUs, from sysfs: a node may have some offline, or a
// list that does not start at 0.
func onlineCPUs(h host.FS) (cpuset.CPUSet, error) {
	p := filepath.Join(h.Sysfs, "devices/system/cpu/online")
	b, err := os.ReadFile(p)
	if err != nil {
		return cpuset.CPUSet{}, fmt.Errorf("reading the node's online CPUs: %w", err)
	}
	set, err := cpuset.Parse(strings.TrimSpace(string(b)))
	if err != nil {
		return cpuset.CPUSet{}, fmt.Errorf("reading the node's online CPUs: %s: %w", p, err)
	}
	return set, nil
}

// needRoot refuses to change the node without root.
func needRoot(what string) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("nodectl tune %s changes the node's kernel settings, files, mounts and cgroups: it needs root; run it with sudo (nothing was changed)", what)
	}
	return nil
}
