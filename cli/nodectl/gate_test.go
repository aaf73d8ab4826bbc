package main

import (
	"encoding/json"
	"encoding/xml"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodectl/nodectl/analyzer"
)

// checkGate holds `analyze` of a run with findings to the CI gates: exit 3 when a finding
// reaches --fail-on, 0 below it, and a JUnit file with one test case per finding, failed at or
// above --fail-on.
func checkGate(t *testing.T, run string) {
	t.Helper()
	out, err := nodectl(t, "analyze", run, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var rep analyzer.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	worst := rep.Worst()
	if worst == "" {
		t.Fatalf("the run gave no finding to gate on")
	}
	exit := func(err error) int {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	}
	junit := filepath.Join(t.TempDir(), "findings.xml")
	if _, err := nodectl(t, "analyze", run, "--fail-on", worst, "--junit", junit); exit(err) != 3 {
		t.Errorf("--fail-on %s with a %s finding: exit %d, want 3", worst, worst, exit(err))
	}
	var suites struct {
		Suites []struct {
			Tests    int `xml:"tests,attr"`
			Failures int `xml:"failures,attr"`
			Cases    []struct {
				Name    string `xml:"name,attr"`
				Failure *struct {
					Type string `xml:"type,attr"`
				} `xml:"failure"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	b, err := os.ReadFile(junit)
	if err != nil {
		t.Fatal(err)
	}
	if err := xml.Unmarshal(b, &suites); err != nil || len(suites.Suites) != 1 {
		t.Fatalf("junit: %v\n%s", err, b)
	}
	s := suites.Suites[0]
	if s.Tests != len(rep.Findings) || s.Failures == 0 || len(s.Cases) != len(rep.Findings) {
		t.Errorf("junit suite: %d tests, %d failures, want %d tests with a failure\n%s", s.Tests, s.Failures, len(rep.Findings), b)
	}
	for i, c := range s.Cases {
		f := rep.Findings[i]
		if !strings.HasPrefix(c.Name, f.ID+": ") || (c.Failure != nil) != (analyzer.SeverityRank(f.Severity) >= analyzer.SeverityRank(worst)) {
			t.Errorf("junit case %q (failure %v) for finding %s %s", c.Name, c.Failure, f.ID, f.Severity)
		}
	}
	if worst != analyzer.SeverityCritical {
		if _, err := nodectl(t, "analyze", run, "--fail-on", analyzer.SeverityCritical); exit(err) != 0 {
			t.Errorf("--fail-on critical with findings no worse than %s: exit %d, want 0", worst, exit(err))
		}
	}
	if _, err := nodectl(t, "analyze", run); exit(err) != 0 {
		t.Errorf("no --fail-on: exit %d, want 0", exit(err))
	}
}
