package workload

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/pflag"

	"github.com/nodectl/nodectl/rundir"
)

// Group is the hidden command group every workload runs under: `nodectl workload <name> ...`.
const Group = "workload"

// Install is the workload subcommand that copies nodectl into a directory: an init container of
// the agent's image runs it so that a pod of another image can run nodectl from there.
const Install = "install"

// InstallArgs is the command line after the binary that copies nodectl into dir, as dir/nodectl.
func InstallArgs(dir string) []string { return []string{Group, Install, dir} }

// runFlag names the run a workload belongs to. The bodies do not use it; it makes each process
// of a run recognisable in ps.
const runFlag = "run"

// Config is one workload's settings: its name and flags are its command line, the contract
// between the stress driver, which writes it (Command.Args), and the workload's process, which
// reads it (Parse). Only this package's *XxxConfig types are Configs.
type Config interface {
	// Name is the workload's subcommand.
	Name() string
	// flags binds each setting to its flag, with the setting's current value as default.
	flags(fs *pflag.FlagSet)
}

// Command is the command line of one workload process of a run.
type Command struct {
	Run    string // id of the run the workload belongs to
	Config Config
}

// Args is the command line after the binary: `workload <name> --<flag> <value>... --run <id>`.
// Every setting is written, so the process runs exactly c.Config whatever its defaults.
func (c Command) Args() []string {
	args := []string{Group, c.Config.Name()}
	c.flagSet().VisitAll(func(f *pflag.Flag) {
		if f.Value.Type() == "bool" {
			// A boolean takes its value only after "=".
			args = append(args, "--"+f.Name+"="+f.Value.String())
			return
		}
		args = append(args, "--"+f.Name, f.Value.String())
	})
	return args
}

// Parse reads a workload's command line as Args writes it; settings left out keep their
// defaults. For -h or --help it prints the flags on standard error and returns pflag.ErrHelp.
func Parse(args []string) (Command, error) {
	if len(args) < 2 || args[0] != Group {
		return Command{}, fmt.Errorf("not a workload command line: %q", args)
	}
	c := Command{}
	for _, d := range defaults() {
		if d.Name() == args[1] {
			c.Config = d
		}
	}
	if c.Config == nil {
		return Command{}, fmt.Errorf("unknown workload %q", args[1])
	}
	fs := c.flagSet()
	if err := fs.Parse(args[2:]); err != nil {
		return Command{}, fmt.Errorf("workload %s: %w", args[1], err)
	}
	if fs.NArg() > 0 {
		return Command{}, fmt.Errorf("workload %s: unexpected argument %q", args[1], fs.Arg(0))
	}
	return c, nil
}

// flagSet holds c's flags, bound to its fields, in the order they are declared. Binding sets
// each field to its own value: Args changes nothing.
func (c *Command) flagSet() *pflag.FlagSet {
	fs := pflag.NewFlagSet(c.Config.Name(), pflag.ContinueOnError)
	fs.SortFlags = false
	c.Config.flags(fs)
	fs.StringVar(&c.Run, runFlag, c.Run, "id of the run this workload belongs to")
	return fs
}

// defaults are every workload's settings when its command line leaves them out.
func defaults() []Config {
	return []Config{
		&VictimConfig{Dir: os.TempDir(), Interval: time.Second, WorkRounds: DefaultWorkRounds, WriteBytes: DefaultWriteBytes},
		&HeartbeatConfig{Period: time.Second},
		&CPUHogConfig{Threads: 1},
		&DiskHogConfig{Dir: os.TempDir(), FileBytes: DefaultDiskHogFileBytes},
		&FsyncHogConfig{Dir: os.TempDir(), BlockBytes: DefaultFsyncHogBlockBytes},
		&MemoryHogConfig{Bytes: 256 << 20},
		&ChurnConfig{Parallel: 2},
		&WakeConfig{BootRounds: DefaultBootRounds},
		new(DefaultSandboxConfig()),
		&FsyncWriterConfig{Dir: os.TempDir(), Bytes: 128 << 20},
	}
}

func (*VictimConfig) Name() string { return rundir.KindVictim }

func (c *VictimConfig) flags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Dir, "dir", c.Dir, "directory to write the probe file in")
	fs.DurationVar(&c.Interval, "interval", c.Interval, "one iteration per interval")
	fs.IntVar(&c.WorkRounds, "work-rounds", c.WorkRounds, "size of the fixed CPU work")
	fs.Int64Var(&c.WriteBytes, "write-bytes", c.WriteBytes, "bytes written and fsynced per iteration")
}

// HeartbeatConfig configures a heartbeat.
type HeartbeatConfig struct {
	Period time.Duration // time between heartbeats
}

