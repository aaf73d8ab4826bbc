// Package journald is the tuner's journald backends: a journald.conf drop-in (limits such as
// SystemMaxUse and RateLimitBurst) and the journal's storage moved to another directory by a
// bind mount. Both restart journald where systemd runs, so it reads the change; where it does
// not, they say so and leave the restart to journald's next start. Both report the restart
// pending until a journald has started since the change.
package journald

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nodectl/nodectl/host"

	"github.com/nodectl/nodectl/host/daemons"
)

// Daemon is what both settings restart, as tuner.Restarter names it.
const Daemon = "systemd-journald"

// restartFunc restarts journald on a host; settings hold one so that tests can stand in for
// systemctl.
type restartFunc func(ctx context.Context, h host.FS) error

// restartCommand is the command that restarts journald on h: the node's own systemctl, run
// chrooted into h's root when that is not this process's (a tuner pod's /host), so that it
// talks to the node's systemd. The chroot is the kernel's (SysProcAttr), not a chroot
// binary, which nodectl's image does not have.
func restartCommand(ctx context.Context, h host.FS) *exec.Cmd {
	args := []string{"systemctl", "restart", Daemon}
	root := filepath.Clean(h.Root)
	if root == "/" || h.Root == "" {
		return exec.CommandContext(ctx, args[0], args[1:]...)
	}
	path := "/usr/bin/systemctl"
	for _, p := range []string{"/usr/bin/systemctl", "/bin/systemctl", "/usr/sbin/systemctl"} {
		if _, err := os.Stat(filepath.Join(root, p)); err == nil {
			path = p
			break
		}
	}
	c := exec.CommandContext(ctx, path, args[1:]...)
	c.Dir = "/"
	c.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
	return c
}

// systemctl restarts journald on h; the caller checks that systemd runs there.
func systemctl(ctx context.Context, h host.FS) error {
	c := restartCommand(ctx, h)
	out, err := c.CombinedOutput()
	if err != nil {
		where := ""
		if c.SysProcAttr != nil {
			where = " in " + c.SysProcAttr.Chroot
		}
		return fmt.Errorf("restarting journald (%s%s): %v: %s", strings.Join(c.Args, " "), where, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// needRestart decides whether Apply or Restore restarts journald: only where systemd runs,
// and there when this call changed the setting or, when it did not, when no journald has
// started since the setting last changed (pending), because the restart after that change
// failed or nodectl died before it: so a re-apply or a second rollback finishes it. pending
// is asked only then.
func needRestart(systemd, changed bool, pending func() (bool, error)) (bool, error) {
	if !systemd {
		return false, nil
	}
	if changed {
		return true, nil
	}
	return pending()
}

// settle restarts journald on h when needRestart says so.
func settle(ctx context.Context, h host.FS, changed bool, pending func(context.Context) (bool, error), restart restartFunc) error {
	need, err := needRestart(h.Systemd(), changed, func() (bool, error) { return pending(ctx) })
	if err != nil || !need {
		return err
	}
	return restart(ctx, h)
}

// pendingSince reports whether no journald of h's started after changed: none runs, or the
// one running is older. journald's comm is its name cut to 15 bytes, systemd-journal.
func pendingSince(h host.FS, changed time.Time) (bool, error) {
	procs, err := daemons.Procs(h.Procfs, Daemon)
	if err != nil {
		return false, fmt.Errorf("finding journald in %s: %w", h.Procfs, err)
	}
	return daemons.Pending(procs, changed), nil
}

// note says that journald is not restarted when systemd does not run; what applies then is
// the setting's own words.
func note(h host.FS, then string) string {
	if h.Systemd() {
		return ""
	}
	return fmt.Sprintf("systemd is not running under %s: journald is not restarted; %s", h.Root, then)
}
