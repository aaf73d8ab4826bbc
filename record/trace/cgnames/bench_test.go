//go:build linux

package cgnames

import (
	"fmt"
	"path"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nodectl/nodectl/host/cgroup"
	"github.com/nodectl/nodectl/record/trace/internal/cgtest"
)

// BenchmarkNameNewCgroup makes a cgroup beside 1,000 others, names its id as the tracer's
// reader does, and removes it: named from the followed mkdir (CAP_DAC_READ_SEARCH dropped, as
// the agent runs), and by file handle (with it). The mkdir and rmdir are in both; the
// difference is the naming; walks counts the walks (the followed one's first). host/cgroup's
// BenchmarkResolverMiss gives a walk's cost, what a miss costs with neither. Run as root:
// CGO_ENABLED=0 go test -run '^$' -bench NameNewCgroup ./record/trace/cgnames.
func BenchmarkNameNewCgroup(b *testing.B) {
	cgtest.RequireRoot(b)
	names := make([]string, 1000)
	for i := range names {
		names[i] = fmt.Sprintf("c%04d", i)
	}
	others := cgtest.Make(b, cgroup.CPU, names...)
	parent := path.Dir(others["c0000"].Path)
	h := cgroup.Hierarchy{Root: cgtest.Mount(cgroup.CPU), Controller: cgroup.CPU, V2: !cgtest.V1()}
	tr, l := load(b)
	for _, followed := range []bool{true, false} {
		name := "handle"
		if followed {
			name = "followed"
		}
		b.Run(name, func(b *testing.B) {
			r := cgroup.NewResolver(l)
			if followed {
				// As the agent runs: no file handles, so the first miss walks once.
				withoutCapability(b, unix.CAP_DAC_READ_SEARCH)
				if err := r.Follow(tr.Feed); err != nil {
					b.Fatal(err)
				}
			}
			r.Path(cgroup.CPU, others["c0000"].ID) // the first walk, when followed
			p := parent + "/new"
			for b.Loop() {
				if err := h.Create(p); err != nil {
					b.Fatal(err)
				}
				var st syscall.Stat_t
				if err := syscall.Stat(h.Dir(p), &st); err != nil {
					b.Fatal(err)
				}
				if got, ok := r.Path(cgroup.CPU, st.Ino); !ok || got != p {
					b.Fatalf("Path = %q, %v; want %s", got, ok, p)
				}
				if err := h.Remove(p); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(r.Walks()), "walks")
		})
	}
}
