package gate

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodectl/nodectl/analyzer"
	"github.com/nodectl/nodectl/stress"
)

func TestApply(t *testing.T) {
	rep := &analyzer.Report{Findings: []analyzer.Finding{
		{ID: "cpu-contention", Severity: analyzer.SeverityWarning, Victim: "v", Summary: "slow"},
		{ID: "swap-thrash", Severity: analyzer.SeverityInfo, Victim: "w"},
	}}
	for failOn, want := range map[string]bool{"none": false, "info": true, "warning": true, "critical": false} {
		g := Flags{FailOn: failOn}
		if err := g.Check(); err != nil {
			t.Fatal(err)
		}
		err := g.Apply(rep, "noisy")
		if got := errors.Is(err, ErrFindings); got != want {
			t.Errorf("--fail-on %s: %v, want ErrFindings %v", failOn, err, want)
		}
		if want && !strings.Contains(err.Error(), "cpu-contention (warning)") {
			t.Errorf("--fail-on %s: %q does not name the finding", failOn, err)
		}
	}
	// A clean run still shows in the JUnit file.
	junit := filepath.Join(t.TempDir(), "j.xml")
	g := Flags{FailOn: "warning", JUnit: junit}
	if err := g.Apply(&analyzer.Report{}, "wake"); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(junit)
	if !strings.Contains(string(b), `<testcase name="no findings" classname="nodectl.wake">`) || !strings.Contains(string(b), `failures="0"`) {
		t.Errorf("clean run's JUnit:\n%s", b)
	}
}

func TestCode(t *testing.T) {
	for _, c := range []struct {
		err  error
		want int
	}{
		{nil, 0},
		{errors.New("boom"), ExitError},
		{fmt.Errorf("x: %w", ErrFindings), ExitFindings},
		{fmt.Errorf("storm 1: %w", stress.ErrTimeout), ExitTimeout},
		{fmt.Errorf("waiting for pods: %w", context.DeadlineExceeded), ExitTimeout},
	} {
		if got := Code(c.err); got != c.want {
			t.Errorf("Code(%v) = %d, want %d", c.err, got, c.want)
		}
	}
}
