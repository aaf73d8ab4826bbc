//go:build linux

package agent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/nodectl/nodectl/agent/flightrec"
	"github.com/nodectl/nodectl/agent/recorded"
	"github.com/nodectl/nodectl/bench/internal/proc"
	"github.com/nodectl/nodectl/rundir"
)

// postmortemWindow is the window analyzed; the agent's default baseline comes before it.
const postmortemWindow = time.Hour

// binaryRuns is how many times the binary analyzes the window (odd: their median is reported).
const binaryRuns = 3

// BenchmarkPostmortem1h writes an hour of 1,000 cgroups at 1 s into a flight recorder, and
// the default baseline before it, with a meta.json as the agent writes it, then times
// `nodectl analyze --data-dir DIR --from T1 --to T2` end to end (the real binary), and the
// same analysis as the agent makes it for `analyze --from --to` or a post-mortem, in this
// process under the agent's memory limit: issue 33 wants at most 3 s of CPU and 32 MiB above
// the agent's RSS. It runs once whatever b.N (use -benchtime 1x).
func BenchmarkPostmortem1h(b *testing.B) {
	dir := b.TempDir()
	bin, err := proc.Nodectl(dir)
	if err != nil {
		b.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	baseline := recorded.DefaultWindows.Baseline
	to := time.Now().UTC().Truncate(time.Second)
	w := recorded.Window{BaselineFrom: to.Add(-postmortemWindow - baseline), From: to.Add(-postmortemWindow), To: to}
	t0 := time.Now()
	st, err := writeWindow(data, w)
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("wrote %d ticks of %d series (%.1f MB) in %s", int(w.To.Sub(w.BaselineFrom)/time.Second)+1, st.Series,
		float64(st.Bytes)/1e6, time.Since(t0).Round(time.Second))

	args := []string{"analyze", "--data-dir", data, "--from", w.From.Format(time.RFC3339), "--to", w.To.Format(time.RFC3339), "-o", "json"}
	var wall, cpu []float64
	median := func(v []float64) float64 { return slices.Sorted(slices.Values(v))[len(v)/2] }
	var rss uint64
	var findings int
	for range binaryRuns {
		var out, stderr bytes.Buffer
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = &out, &stderr
		start := time.Now()
		if err := cmd.Run(); err != nil {
			b.Fatalf("nodectl %v: %v: %s", args, err, stderr.String())
		}
		wall = append(wall, time.Since(start).Seconds())
		cpu = append(cpu, (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds())
		rss = max(rss, uint64(cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss)<<10)
		if findings, err = countFindings(out.Bytes()); err != nil {
			b.Fatal(err)
		}
	}

	in := analyzeInAgent(b, data, w)

	const mib = 1 << 20
	fmt.Printf("\n== post-mortem over %s of %d cgroups at 1 s (%d series; %.1f MB on disk), %s baseline before it\n",
		postmortemWindow, liveCgroups, st.Series, float64(st.Bytes)/1e6, baseline)
	row := "%-52s %s\n"
	fmt.Printf(row, "nodectl analyze --data-dir --from --to, wall", fmt.Sprintf("median %.2f s, max %.2f s of %d runs  (issue: <= 5 s)",
		median(wall), slices.Max(wall), binaryRuns))
	fmt.Printf(row, "  its CPU time (user+sys), peak RSS, findings", fmt.Sprintf("median %.2f s, %.0f MiB, %d", median(cpu), float64(rss)/mib, findings))
	fmt.Printf("in the agent: read at %d ticks a phase, %d cgroups in focus, under its %d MiB memory limit\n", in.ticks, in.focus, agentMemoryLimit/mib)
	in.print()
	fmt.Printf(row, "  goals (issue 33)", fmt.Sprintf("CPU <= %.0f s: %s; RSS <= %d MiB above: %s",
		postmortemCPUGoal.Seconds(), met(in.cpu <= postmortemCPUGoal), postmortemRSSGoal/mib, met(in.rss <= postmortemRSSGoal)))

	if in.rss > postmortemRSSGuard {
		b.Errorf("the agent's analysis of the hour took %.1f MiB above its RSS; the guard is %d MiB (goal %d)", in.rssMiB(), postmortemRSSGuard/mib, postmortemRSSGoal/mib)
	}

	b.ReportMetric(median(wall), "analyze-s")
	b.ReportMetric(median(cpu), "analyze-cpu-s")
	b.ReportMetric(float64(rss)/mib, "analyze-rss-MiB")
	b.ReportMetric(in.cpu.Seconds(), "agent-cpu-s")
	b.ReportMetric(in.rssMiB(), "agent-rss-MiB")
	b.ReportMetric(0, "ns/op")
}

// A post-mortem of an hour of 1,000 cgroups in the agent, at most (issue 33), and the memory
// this benchmark fails above: room over the goal (27.9-31.1 MiB measured), below the 55 MiB of a
// read that decompressed each segment whole.
const (
	postmortemCPUGoal  = 3 * time.Second
	postmortemRSSGoal  = 32 << 20
	postmortemRSSGuard = 44 << 20
)

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

// windowSeed seeds the node writeWindow records.
const windowSeed = 12

// writeWindow fills dir's flight recorder with the window, a tick a second, and writes the
// agent's meta.json beside it.
func writeWindow(dir string, w recorded.Window) (flightrec.Status, error) {
	s, err := flightrec.Open(flightrec.Options{Dir: dir})
	if err != nil {
		return flightrec.Status{}, err
	}
	n := newNode(liveCgroups, windowSeed)
	for t := w.BaselineFrom; !t.After(w.To); t = t.Add(time.Second) {
		if err := s.Append(t, n.next(!t.Before(w.From))); err != nil {
			s.Close()
			return flightrec.Status{}, err
		}
	}
	st := s.Status()
	if err := s.Close(); err != nil {
		return st, err
	}
	// As the agent's: the node, the interval, its tracer's programs and the daemons it follows.
	meta := rundir.NewMeta(rundir.ScenarioAgent, rundir.ScenarioAgent, "/proc", true, time.Second, []string{"nodectl", "agent"})
	meta.Start = w.BaselineFrom
	meta.Tracer = map[string]string{}
	for _, p := range []string{rundir.ProgramRunq, rundir.ProgramFsync, rundir.ProgramBlkio, rundir.ProgramReclaim} {
		meta.Tracer[p] = rundir.TracerAttached
	}
	meta.Workloads = []rundir.Workload{{Name: "kubelet", Kind: rundir.KindDaemon, Cgroup: kubeletCgroup}}
	b, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		return st, err
	}
	return st, os.WriteFile(filepath.Join(dir, rundir.MetaFile), b, 0o600)
}

func countFindings(report []byte) (int, error) {
	var rep struct {
		Findings []json.RawMessage `json:"findings"`
	}
	if err := json.Unmarshal(report, &rep); err != nil {
		return 0, fmt.Errorf("reading the report: %w", err)
	}
	return len(rep.Findings), nil
}
