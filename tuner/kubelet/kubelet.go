// Package kubelet is the tuner's kubelet backend: a KubeletConfiguration drop-in, read by
// `kubelet --config-dir`, that reserves CPUs for system daemons (reservedSystemCPUs). The
// kubelet reads it only when it starts, so the setting reports itself pending until then,
// after a rollback as after an apply; nodectl never restarts the kubelet itself.
package kubelet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/nodectl/nodectl/host"

	"k8s.io/utils/cpuset"

	"github.com/nodectl/nodectl/host/daemons"
	"github.com/nodectl/nodectl/tuner"
	"github.com/nodectl/nodectl/tuner/nodefile"
)

// DefaultDropIn is where the profile puts the drop-in: a directory the kubelet reads with
// --config-dir.
const DefaultDropIn = "/etc/kubernetes/kubelet.conf.d/90-nodectl.conf"

// Backend is the backend's name in state files.
const Backend = "kubelet"

const header = "# Written by nodectl tune. `nodectl tune rollback` removes it.\n" +
	"apiVersion: kubelet.config.k8s.io/v1beta1\n" +
	"kind: KubeletConfiguration\n"

// ours matches exactly the bytes Render makes, for any CPU list.
var ours = regexp.MustCompile(`^` + regexp.QuoteMeta(header) + `reservedSystemCPUs: "([0-9,-]*)"\n$`)

// Render is the drop-in's content for the CPU list cpus, byte for byte.
func Render(cpus string) []byte {
	return []byte(header + fmt.Sprintf("reservedSystemCPUs: %q\n", cpus))
}

// Spec is the drop-in's parameters, as recorded in the state file.
type Spec struct {
	File         string `json:"file"`
	ReservedCPUs string `json:"reserved_cpus"`
}

type dropIn struct {
	h    host.FS
	spec Spec
}

// NewDropIn is the drop-in at file (a path on the node) reserving the CPU list reservedCPUs,
// written as given.
func NewDropIn(h host.FS, file, reservedCPUs string) tuner.Setting {
	return &dropIn{h: h, spec: Spec{File: file, ReservedCPUs: reservedCPUs}}
}

// Decode rebuilds a drop-in from its recorded Spec.
func Decode(h host.FS, raw json.RawMessage) (tuner.Setting, error) {
	var s Spec
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, fmt.Errorf("decoding kubelet drop-in spec: %w", err)
	}
	if s.File == "" || s.ReservedCPUs == "" {
		return nil, fmt.Errorf("decoding kubelet drop-in spec %s: want file and reserved_cpus", raw)
	}
	return NewDropIn(h, s.File, s.ReservedCPUs), nil
}

func (d *dropIn) ID() string      { return Backend + ":" + d.spec.File }
func (d *dropIn) Backend() string { return Backend }
func (d *dropIn) Desired() string { return d.spec.ReservedCPUs }
func (d *dropIn) Spec() any       { return d.spec }
func (d *dropIn) Restart() string { return "kubelet" }
func (d *dropIn) path() string    { return d.h.Path(d.spec.File) }

func (d *dropIn) errf(format string, args ...any) error {
	return fmt.Errorf("%s (%s): %s", d.ID(), d.path(), fmt.Sprintf(format, args...))
}

func (d *dropIn) file() nodefile.File { return nodefile.New(d.h, d.spec.File) }

func (d *dropIn) Read(context.Context) (tuner.Value, error) {
	v, err := d.file().Read(func(b []byte, _ fs.FileMode) string { return describe(b) })
	if err != nil {
		return tuner.Value{}, d.errf("%v", err)
	}
	return v, nil
}

// describe is the drop-in's Text: the CPU list when the file is ours, else what it holds.
func describe(b []byte) string {
	if m := ours.FindSubmatch(b); m != nil {
		return string(m[1])
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "reservedSystemCPUs:"); ok {
			return fmt.Sprintf("not written by nodectl (%d bytes), reservedSystemCPUs %s", len(b), strings.TrimSpace(v))
		}
	}
	return fmt.Sprintf("not written by nodectl (%d bytes)", len(b))
}

func (d *dropIn) Apply(ctx context.Context) error {
	if _, err := cpuset.Parse(d.spec.ReservedCPUs); err != nil || d.spec.ReservedCPUs == "" {
		return d.errf("reserved CPUs %q: want a CPU list such as 0,1 or 0-7", d.spec.ReservedCPUs)
	}
	cur, err := d.Read(ctx)
	if err != nil {
		return err
	}
	if cur.Present && cur.Text == d.Desired() {
		return nil // written already: the same bytes and mtime, so not pending again
	}
	if err := d.file().Write(Render(d.spec.ReservedCPUs), 0o644); err != nil {
		return d.errf("%v", err)
	}
	return nil
}

// Restore puts the previous file back. The running kubelet is not told: it keeps the reserved
// CPUs it started with until it restarts, and Pending says so (see there).
func (d *dropIn) Restore(_ context.Context, prev tuner.Value) error {
	if _, err := d.file().Restore(prev); err != nil {
		return d.errf("%v", err)
	}
	return nil
}

// kubelets are the node's running kubelets.
func (d *dropIn) kubelets() ([]daemons.Proc, error) { return daemons.Procs(d.h.Procfs, "kubelet") }

