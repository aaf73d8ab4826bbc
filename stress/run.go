package stress

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nodectl/nodectl/host"
	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/record/trace/tracefs"
	"github.com/nodectl/nodectl/stress/launch"
)

// RunOptions are what every scenario takes besides its own knobs: how workloads run, whether
// to trace, where the run goes, and how it reports.
type RunOptions struct {
	Runtime       launch.Runtime // runs the workloads; "" = process
	RunscPlatform string         // gVisor platform for the runsc runtime; "" = detected
	Trace         bool
	Out           string        // run directory; "" = DefaultRunsDir/<run-id>
	Interval      time.Duration // sampling interval; 0 = 1s
	Exe           string        // the nodectl binary that runs workloads; "" = this executable
	Args          []string      // the command line, recorded in meta.json
	Paths         Paths
	Progress      io.Writer // live progress line; nil = none
	ProgressTTY   bool
	Log           *slog.Logger // nil = discard
	// CPUs is the node's tuned CPU partition, which the run honours; zero = none.
	CPUs CPUPartition
}

// CPUPartition is a live partition of the node's CPUs (nodectl tune's reserved CPUs): CPU
// lists for the system and for workloads.
type CPUPartition struct {
	System    string
	Workloads string
}

// defaults fills in what was left unset.
func (o *RunOptions) defaults() error {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.Exe == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("finding the nodectl binary: %w", err)
		}
		o.Exe = exe
	}
	return nil
}

// Paths are the locations a run uses: the node's filesystems, and where runs keep their files;
// configuration, never literals, so the same code works on /host in a DaemonSet and on a
// scratch tree in tests.
type Paths struct {
	host.FS
	Scratch string // parent of each run's scratch directory (files workloads write)
	State   string // parent of each live run's state directory (owner pid)
}

// DefaultPaths are the machine's own.
func DefaultPaths() Paths {
	return Paths{FS: host.Default(), Scratch: "/var/tmp/nodectl", State: "/run/nodectl"}
}

// NewRunID returns a sortable, unique run id for a scenario; runIDPattern must match it.
func NewRunID(scenario string) string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s-%s-%s", scenario, time.Now().UTC().Format("20060102-150405"), hex.EncodeToString(b))
}

// runIDPattern matches what NewRunID makes, so that Clean leaves alone whatever else lives under
// the shared parent (tests' cgroups, another tool's).
var runIDPattern = regexp.MustCompile(`^[a-z0-9-]+-[0-9]{8}-[0-9]{6}-[0-9a-f]{6}$`)

// IsRunID says whether id has the form NewRunID gives.
func IsRunID(id string) bool { return runIDPattern.MatchString(id) }

// RunCgroup is the cgroup path of a run.
func RunCgroup(id string) string { return cgroup.Parent + "/" + id }

// claim marks a run as live: its state directory holds the owner's pid, so `stress clean`
// leaves it alone while the owner runs.
func claim(p Paths, id string) (func(), error) {
	dir := filepath.Join(p.State, id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("making run state %s: %w", dir, err)
	}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("writing run state: %w", err)
	}
	return func() { os.RemoveAll(dir) }, nil
}

// tracefsFile, in a run's state directory, names the tracefs mount the run made.
const tracefsFile = "tracefs"

// noteTracefs records in the run's state that it mounted tracefs at dir, so that `stress clean`
// can unmount it if the run is killed before it does.
func noteTracefs(p Paths, id, dir string) error {
	if err := os.WriteFile(filepath.Join(p.State, id, tracefsFile), []byte(dir+"\n"), 0o644); err != nil {
		return fmt.Errorf("recording the tracefs mount in the run state: %w", err)
	}
	return nil
}

// targetsFile, in a run's state directory, lists the directories the run made outside its
// scratch directory (`nodectl-<id>` below a user's --target or target=), one per line.
const targetsFile = "targets"