func (*HeartbeatConfig) Name() string { return rundir.KindHeartbeat }

func (c *HeartbeatConfig) flags(fs *pflag.FlagSet) {
	fs.DurationVar(&c.Period, "period", c.Period, "time between heartbeats")
}

// CPUHogConfig configures a CPU hog.
type CPUHogConfig struct {
	Threads int // busy threads
}

func (*CPUHogConfig) Name() string { return "cpu-hog" }

func (c *CPUHogConfig) flags(fs *pflag.FlagSet) {
	fs.IntVar(&c.Threads, "threads", c.Threads, "busy threads")
}

func (*DiskHogConfig) Name() string { return "disk-hog" }

func (c *DiskHogConfig) flags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Dir, "dir", c.Dir, "directory to write in")
	fs.Int64Var(&c.FileBytes, "file-bytes", c.FileBytes, "bytes per file before its fsync")
}

// FsyncHogConfig configures an fsync hog.
type FsyncHogConfig struct {
	Dir        string // where the hog's file goes
	BlockBytes int    // written before each fsync
}

// DefaultFsyncHogBlockBytes is one page per fsync: the most syncs for the bytes.
const DefaultFsyncHogBlockBytes = 4096

func (*FsyncHogConfig) Name() string { return "fsync-hog" }

func (c *FsyncHogConfig) flags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Dir, "dir", c.Dir, "directory to write in")
	fs.IntVar(&c.BlockBytes, "block-bytes", c.BlockBytes, "bytes written before each fsync")
}

// MemoryHogConfig configures a memory hog.
type MemoryHogConfig struct {
	Bytes int64 // allocated and kept touched
}

func (*MemoryHogConfig) Name() string { return "memory-hog" }

func (c *MemoryHogConfig) flags(fs *pflag.FlagSet) {
	fs.Int64Var(&c.Bytes, "bytes", c.Bytes, "bytes to allocate and keep touching")
}

// ChurnConfig configures a process churn.
type ChurnConfig struct {
	Parallel int // processes running at a time
}

func (*ChurnConfig) Name() string { return rundir.KindChurn }

func (c *ChurnConfig) flags(fs *pflag.FlagSet) {
	fs.IntVar(&c.Parallel, "parallel", c.Parallel, "processes running at a time")
}

// WakeConfig configures a woken sandbox.
type WakeConfig struct {
	BootRounds int // CPU work of the boot, before the answer
	// Pending: the request is pending already and none is read (a pod's standard input, which
	// no one writes).
	Pending bool
}

func (*WakeConfig) Name() string { return rundir.KindWake }

func (c *WakeConfig) flags(fs *pflag.FlagSet) {
	fs.IntVar(&c.BootRounds, "boot-work", c.BootRounds, "rounds of CPU work the boot does before answering")
	fs.BoolVar(&c.Pending, "request-pending", c.Pending, "answer the request as pending from the start instead of reading it from standard input")
}

// DefaultSandboxConfig is a sandbox of the default size and activity, with no binary.
func DefaultSandboxConfig() SandboxConfig {
	return SandboxConfig{HeapBytes: DefaultSandboxHeap, HotShare: DefaultSandboxHotShare, BinaryShare: DefaultSandboxBinaryShare,
		Activity: DefaultSandboxActivity, BurstRounds: DefaultSandboxBurstRounds, Tick: DefaultSandboxTick}
}

func (*SandboxConfig) Name() string { return rundir.KindSandbox }

func (c *SandboxConfig) flags(fs *pflag.FlagSet) {
	fs.Int64Var(&c.HeapBytes, "memory", c.HeapBytes, "bytes of anonymous heap to allocate and hold") //rundir:other: a flag
	fs.Float64Var(&c.HotShare, "hot-share", c.HotShare, "share of the heap each activity burst touches")
	fs.StringVar(&c.Binary, "binary", c.Binary, "shared file to map and read as the sandbox's binary; none if empty")
	fs.Float64Var(&c.BinaryShare, "binary-share", c.BinaryShare, "share of the binary each burst reads")
	fs.DurationVar(&c.Activity, "activity", c.Activity, "time between activity bursts")
	fs.IntVar(&c.BurstRounds, "burst-work", c.BurstRounds, "rounds of CPU work per burst")
	fs.DurationVar(&c.Tick, "tick", c.Tick, "event-loop tick whose lateness is recorded")
}

func (*FsyncWriterConfig) Name() string { return rundir.KindStormWriter }

func (c *FsyncWriterConfig) flags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Dir, "dir", c.Dir, "directory to write the file in")
	fs.Int64Var(&c.Bytes, "bytes", c.Bytes, "bytes written, then fsynced, per storm")
}
