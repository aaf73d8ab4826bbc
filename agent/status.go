package agent

import (
	"bufio"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nodectl/nodectl/agent/flightrec"
)

// Drop stages: where an event or a sample was lost on its way (Status.Drops).
const (
	StageMapFull    = "kernel_map_full" // a BPF map was full (by program/reason)
	StageRingBuffer = "ring_buffer"     // a BPF ring buffer was full
	StageKernel     = "kernel"          // other kernel-side losses: an event whose start was unseen
	StageStore      = "store"           // intervals the flight recorder could not write
	StageWatch      = "watch"           // batches a slow API watcher missed
	StageIncidents  = "incidents"       // incidents not opened: too many open at once
)

// kernelStage is the stage of a BPF program's drop reason.
func kernelStage(reason string) string {
	switch {
	case strings.HasSuffix(reason, "_full"):
		return StageMapFull
	case strings.Contains(reason, "ring"):
		return StageRingBuffer
	}
	return StageKernel
}

// Status is what the agent says of itself.
type Status struct {
	Version  string
	Started  time.Time
	LastTick time.Time
	// Programs maps each BPF program to "attached" or why not; MapFill each to the fill of its
	// fullest map keyed by cgroup.
	Programs map[string]string
	MapFill  map[string]float64
	// Drops counts what was lost, by stage then by what (program/reason for the kernel).
	Drops           map[string]map[string]uint64
	TrackedCgroups  int
	OverflowCgroups int
	Store           flightrec.Status
	RSSBytes        uint64
	IncidentsOpen   int
	IncidentsTotal  int
	Daemons         map[string]string // cgroup → name
}

// Status reports the agent's state; watchDrops is what the API's watchers missed.
func (a *Agent) Status(watchDrops uint64) Status {
	a.mu.Lock()
	st := Status{Version: a.cfg.Version, Started: a.started, LastTick: a.lastTick, Daemons: maps.Clone(a.daemons),
		Drops: map[string]map[string]uint64{StageMapFull: {}, StageRingBuffer: {}, StageKernel: {}, StageStore: {}, StageWatch: {}, StageIncidents: {}}}
	for k, v := range a.drops {
		st.Drops[kernelStage(k.reason)][k.program+"/"+k.reason] = uint64(v)
	}
	a.mu.Unlock()
	st.Programs = a.sess.TracerStatus()
	st.MapFill = a.sess.MapFill()
	st.TrackedCgroups, st.OverflowCgroups = a.sess.Cgroups()
	st.Store = a.store.Status()
	st.Drops[StageStore]["intervals"] = uint64(st.Store.LostTicks)
	st.Drops[StageWatch]["batches"] = watchDrops
	var suppressed uint64
	st.IncidentsOpen, st.IncidentsTotal, suppressed = a.inc.counts()
	st.Drops[StageIncidents]["suppressed"] = suppressed
	st.RSSBytes = rss(a.cfg.Host.Procfs)
	return st
}

// rss is this process's resident set in bytes (VmRSS), 0 when unknown.
func rss(procfs string) uint64 {
	f, err := os.Open(filepath.Join(procfs, "self/status"))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