// TargetDir is the directory a run makes below a user's target directory, and notes in its
// state so that `stress clean` removes it after a kill.
func TargetDir(p Paths, id, target string) (string, error) {
	dir := filepath.Join(target, "nodectl-"+id)
	f, err := os.OpenFile(filepath.Join(p.State, id, targetsFile), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return "", fmt.Errorf("recording the target directory in the run state: %w", err)
	}
	defer f.Close()
	if _, err := fmt.Fprintln(f, dir); err != nil {
		return "", fmt.Errorf("recording the target directory in the run state: %w", err)
	}
	return dir, nil
}

// removeTargets removes the directories a killed run made below users' targets; only those
// named after the run, whatever the state file says.
func removeTargets(p Paths, id string, rep *CleanReport) {
	b, err := os.ReadFile(filepath.Join(p.State, id, targetsFile))
	if err != nil {
		return
	}
	for _, dir := range strings.Fields(string(b)) {
		if filepath.Base(dir) != "nodectl-"+id || !dirExists(dir) {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			rep.Errors = append(rep.Errors, err.Error())
		} else {
			rep.Removed = append(rep.Removed, dir)
		}
	}
}

// RuntimeState is where a run keeps its container runtime's state (bundles, root filesystem,
// the runtime's --root), so that `stress clean` can delete a killed run's containers.
func RuntimeState(p Paths, id string) string { return filepath.Join(p.State, id, "runtime") }

func dirExists(dir string) bool {
	st, err := os.Stat(dir)
	return err == nil && st.IsDir()
}

// pruneDirs removes the scratch and state parents when no run uses them any more; a directory
// that is not empty stays.
func pruneDirs(p Paths) {
	for _, d := range []string{p.Scratch, p.State} {
		_ = os.Remove(d)
	}
}

// anyRunAlive reports whether any run's owner still runs.
func anyRunAlive(p Paths) bool {
	ents, _ := os.ReadDir(p.State)
	for _, e := range ents {
		if e.IsDir() && ownerAlive(p, e.Name()) {
			return true
		}
	}
	return false
}

// ownerFile in a run's state directory holds the pid of the process that claimed the run.
const ownerFile = "pid" //rundir:other: a file's name

