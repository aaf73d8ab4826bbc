package stress

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nodectl/nodectl/tuner"
	"github.com/nodectl/nodectl/tuner/backends"
)

// hostStateFile, in a run's state directory, is the tuner's state file of the node-wide settings
// the run changes (a swap area, sysctls): the tuner's engine records each one's value before it
// changes it, so the run's cleanup, or `stress clean` after a kill, rolls them back exactly.
const hostStateFile = "host-state.json"

// hostEngine is the tuner's engine over run id's node-wide settings.
func hostEngine(p Paths, id string, settings []tuner.Setting, log *slog.Logger) *tuner.Engine {
	return &tuner.Engine{Profile: "stress run " + id, Settings: settings, State: filepath.Join(p.State, id, hostStateFile),
		Decode: backends.Decoder(p.FS), Log: log, RollbackCommand: "nodectl stress clean " + id}
}

// rollbackHost restores what run id's host state file records, if it has one, and names the
// settings it restored with their earlier values.
func rollbackHost(p Paths, id string, log *slog.Logger) (string, error) {
	e := hostEngine(p, id, nil, log)
	st, err := tuner.LoadState(e.State)
	if err != nil || st == nil {
		return "", err
	}
	res, err := e.Rollback(context.Background())
	var what []string
	for _, r := range st.Settings {
		if res != nil && slices.Contains(res.Restored, r.ID) {
			what = append(what, fmt.Sprintf("%s (was %s)", r.ID, r.Previous.Text))
		}
	}
	return strings.Join(what, ", "), err
}
