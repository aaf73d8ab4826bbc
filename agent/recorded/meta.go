package recorded

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/nodectl/nodectl/analyzer"
	"github.com/nodectl/nodectl/rundir"
)

// MetaFile is the agent's meta in its data directory: its host, interval and followed
// workloads, as a run's meta.
const MetaFile = rundir.MetaFile

// ReadMeta reads the agent's meta from a data directory.
func ReadMeta(dataDir string) (rundir.Meta, error) {
	var m rundir.Meta
	b, err := os.ReadFile(filepath.Join(dataDir, MetaFile))
	if errors.Is(err, fs.ErrNotExist) {
		if _, serr := os.Stat(dataDir); serr != nil {
			return m, fmt.Errorf("reading the agent's data directory: %w", serr)
		}
		return m, fmt.Errorf("%s is not an agent's data directory: it has no %s, which the agent writes in its --data-dir when it starts", dataDir, MetaFile)
	}
	if err != nil {
		return m, fmt.Errorf("reading the agent's data directory: %w", err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("reading %s: %w", filepath.Join(dataDir, MetaFile), err)
	}
	return m, nil
}

// Bounded is w read as every analysis of the flight recorder reads it (the agent's incidents
// and post-mortems, and `analyze --data-dir`), from src, a recorder of that many series: each
// phase at as many ticks as keep the records within analysisRecords were every series read, and
// on a node of many cgroups only those in focus (see focus). An analysis then holds a bounded
// number of records whatever the window's length and the node's size. (Sizing the ticks by the
// focus's share of the series instead, 22 ticks a phase at 1,000 cgroups rather than 2, took an
// incident's analysis from 1.6 s of CPU and 36 MiB to 6.5 s and 55 MiB: BenchmarkIncidentAnalysis.)
func (w Window) Bounded(src Source, meta rundir.Meta, series int) (Window, error) {
	if series > 0 {
		w.Ticks = min(analysisTicks, max(2, analysisRecords/(2*series)))
	}
	keep, err := w.focus(src, meta)
	w.Cgroups = keep
	return w, err
}

// analysisRecords bounds the records an incident's analysis reads into the agent's memory
// (about 200 bytes each).
const analysisRecords = 150_000

// AnalyzeWindow reads a window from src into memory, once, and returns the analyzer's report.
// Read a recorder's window as Bounded says first, or its memory grows with the window and the
// node.
func AnalyzeWindow(src Source, meta rundir.Meta, w Window) (*analyzer.Report, error) {
	run, err := w.Run(src, meta)
	if err != nil {
		return nil, err
	}
	return analyzer.Analyze(run)
}
