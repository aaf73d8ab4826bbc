// Package browsertest opens a report in headless Chromium (Debian's chromium) for tests: it
// records every console error, uncaught exception, browser log error and network request the
// page makes, keeps screenshots in light and dark mode, and reads the charts' numbers back from
// the page as the browser laid it out.
package browsertest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// Page is what the browser made of a report.
type Page struct {
	// Problems are console errors and warnings, exceptions, log errors and requests.
	Problems []string
	// Bars are the bar charts' values as the DOM holds them, by chart/category/series.
	Bars map[string]float64
	// Flat are the bars with a value above zero that the browser drew with no height.
	Flat []string
	// Lines are the line charts' points (data-points) by chart/series.
	Lines map[string]string
	// Background is the page's background colour in light and in dark mode.
	Light, Dark string
	// PDF is the page printed (A4), kept beside the screenshots.
	PDF []byte
}

// chromium finds Debian's chromium (or another Chromium or Chrome on PATH).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no chromium on PATH: the report's rendering test needs Debian's chromium (make deps installs it: apt-get install chromium)")
	return ""
}

// Artifacts is where tests keep screenshots: $NODECTL_TEST_ARTIFACTS, or a directory under
// the temporary directory, which the test's log names.
func Artifacts(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("NODECTL_TEST_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "nodectl-test-artifacts")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// readBars is the script that reads every bar back: its chart, category, series, value, and
// the height the browser gave it.
const readBars = `Array.from(document.querySelectorAll('svg.chart rect[data-value]')).map(r =>
  [r.closest('svg').id + '/' + r.dataset.category + '/' + r.dataset.series, parseFloat(r.dataset.value), r.getBBox().height])`

// readLines reads every line chart's points back, by chart/series.
const readLines = `Object.fromEntries(Array.from(document.querySelectorAll('svg.chart polyline[data-points]')).map(p =>
  [p.closest('svg').id + '/' + p.dataset.series, p.dataset.points]))`

// Open loads the HTML file in headless Chromium, light then dark, and keeps a screenshot of
// each as <name>-light.png and <name>-dark.png in Artifacts, and the page printed as
// <name>.pdf.
func Open(t *testing.T, htmlFile, name string) Page {
	t.Helper()
	abs, err := filepath.Abs(htmlFile)
	if err != nil {
		t.Fatal(err)
	}
	url := "file://" + abs
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium(t)), chromedp.NoSandbox,
		chromedp.WindowSize(1280, 1000), chromedp.UserDataDir(t.TempDir()))
	alloc, cancelAlloc := chromedp.NewExecAllocator(t.Context(), opts...)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(alloc)
	defer cancel()
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	defer cancelTimeout()

	var mu sync.Mutex
	var page Page
	problem := func(format string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		page.Problems = append(page.Problems, fmt.Sprintf(format, a...))
	}
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	if err := chromedp.Listen(ctx, func(ev any) {
		switch e := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if e.Type == runtime.ConsoleAPICalledTypeError || e.Type == runtime.ConsoleAPICalledTypeWarning {
				var args []string
				for _, a := range e.Args {
					args = append(args, string(a.Value)+a.Description)
				}
				problem("console %s: %s", e.Type, strings.Join(args, " "))
			}
		case *runtime.EventExceptionThrown:
			problem("exception: %s", e.ExceptionDetails.Text)
		case *cdplog.EventEntryAdded:
			if e.Entry.Level == cdplog.EntryLevelError || e.Entry.Level == cdplog.EntryLevelWarning {
				problem("log %s (%s): %s %s", e.Entry.Level, e.Entry.Source, e.Entry.Text, e.Entry.URL)
			}
		case *network.EventRequestWillBeSent:
			if e.Request.URL != url {
				problem("request: %s", e.Request.URL)
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	for _, step := range []error{
		call(ctx, network.Enable, network.EnableParams{}),
		call(ctx, cdplog.Enable, cdp.Empty{}),
		call(ctx, runtime.Enable, cdp.Empty{}),
		chromedp.Do(ctx, chromedp.Navigate(url)),
	} {
		if step != nil {
			t.Fatalf("opening %s in chromium: %v", url, step)
		}
	}
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[[][]any](readBars))
	if err != nil {
		t.Fatalf("reading the bars back: %v", err)
	}
	page.Bars = map[string]float64{}
	for _, r := range rows {
		key, _ := r[0].(string)
		v, _ := r[1].(float64)
		h, _ := r[2].(float64)
		page.Bars[key] = v
		if v > 0 && h <= 0 {
			page.Flat = append(page.Flat, key)
		}
	}
	lines, err := chromedp.Run(ctx, chromedp.Evaluate[map[string]string](readLines))
	if err != nil {
		t.Fatalf("reading the lines back: %v", err)
	}
	page.Lines = lines
	dir := Artifacts(t)
	for _, mode := range []string{"light", "dark"} {
		if err := call(ctx, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
			Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: mode}}}); err != nil {
			t.Fatal(err)
		}
		bg, err := chromedp.Run(ctx, chromedp.Evaluate[string](`getComputedStyle(document.body).backgroundColor`))
		if err != nil {
			t.Fatal(err)
		}
		if mode == "light" {
			page.Light = bg
		} else {
			page.Dark = bg
		}
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot: %v", err)
		}
		shot := filepath.Join(dir, name+"-"+mode+".png")
		if err := os.WriteFile(shot, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot (%s mode): %s", mode, shot)
	}
	// Printed as a reader would: the print style sheet, A4.
	if page.PDF, err = chromedp.Run(ctx, chromedp.PrintToPDF(chromedp.PDFPaper(chromedp.PaperA4))); err != nil {
		t.Fatalf("printing: %v", err)
	}
	pdf := filepath.Join(dir, name+".pdf")
	if err := os.WriteFile(pdf, page.PDF, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("printed: %s", pdf)
	mu.Lock()
	defer mu.Unlock()
	return page
}

func call[P, R any](ctx context.Context, cmd cdp.Command[P, R], params P) error {
	_, err := chromedp.Call(ctx, cmd, params)
	return err
}
