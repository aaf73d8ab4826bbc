// Package journald is the tuner's journald backends: a journald.conf drop-in (limits such as
// SystemMaxUse and RateLimitBurst) and the journal's storage moved to another directory by a
// bind mount. Both restart journald where systemd runs, so it reads the change; where it does
// not, they say so and leave the restart to journald's next start.
package journald

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/nodectl/nodectl/tuner"
)

// restartArgs is the command that restarts journald on h: systemctl, run through chroot when
// h's root is not this process's, so the node's own systemctl talks to the node's systemd.
func restartArgs(h tuner.Host) []string {
	args := []string{"systemctl", "restart", "systemd-journald"}
	if root := filepath.Clean(h.Root); root != "/" && h.Root != "" {
		return append([]string{"chroot", root}, args...)
	}
	return args
}

// restart restarts journald when systemd is h's init, and does nothing otherwise (note says
// so).
func restart(ctx context.Context, h tuner.Host) error {
	if !h.Systemd() {
		return nil
	}
	args := restartArgs(h)
	out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("restarting journald (%s): %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// note says that journald is not restarted when systemd does not run; what applies then is
// the setting's own words.
func note(h tuner.Host, then string) string {
	if h.Systemd() {
		return ""
	}
	return fmt.Sprintf("systemd is not running under %s: journald is not restarted; %s", h.Root, then)
}
