// Package kubelet is the tuner's kubelet backend: a KubeletConfiguration drop-in, read by
// `kubelet --config-dir`, that reserves CPUs for system daemons (reservedSystemCPUs). The
// kubelet reads it only when it starts, so the setting reports itself pending until then.
package kubelet

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/prometheus/procfs"
	"k8s.io/utils/cpuset"

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
	h    tuner.Host
	spec Spec
}

// NewDropIn is the drop-in at file (a path on the node) reserving the CPU list reservedCPUs,
// written as given.
func NewDropIn(h tuner.Host, file, reservedCPUs string) tuner.Setting {
	return &dropIn{h: h, spec: Spec{File: file, ReservedCPUs: reservedCPUs}}
}

// Decode rebuilds a drop-in from its recorded Spec.
func Decode(h tuner.Host, raw json.RawMessage) (tuner.Setting, error) {
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

func (d *dropIn) Restore(_ context.Context, prev tuner.Value) error {
	if _, err := d.file().Restore(prev); err != nil {
		return d.errf("%v", err)
	}
	return nil
}

// kubelets are the running kubelet processes.
func (d *dropIn) kubelets() ([]procfs.Proc, error) {
	pfs, err := procfs.NewFS(d.h.Procfs)
	if err != nil {
		return nil, err
	}
	procs, err := pfs.AllProcs()
	if err != nil {
		return nil, err
	}
	var out []procfs.Proc
	for _, p := range procs {
		if comm, err := p.Comm(); err == nil && comm == "kubelet" {
			out = append(out, p)
		}
	}
	return out, nil
}

// Pending reports whether no kubelet started after the drop-in was last written.
func (d *dropIn) Pending(context.Context) (bool, error) {
	fi, err := os.Stat(d.path())
	if err != nil {
		return true, nil
	}
	written := float64(fi.ModTime().UnixNano()) / 1e9
	ks, err := d.kubelets()
	if err != nil {
		return false, d.errf("finding the kubelet: %v", err)
	}
	for _, k := range ks {
		st, err := k.Stat()
		if err != nil {
			continue // exited
		}
		if started, err := st.StartTime(); err == nil && started > written {
			return false, nil
		}
	}
	return true, nil
}

// Note says when the kubelet will read the drop-in: only with --config-dir naming its
// directory.
func (d *dropIn) Note() string {
	dir := filepath.Dir(d.spec.File)
	ks, err := d.kubelets()
	if err != nil {
		return fmt.Sprintf("cannot tell whether a kubelet runs: %v", err)
	}
	if len(ks) == 0 {
		return fmt.Sprintf("no kubelet runs; the drop-in applies when the kubelet starts with --config-dir=%s", dir)
	}
	for _, k := range ks {
		args, err := k.CmdLine()
		if err == nil && configDir(args) == dir {
			return ""
		}
	}
	return fmt.Sprintf("the kubelet runs without --config-dir=%s, so it will not read the drop-in", dir)
}

// configDir is the kubelet's --config-dir, cleaned, from its command line.
func configDir(args []string) string {
	for i, a := range args {
		a = strings.TrimLeft(a, "-")
		if v, ok := strings.CutPrefix(a, "config-dir="); ok {
			return filepath.Clean(v)
		}
		if a == "config-dir" && i+1 < len(args) {
			return filepath.Clean(args[i+1])
		}
	}
	return ""
}