// Pending reports whether no kubelet has started since the drop-in was last written or, after
// a rollback removed it, since it was removed (its directory's modification time, or that of
// the nearest one above that is left): until then the running kubelet keeps the reserved CPUs
// it started with, applied or rolled back.
func (d *dropIn) Pending(context.Context) (bool, error) {
	changed, err := d.file().Changed()
	if err != nil {
		return false, d.errf("%v", err)
	}
	ks, err := d.kubelets()
	if err != nil {
		return false, d.errf("finding the kubelet in %s: %v", d.h.Procfs, err)
	}
	return daemons.Pending(ks, changed), nil
}

// Note says whether the kubelet will read the drop-in (only with --config-dir naming its
// directory), what its CPU manager needs before it restarts, and that a rollback, like an
// apply, takes effect only when the kubelet restarts.
func (d *dropIn) Note() string {
	dir := filepath.Dir(d.spec.File)
	ks, err := d.kubelets()
	if err != nil {
		return fmt.Sprintf("cannot tell whether a kubelet runs: %v", err)
	}
	var notes []string
	if len(ks) == 0 {
		notes = append(notes, fmt.Sprintf("no kubelet runs; the drop-in applies when the kubelet starts with --config-dir=%s", dir))
	} else if !slices.ContainsFunc(ks, func(k daemons.Proc) bool {
		args, err := k.CmdLine()
		return err == nil && configDir(args) == dir
	}) {
		notes = append(notes, fmt.Sprintf("the kubelet runs without --config-dir=%s, so it will not read the drop-in", dir))
	}
	if n := d.cpuManagerNote(ks); n != "" {
		notes = append(notes, n)
	}
	notes = append(notes, "rollback too takes effect only when the kubelet restarts: until then it keeps the reserved CPUs")
	return strings.Join(notes, "; ")
}

// cpuManagerNote is what the static CPU manager policy needs when the reserved CPUs change:
// the kubelet checks its checkpoint against them when it starts, and refuses to start when a
// reserved CPU is not in the checkpoint's shared pool (assigned to a container exclusively;
// with the strict-cpu-reservation option, when one is in it at all), asking for the node to
// be drained and the file removed. Said as a condition unless the kubelet's policy is known.
func (d *dropIn) cpuManagerNote(ks []daemons.Proc) string {
	const advice = "before the kubelet restarts (after apply or rollback), drain the node and remove %s: " +
		"the kubelet refuses to start when its checkpoint has a reserved CPU assigned to a container"
	state := "/var/lib/kubelet/cpu_manager_state"
	if len(ks) != 1 {
		return "if cpuManagerPolicy is static, " + fmt.Sprintf(advice, state)
	}
	// An empty command line is one not set up yet (a kubelet in the middle of its exec).
	args, err := ks[0].CmdLine()
	if err != nil || len(args) == 0 {
		return "if cpuManagerPolicy is static, " + fmt.Sprintf(advice, state)
	}
	if root := flag(args, "root-dir"); root != "" {
		state = filepath.Join(root, "cpu_manager_state")
	}
	switch policy, known := d.cpuManagerPolicy(args); {
	case !known:
		return "if cpuManagerPolicy is static, " + fmt.Sprintf(advice, state)
	case policy == "static":
		return "the kubelet's cpuManagerPolicy is static: " + fmt.Sprintf(advice, state)
	}
	return ""
}

// policyLine is the cpuManagerPolicy line of a kubelet configuration file, YAML or JSON
// written a key a line (no other KubeletConfiguration field has that name).
var policyLine = regexp.MustCompile(`(?m)^[ \t]*"?cpuManagerPolicy"?[ \t]*:[ \t]*["']?([A-Za-z]*)["']?[ \t]*,?[ \t]*(#.*)?$`)

// cpuManagerPolicy is the kubelet's CPU manager policy as its command line, its --config file
// and the drop-ins of its --config-dir set it (later ones win, the flag over all), "none" when
// none does; known is false when a file named there cannot be read.
func (d *dropIn) cpuManagerPolicy(args []string) (policy string, known bool) {
	if p := flag(args, "cpu-manager-policy"); p != "" {
		return p, true
	}
	var files []string
	if c := flag(args, "config"); c != "" {
		files = append(files, c)
	}
	if dir := configDir(args); dir != "" {
		ents, err := os.ReadDir(d.h.Path(dir))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", false
		}
		for _, e := range ents { // sorted by name, the order the kubelet merges them in
			if !e.IsDir() && strings.HasSuffix(e.Name(), ".conf") {
				files = append(files, filepath.Join(dir, e.Name()))
			}
		}
	}
	policy = "none"
	for _, f := range files {
		if !filepath.IsAbs(f) {
			return "", false // relative to the kubelet's directory
		}
		b, err := os.ReadFile(d.h.Path(f))
		if err != nil {
			return "", false
		}
		if m := policyLine.FindAllSubmatch(b, -1); len(m) > 0 {
			policy = string(m[len(m)-1][1])
		}
	}
	return policy, true
}

// configDir is the kubelet's --config-dir, cleaned, from its command line.
func configDir(args []string) string {
	if v := flag(args, "config-dir"); v != "" {
		return filepath.Clean(v)
	}
	return ""
}

// flag is the value of the flag --name (or -name) on a command line, as --name=v or --name v;
// "" when it is not there.
func flag(args []string, name string) string {
	for i, a := range args {
		if !strings.HasPrefix(a, "-") {
			continue
		}
		a = strings.TrimLeft(a, "-")
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}
