package workload

import (
	"context"
	"os"

	"github.com/spf13/cobra"

	wl "github.com/nodectl/nodectl/stress/workload"
)

func fsyncWriter() *cobra.Command {
	cfg := wl.FsyncWriterConfig{}
	cmd := &cobra.Command{
		Use:   "fsync-writer",
		Short: "One writer of an fsync storm: for each go line on standard input, write a file, fsync it, report the time to durable",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			e := wl.NewEmitter(os.Stdout)
			return run(func(ctx context.Context) error { return wl.FsyncWriter(ctx, cfg, os.Stdin, e) })
		},
	}
	cmd.Flags().StringVar(&cfg.Dir, "dir", os.TempDir(), "directory to write the file in")
	cmd.Flags().Int64Var(&cfg.Bytes, "bytes", 128<<20, "bytes written, then fsynced, per storm")
	return cmd
}
