// Package console is how commands print: the -o formats, a report rendered in one, the
// logger, and whether progress lines may be rewritten in place.
package console

import (
	"fmt"
	"io"
	"log/slog"
	"os"

	"golang.org/x/term"

	"github.com/nodectl/nodectl/analyzer"
	"github.com/nodectl/nodectl/report"
)

// CheckOutput validates an -o value.
func CheckOutput(o string) error {
	if o != "text" && o != "json" {
		return fmt.Errorf("-o %q: allowed values are text and json", o)
	}
	return nil
}

// IsTerminal reports whether f is a terminal (live progress lines are rewritten in place).
func IsTerminal(f *os.File) bool { return term.IsTerminal(int(f.Fd())) }

// Logger is the CLI's logger: text on stderr, debug with --verbose.
func Logger(w io.Writer, verbose bool) *slog.Logger {
	lvl := slog.LevelWarn
	if verbose {
		lvl = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: lvl}))
}

// Render prints a report in the chosen format.
func Render(w io.Writer, rep *analyzer.Report, output string) error {
	if output == "json" {
		return report.JSON(w, rep)
	}
	return report.Text(w, rep)
}
