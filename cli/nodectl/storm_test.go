package main

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/nodectl/nodectl/rundir"
)

// stormReport is what `stress fsync-storm -o json` prints.
type stormReport struct {
	report
	Writers []struct {
		Name           string    `json:"name"`
		DurableSeconds []float64 `json:"durable_seconds"`
		WriteSeconds   []float64 `json:"write_seconds"`
		FsyncSeconds   []float64 `json:"fsync_seconds"`
		Bytes          float64   `json:"bytes"`
	} `json:"writers"`
	Rounds []struct {
		Name        string  `json:"name"`
		Writers     int     `json:"writers"`
		DurableP50  float64 `json:"durable_p50_seconds"`
		DurableMax  float64 `json:"durable_max_seconds"`
		Slowest     string  `json:"slowest"`
		StartSkew   float64 `json:"start_skew_seconds"`
		Device      string  `json:"device"`
		QueueMean   float64 `json:"blk_queue_mean_seconds"`
		QueueP95    float64 `json:"blk_queue_p95_seconds"`
		ServiceMean float64 `json:"blk_service_mean_seconds"`
		DeviceBytes float64 `json:"device_bytes"`
		HeldBy      []struct {
			Workload string  `json:"workload"`
			Bytes    float64 `json:"bytes"`
		} `json:"held_by"`
		DirtyPeak   float64 `json:"dirty_peak_bytes"`
		Explanation string  `json:"explanation"`
	} `json:"rounds"`
}

func TestFsyncStormRecordsEveryWriterAndExplainsTheTail(t *testing.T) {
	requireRoot(t)
	const size, writers, rounds = 64 << 20, 4, 2
	dir := filepath.Join(t.TempDir(), "run")
	out, err := nodectl(t, "stress", "fsync-storm", "--writers", "4", "--size", "64Mi", "--rounds", "2", "--pause", "1s", "--trace", "--out", dir, "-o", "json")
	if err != nil {
		t.Fatalf("stress fsync-storm: %v", err)
	}
	run, err := rundir.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	assertClean(t, run.Meta.ID)

	var doc map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("stress fsync-storm -o json printed no report: %v\n%s", err, out)
	}
	if got := slices.Sorted(maps.Keys(doc)); !reflect.DeepEqual(got, []string{"findings", "rounds", "writers"}) {
		t.Errorf("stress fsync-storm -o json has keys %v, want findings, rounds and writers", got)
	}
	var rep stormReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Writers) != writers || len(rep.Rounds) != rounds {
		t.Fatalf("%d writers and %d rounds, want %d and %d", len(rep.Writers), len(rep.Rounds), writers, rounds)
	}
	// Every writer's time to durable, for every storm, is the sum of its writes and its fsync.
	for _, w := range rep.Writers {
		if len(w.DurableSeconds) != rounds || len(w.WriteSeconds) != rounds || len(w.FsyncSeconds) != rounds {
			t.Errorf("%s: durable %v, write %v, fsync %v; want one per storm", w.Name, w.DurableSeconds, w.WriteSeconds, w.FsyncSeconds)
			continue
		}
		for i, d := range w.DurableSeconds {
			if d <= 0 || d < w.WriteSeconds[i] || d < w.FsyncSeconds[i] || (w.WriteSeconds[i]+w.FsyncSeconds[i])/d < 0.99 {
				t.Errorf("%s storm %d: durable %.4fs, write %.4fs, fsync %.4fs", w.Name, i+1, d, w.WriteSeconds[i], w.FsyncSeconds[i])
			}
		}
		// fsync writes back in the writer's own context, so the block tracer charges its cgroup.
		if w.Bytes < 0.5*rounds*size {
			t.Errorf("%s: %.0f bytes on the device charged to it, want at least half of the %d it wrote", w.Name, w.Bytes, rounds*size)
		}
	}
	for _, rd := range rep.Rounds {
		t.Logf("%s: durable p50 %.3fs max %.3fs (%s), start skew %.4fs, queue mean %.5fs p95 %.5fs, service mean %.5fs, dirty peak %.0f MiB",
			rd.Name, rd.DurableP50, rd.DurableMax, rd.Slowest, rd.StartSkew, rd.QueueMean, rd.QueueP95, rd.ServiceMean, rd.DirtyPeak/(1<<20))
		if rd.Writers != writers || rd.Slowest == "" || rd.DurableMax < rd.DurableP50 {
			t.Errorf("%s: %d writers, slowest %q", rd.Name, rd.Writers, rd.Slowest)
		}
		// Released at once: the writers' first writes lie within a small part of a storm.
		if rd.StartSkew > 0.5*rd.DurableP50 {
			t.Errorf("%s: writers started %.3fs apart, against a durable p50 of %.3fs", rd.Name, rd.StartSkew, rd.DurableP50)
		}
		// The tail explained: queue against service time on the device, who held it, writeback.
		if rd.QueueMean <= 0 || rd.ServiceMean <= 0 || len(rd.HeldBy) == 0 || rd.DeviceBytes < writers*size || rd.DirtyPeak <= 0 {
			t.Errorf("%s: queue mean %v, service mean %v, held by %v, device bytes %.0f, dirty peak %.0f: the tail is not explained",
				rd.Name, rd.QueueMean, rd.ServiceMean, rd.HeldBy, rd.DeviceBytes, rd.DirtyPeak)
		}
		for _, want := range []string{"queued", rd.Device, "Dirty memory peaked"} {
			if !strings.Contains(rd.Explanation, want) {
				t.Errorf("%s: explanation %q does not say %q", rd.Name, rd.Explanation, want)
			}
		}
	}
	for _, f := range rep.Findings {
		if f.ID != "disk-contention" || !strings.HasPrefix(f.Victim, "fsync-writer-") {
			t.Errorf("unexpected finding %s of %s: %s", f.ID, f.Victim, f.Summary)
		}
	}

	// The run directory stays, and analyze reads it the same way.
	out, err = nodectl(t, "analyze", dir, "-o", "json")
	if err != nil {
		t.Fatalf("analyze: %v", err)
	}
	var again struct {
		report
		Storm struct {
			Writers []json.RawMessage `json:"writers"`
		} `json:"storm"`
	}
	if err := json.Unmarshal([]byte(out), &again); err != nil {
		t.Fatal(err)
	}
	if len(again.Storm.Writers) != writers || again.Run["scenario"] != "fsync-storm" || !reflect.DeepEqual(again.ids(), rep.ids()) {
		t.Errorf("analyze: %d writers, scenario %q, findings %v; stress fsync-storm found %v", len(again.Storm.Writers), again.Run["scenario"], again.ids(), rep.ids())
	}
}

