// Package gate turns a report into what a CI system acts on: the exit code (3 when a finding
// reaches --fail-on) and a JUnit XML file (--junit), one test case per finding.
package gate

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"

	"github.com/nodectl/nodectl/analyzer"
	"github.com/nodectl/nodectl/stress"
)

// Exit codes of nodectl (README, "Exit codes"): 0 ok, 1 an error, 2 a timeout, 3 a finding at or above
// --fail-on.
const (
	ExitError    = 1
	ExitTimeout  = 2
	ExitFindings = 3
)

// ErrFindings is returned when a finding reaches --fail-on.
var ErrFindings = errors.New("findings at or above --fail-on")

// Flags are --fail-on and --junit.
type Flags struct {
	FailOn string
	JUnit  string
}

// Register adds the flags.
func (g *Flags) Register(fs *pflag.FlagSet) {
	fs.StringVar(&g.FailOn, "fail-on", "none", "exit 3 when a finding is at least this severe: info, warning, critical, or none")
	fs.StringVar(&g.JUnit, "junit", "", "also write the findings as a JUnit XML file (one test case per finding, failed at or above --fail-on) for CI systems")
}

// Check validates the flags, before a run starts.
func (g *Flags) Check() error {
	if g.FailOn != "none" && analyzer.SeverityRank(g.FailOn) == 0 {
		return fmt.Errorf("--fail-on %q: allowed are info, warning, critical, none", g.FailOn)
	}
	if g.JUnit != "" {
		if fi, err := os.Stat(filepath.Dir(g.JUnit)); err != nil || !fi.IsDir() {
			return fmt.Errorf("--junit %s: its directory does not exist", g.JUnit)
		}
	}
	return nil
}

// failing says whether f reaches --fail-on.
func (g *Flags) failing(f analyzer.Finding) bool {
	return g.FailOn != "none" && analyzer.SeverityRank(f.Severity) >= analyzer.SeverityRank(g.FailOn)
}

// Apply writes the JUnit file when asked, and returns ErrFindings (with the findings' ids)
// when a finding reaches --fail-on. suite names the test suite (the scenario or command).
func (g *Flags) Apply(rep *analyzer.Report, suite string) error {
	var failed []string
	for _, f := range rep.Findings {
		if g.failing(f) {
			failed = append(failed, f.ID+" ("+f.Severity+")")
		}
	}
	if g.JUnit != "" {
		if err := g.writeJUnit(rep, suite); err != nil {
			return err
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%w (%s): %s", ErrFindings, g.FailOn, strings.Join(failed, ", "))
	}
	return nil
}

type junitSuites struct {
	XMLName xml.Name     `xml:"testsuites"`
	Suites  []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Cases    []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	ClassName string        `xml:"classname,attr"`
	Failure   *junitFailure `xml:"failure,omitempty"`
	SystemOut string        `xml:"system-out,omitempty"`
}

type junitFailure struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr"`
	Text    string `xml:",chardata"`
}

// writeJUnit writes one test case per finding, and one named "no findings" for a clean run, so
// that a CI system always shows the run.
func (g *Flags) writeJUnit(rep *analyzer.Report, suite string) error {
	s := junitSuite{Name: "nodectl " + suite}
	for _, f := range rep.Findings {
		c := junitCase{Name: f.ID + ": " + f.Victim, ClassName: "nodectl." + suite, SystemOut: evidenceText(f)}
		if g.failing(f) {
			c.Failure = &junitFailure{Message: f.Summary, Type: f.Severity, Text: evidenceText(f)}
			s.Failures++
		}
		s.Cases = append(s.Cases, c)
	}
	if len(s.Cases) == 0 {
		s.Cases = append(s.Cases, junitCase{Name: "no findings", ClassName: "nodectl." + suite})
	}
	s.Tests = len(s.Cases)
	b, err := xml.MarshalIndent(junitSuites{Suites: []junitSuite{s}}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(g.JUnit, append([]byte(xml.Header), append(b, '\n')...), 0o644); err != nil {
		return fmt.Errorf("--junit: %w", err)
	}
	return nil
}

// evidenceText is a finding's summary, culprits and evidence as lines.
func evidenceText(f analyzer.Finding) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[%s] %s\n", f.Severity, f.Summary)
	if len(f.Culprits) > 0 {
		fmt.Fprintf(&b, "culprits: %s\n", strings.Join(f.Culprits, ", "))
	}
	for _, e := range f.Evidence {
		fmt.Fprintf(&b, "%s %s", e.Metric, e.Workload)
		if e.Culprit != "" {
			fmt.Fprintf(&b, " behind %s", e.Culprit)
		}
		fmt.Fprintf(&b, ": %g %s (baseline %g)\n", e.Value, e.Unit, e.Baseline)
	}
	return b.String()
}

// Code is the exit code for err: 0, ExitFindings, ExitTimeout, or ExitError.
func Code(err error) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, ErrFindings):
		return ExitFindings
	case errors.Is(err, stress.ErrTimeout) || errors.Is(err, context.DeadlineExceeded):
		return ExitTimeout
	}
	return ExitError
}
