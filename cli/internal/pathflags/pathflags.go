// Package pathflags registers where a command finds the host's filesystems and keeps a run's
// files, as flags.
package pathflags

import (
	"github.com/spf13/pflag"

	"github.com/nodectl/nodectl/host"
	"github.com/nodectl/nodectl/stress"
)

// HostPathFlags registers the host locations as flags, so the same binary works on /host in a
// DaemonSet or on a scratch tree.
func HostPathFlags(f *pflag.FlagSet, p *host.FS) {
	f.StringVar(&p.Cgroupfs, "cgroupfs", p.Cgroupfs, "cgroup filesystem root of the host")
	f.StringVar(&p.Procfs, "procfs", p.Procfs, "procfs of the host")
	f.StringVar(&p.Sysfs, "sysfs", p.Sysfs, "sysfs of the host")
	f.StringVar(&p.Tracefs, "tracefs", p.Tracefs, "tracefs of the host; mounted there for the run if missing")
}

// RunPathFlags registers where stress runs keep their scratch files and live state.
func RunPathFlags(f *pflag.FlagSet, p *stress.Paths) {
	f.StringVar(&p.Scratch, "scratch-dir", p.Scratch, "parent of each run's scratch directory, where the victim and disk hogs write")
	f.StringVar(&p.State, "state-dir", p.State, "parent of each live run's state (owner pid)")
}