func TestFsyncStormInterruptedLeavesNothing(t *testing.T) {
	requireRoot(t)
	dir := filepath.Join(t.TempDir(), "run")
	target := t.TempDir()
	// The signal comes in the long pause after the first storm, the writers ready for the next.
	interruptAt(t, dir, "the end of the first storm", func(r rundir.Record) bool {
		return r.Type == rundir.TypePhase && r.Name == "round-1" && r.Event == rundir.EventEnd
	}, "stress", "fsync-storm", "--writers", "2", "--size", "8Mi", "--rounds", "2", "--pause", "30s", "--target", target)
	if ents, _ := os.ReadDir(target); len(ents) != 0 {
		t.Errorf("--target %s keeps %v", target, ents)
	}
	out, err := nodectl(t, "analyze", dir, "-o", "json")
	if err != nil {
		t.Fatalf("analyze of the interrupted run: %v", err)
	}
	if !strings.Contains(out, `"round-1"`) {
		t.Errorf("analyze of the interrupted run lacks its first storm:\n%s", out)
	}
}

func TestFsyncStormCLIErrorsNameTheFlag(t *testing.T) {
	expectCLIErrors(t, []string{"stress", "fsync-storm"}, map[string]cliError{
		"zero_writers":      {[]string{"--writers", "0"}, "--writers 0: want an integer from 1 to 256"},
		"many_writers":      {[]string{"--writers", "1000"}, "--writers 1000: want an integer from 1 to 256"},
		"bad_size":          {[]string{"--size", "lots"}, `--size: `},
		"small_size":        {[]string{"--size", "4Ki"}, `--size: bad size "4Ki": must be a whole number of bytes, at least 1Mi`},
		"too_much":          {[]string{"--writers", "64", "--size", "1Gi"}, "--writers 64 × --size 1Gi is more than 16Gi"},
		"zero_rounds":       {[]string{"--rounds", "0"}, "--rounds 0: want an integer from 1 to 100"},
		"negative_pause":    {[]string{"--pause", "-1s"}, "--pause -1s: must not be negative"},
		"missing_target":    {[]string{"--target", "/nonexistent/nodectl-storm"}, "--target /nonexistent/nodectl-storm: not an existing directory"},
		"bad_runtime":       {[]string{"--runtime", "docker"}, `--runtime: unknown runtime "docker": allowed are process, runc, runsc`},
		"platform_no_runsc": {[]string{"--runsc-platform", "ptrace"}, "--runsc-platform ptrace: only for --runtime runsc, not process"},
		"short_timeout":     {[]string{"--timeout", "10ms"}, "--timeout 10ms: must be at least 1s"},
		"bad_output":        {[]string{"-o", "yaml"}, `-o "yaml": allowed values are text and json`},
	})
}