// ownerAlive reports whether the process that claimed run id still runs.
func ownerAlive(p Paths, id string) bool {
	b, err := os.ReadFile(filepath.Join(p.State, id, ownerFile))
	if err != nil {
		return false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return false
	}
	err = syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// CleanReport lists what Clean removed or left.
type CleanReport struct {
	Removed []string `json:"removed"`
	Skipped []string `json:"skipped,omitempty"` // live runs, left alone
	Errors  []string `json:"errors,omitempty"`
}

// Clean removes what runs left behind: their cgroups (killing what still runs in them), scratch
// files and state: every run's, or only those of ids when given. Runs whose owner is alive are
// skipped unless all is set.
func Clean(ctx context.Context, p Paths, ids []string, all bool, log *slog.Logger) (CleanReport, error) {
	var rep CleanReport
	for _, id := range ids {
		if !runIDPattern.MatchString(id) {
			return rep, fmt.Errorf("%q is not a run id (like noisy-20260101-120000-a1b2c3)", id)
		}
	}
	layout, err := cgroup.DetectProcfs(p.Cgroupfs, p.Procfs)
	if err != nil {
		return rep, err
	}
	hasCgroup := map[string]bool{} // run id -> it has a cgroup, else only files
	runs, err := layout.Children(cgroup.Parent)
	if err != nil {
		return rep, fmt.Errorf("listing runs under %s: %w", cgroup.Parent, err)
	}
	for _, r := range runs {
		if id := filepath.Base(r); runIDPattern.MatchString(id) {
			hasCgroup[id] = true
		}
	}
	for _, dir := range []string{p.Scratch, p.State} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if _, ok := hasCgroup[e.Name()]; !ok && e.IsDir() && runIDPattern.MatchString(e.Name()) {
				hasCgroup[e.Name()] = false
			}
		}
	}
	for _, id := range slices.Sorted(maps.Keys(hasCgroup)) {
		if len(ids) > 0 && !slices.Contains(ids, id) {
			continue
		}
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
		if !all && ownerAlive(p, id) {
			rep.Skipped = append(rep.Skipped, id)
			continue
		}
		// Containers first: the runtime kills them and forgets them; then their cgroups go.
		if rt := RuntimeState(p, id); dirExists(rt) {
			if err := launch.CleanRuntimeState(rt); err != nil {
				rep.Errors = append(rep.Errors, err.Error())
			} else {
				rep.Removed = append(rep.Removed, "containers and runtime state "+rt)
			}
		}
		if hasCgroup[id] {
			if err := layout.Remove(RunCgroup(id)); err != nil {
				rep.Errors = append(rep.Errors, err.Error())
			} else {
				rep.Removed = append(rep.Removed, "cgroup "+RunCgroup(id))
			}
		}
		// A swap area and sysctls a density run changed are put back once its cgroups are gone;
		// what could not be stays recorded in the run's state, for another clean.
		dirs := []string{filepath.Join(p.Scratch, id), filepath.Join(p.State, id)}
		if what, err := rollbackHost(p, id, log); err != nil {
			rep.Errors = append(rep.Errors, err.Error())
			dirs = dirs[:1]
		} else if what != "" {
			rep.Removed = append(rep.Removed, "host settings (restored "+what+")")
		}
		// A tracefs the killed run mounted goes too, unless a live run may be using it.
		if b, err := os.ReadFile(filepath.Join(p.State, id, tracefsFile)); err == nil && !anyRunAlive(p) {
			dir := strings.TrimSpace(string(b))
			if m := tracefs.Adopt(dir); m.Mounted() {
				if err := m.Release(); err != nil {
					rep.Errors = append(rep.Errors, err.Error())
				} else {
					rep.Removed = append(rep.Removed, "tracefs mount "+dir)
				}
			}
		}
		removeTargets(p, id, &rep)
		for _, dir := range dirs {
			if _, err := os.Stat(dir); err == nil {
				if err := os.RemoveAll(dir); err != nil {
					rep.Errors = append(rep.Errors, err.Error())
				} else {
					rep.Removed = append(rep.Removed, dir)
				}
			}
		}
		log.Debug("cleaned run", "id", id)
	}
	// The parents themselves go when they are empty; a live run keeps them.
	if err := layout.Prune(cgroup.Parent); err != nil {
		rep.Errors = append(rep.Errors, err.Error())
	}
	pruneDirs(p)
	if len(rep.Errors) > 0 {
		return rep, fmt.Errorf("cleaning runs: %s", strings.Join(rep.Errors, "; "))
	}
	return rep, nil
}

// LiveLine writes a live progress line: rewritten in place on a terminal, a line every few
// seconds otherwise.
type LiveLine struct {
	w     io.Writer
	tty   bool
	last  time.Time
	width int
}

// NewLiveLine writes to w, in place if w is a terminal.
func NewLiveLine(w io.Writer, tty bool) *LiveLine { return &LiveLine{w: w, tty: tty} }

// Update shows line.
func (p *LiveLine) Update(line string) {
	if p.w == nil {
		return
	}
	if p.tty {
		pad := max(0, p.width-len(line))
		fmt.Fprintf(p.w, "\r%s%s", line, strings.Repeat(" ", pad))
		p.width = len(line)
		return
	}
	if time.Since(p.last) >= 5*time.Second {
		fmt.Fprintln(p.w, line)
		p.last = time.Now()
	}
}

// Done ends the line on a terminal, for what is written next.
func (p *LiveLine) Done() {
	if p.w != nil && p.tty && p.width > 0 {
		fmt.Fprintln(p.w)
		p.width = 0
	}
}
