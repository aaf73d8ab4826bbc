// Package chart draws the report's charts as inline SVG: line charts of time series (with the
// run's phases as bands and marks such as a density collapse) and bar charts (grouped or
// stacked). It is small and ours rather than a plotting library's because the report needs
// three things those do not give together: colours from CSS variables, so one chart reads in
// light and dark mode and in print; the numbers drawn kept on each element (data-* attributes),
// so a test reads a chart's data back and compares it with the analysis; and no fonts or
// scripts to embed, so a report stays a small file that opens offline.
package chart

import (
	"fmt"
	"html/template"
	"math"
	"strconv"
	"strings"
)

// Unit says how an axis's numbers are written.
type Unit string

// The units of the analyzer's numbers.
const (
	Seconds Unit = "seconds"
	Bytes   Unit = "bytes"
	Ratio   Unit = "ratio" // a share, written as a percentage
	Count   Unit = "count"
	PerSec  Unit = "per-second"
)

// Format writes v in unit u, short, for ticks and labels.
func Format(v float64, u Unit) string {
	switch u {
	case Seconds:
		a := math.Abs(v)
		switch {
		case a == 0:
			return "0"
		case a < 1e-3:
			return trim(v*1e6) + " µs"
		case a < 1:
			return trim(v*1e3) + " ms"
		case a < 120:
			return trim(v) + " s"
		default:
			return trim(v/60) + " min"
		}
	case Bytes:
		a := math.Abs(v)
		for _, p := range []struct {
			div  float64
			name string
		}{{1 << 40, "TiB"}, {1 << 30, "GiB"}, {1 << 20, "MiB"}, {1 << 10, "KiB"}} {
			if a >= p.div {
				return trim(v/p.div) + " " + p.name
			}
		}
		return trim(v) + " B"
	case Ratio:
		return trim(v*100) + "%"
	case PerSec:
		return trim(v) + "/s"
	}
	return trim(v)
}

// trim writes v with at most three significant digits and no trailing zeros.
func trim(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e6 {
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	s := strconv.FormatFloat(v, 'g', 3, 64)
	if strings.ContainsAny(s, "e") {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return s
}

// The drawing's size in SVG units; the page scales it to its width.
const (
	width  = 720.0
	height = 280.0
	left   = 70.0 // room for the y ticks
	right  = 16.0
	top    = 34.0 // the title and the legend
	bottom = 44.0 // the x ticks and the x label
)

// Series is one line of a line chart.
type Series struct {
	Name string
	X, Y []float64
}

// Band shades an x range, e.g. a phase of the run.
type Band struct {
	From, To float64
	Label    string
}

// Mark is a vertical line at x, e.g. the step where a density sweep collapsed.
type Mark struct {
	X     float64
	Label string
}

// Line is a line chart.
type Line struct {
	ID            string // the chart's id in the page, for tests and links
	Title         string
	XLabel        string
	XUnit, YUnit  Unit
	Series        []Series
	Bands         []Band
	Marks         []Mark
	Points        bool // a dot at every point (few points: density steps)
	StepsAsLabels bool // x values are whole numbers (densities): ticks at them
}

// scale maps data to drawing coordinates.
type scale struct{ d0, d1, p0, p1 float64 }

func (s scale) at(v float64) float64 {
	if s.d1 == s.d0 {
		return (s.p0 + s.p1) / 2
	}
	return s.p0 + (v-s.d0)/(s.d1-s.d0)*(s.p1-s.p0)
}

// niceTicks are about n round values covering [lo, hi], and the range they span.
func niceTicks(lo, hi float64, n int) (ticks []float64, t0, t1 float64) {
	if hi < lo {
		lo, hi = hi, lo
	}
	if hi == lo {
		if hi == 0 {
			hi = 1
		} else {
			lo, hi = lo-math.Abs(lo)/2, hi+math.Abs(hi)/2
		}
	}
	raw := (hi - lo) / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	t0 = math.Floor(lo/step) * step
	t1 = math.Ceil(hi/step) * step
	for v := t0; v <= t1+step/2; v += step {
		ticks = append(ticks, math.Round(v/step)*step)
	}
	return ticks, t0, t1
}

// svg builds one chart's markup.
type svg struct{ b strings.Builder }

func (s *svg) f(format string, a ...any) { fmt.Fprintf(&s.b, format, a...) }

func esc(v string) string { return template.HTMLEscapeString(v) }

func num(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }

// raw writes a data value exactly, for a test to read back.
func raw(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

func (s *svg) open(id, title, kind string) {
	s.f(`<svg class="chart" id="%s" data-chart="%s" viewBox="0 0 %s %s" role="img" aria-label="%s" xmlns="http://www.w3.org/2000/svg">`,
		esc(id), kind, num(width), num(height), esc(title))
	s.f(`<text class="title" x="%s" y="16">%s</text>`, num(left), esc(title))
}

// legendChar and legendGap are a legend name's estimated width per character and the room its
// swatch and the gap after it take.
const (
	legendChar = 7.0
	legendGap  = 22.0
)

// legend is one row, right-aligned, the last name rightmost; names too long for the row are
// cut in their middle (long cgroup paths differ at their end) and kept whole in a tooltip.
func (s *svg) legend(names []string) {
	total := 0.0
	for _, n := range names {
		total += legendChar*float64(len([]rune(n))) + legendGap
	}
	limit := 0
	if room := width - left - right; total > room && len(names) > 0 {
		limit = max(6, int((room/float64(len(names))-legendGap)/legendChar))
	}
	x := width - right
	for i := len(names) - 1; i >= 0; i-- {
		shown := names[i]
		if limit > 0 {
			shown = shorten(shown, limit)
		}
		x -= legendChar*float64(len([]rune(shown))) + legendGap
		s.f(`<g class="legend"><title>%s</title><rect class="s%d fill" x="%s" y="21" width="10" height="10"/><text x="%s" y="30">%s</text></g>`,
			esc(names[i]), i%palette, num(x), num(x+14), esc(shown))
	}
}

// palette is how many series colours the page's CSS defines (--c0 ...).
const palette = 8

func (s *svg) yAxis(ys scale, ticks []float64, u Unit) {
	for _, t := range ticks {
		y := ys.at(t)
		s.f(`<line class="grid" x1="%s" x2="%s" y1="%s" y2="%s"/>`, num(left), num(width-right), num(y), num(y))
		s.f(`<text class="tick" x="%s" y="%s" text-anchor="end">%s</text>`, num(left-6), num(y+4), esc(Format(t, u)))
	}
}

// SVG draws the chart; a chart without data says so instead.
func (l Line) SVG() template.HTML {
	var xs, ys []float64
	for _, s := range l.Series {
		for i := range min(len(s.X), len(s.Y)) {
			if !math.IsNaN(s.Y[i]) {
				xs, ys = append(xs, s.X[i]), append(ys, s.Y[i])
			}
		}
	}
	if len(xs) == 0 {
		return empty(l.ID, l.Title)
	}
	xlo, xhi := minmax(xs)
	for _, b := range l.Bands {
		xlo, xhi = math.Min(xlo, b.From), math.Max(xhi, b.To)
	}
	ylo, yhi := minmax(ys)
	if ylo > 0 { // from zero: a latency's height is read against nothing
		ylo = 0
	}
	yt, y0, y1 := niceTicks(ylo, yhi, 5)
	xsc := scale{xlo, xhi, left, width - right}
	ysc := scale{y0, y1, height - bottom, top + 8}
	var s svg
	s.open(l.ID, l.Title, "line")
	for i, b := range l.Bands {
		x0, x1 := xsc.at(b.From), xsc.at(b.To)
		s.f(`<rect class="band b%d" x="%s" y="%s" width="%s" height="%s" data-band="%s" data-from="%s" data-to="%s"/>`,
			i%2, num(x0), num(top+8), num(math.Max(x1-x0, 0)), num(height-bottom-top-8), esc(b.Label), raw(b.From), raw(b.To))
		s.f(`<text class="band-label" x="%s" y="%s">%s</text>`, num(x0+3), num(top+20), esc(b.Label))
	}
	s.yAxis(ysc, yt, l.YUnit)
	var xt []float64
	if l.StepsAsLabels {
		xt = distinct(xs, 10)
	} else {
		xt, _, _ = niceTicks(xlo, xhi, 6)
	}
	for _, t := range xt {
		if t < xlo-1e-9 || t > xhi+1e-9 {
			continue
		}
		x := xsc.at(t)
		s.f(`<line class="axis" x1="%s" x2="%s" y1="%s" y2="%s"/>`, num(x), num(x), num(height-bottom), num(height-bottom+4))
		s.f(`<text class="tick" x="%s" y="%s" text-anchor="middle">%s</text>`, num(x), num(height-bottom+16), esc(Format(t, l.XUnit)))
	}
	s.f(`<text class="label" x="%s" y="%s" text-anchor="middle">%s</text>`, num((left+width-right)/2), num(height-6), esc(l.XLabel))
	s.f(`<line class="axis" x1="%s" x2="%s" y1="%s" y2="%s"/>`, num(left), num(width-right), num(height-bottom), num(height-bottom))
	for _, m := range l.Marks {
		x := xsc.at(m.X)
		s.f(`<line class="mark" x1="%s" x2="%s" y1="%s" y2="%s" data-mark="%s" data-x="%s"/>`, num(x), num(x), num(top+8), num(height-bottom), esc(m.Label), raw(m.X))
		s.f(`<text class="mark-label" x="%s" y="%s" text-anchor="end">%s</text>`, num(x-4), num(top+34), esc(m.Label))
	}
	var names []string
	for i, se := range l.Series {
		names = append(names, se.Name)
		var pts, data []string
		for j := range min(len(se.X), len(se.Y)) {
			if math.IsNaN(se.Y[j]) {
				continue
			}
			pts = append(pts, num(xsc.at(se.X[j]))+","+num(ysc.at(se.Y[j])))
			data = append(data, raw(se.X[j])+","+raw(se.Y[j]))
		}
		s.f(`<polyline class="s%d line" points="%s" data-series="%s" data-points="%s"/>`, i%palette, strings.Join(pts, " "), esc(se.Name), strings.Join(data, " "))
		if l.Points || len(pts) == 1 {
			for _, p := range pts {
				x, y, _ := strings.Cut(p, ",")
				s.f(`<circle class="s%d fill" cx="%s" cy="%s" r="3"/>`, i%palette, x, y)
			}
		}
	}
	if len(names) > 1 || (len(names) == 1 && names[0] != "") {
		s.legend(names)
	}
	s.f(`</svg>`)
	return template.HTML(s.b.String())
}

// Bars is a bar chart: a group per category, a bar (or a slice of a stacked bar) per series.
type Bars struct {
	ID         string
	Title      string
	YUnit      Unit
	Categories []string
	Series     []BarSeries
	Stacked    bool
}

// BarSeries is one series of a bar chart, a value per category (NaN: none, no bar).
type BarSeries struct {
	Name   string
	Values []float64
}

// SVG draws the chart.
func (b Bars) SVG() template.HTML {
	if len(b.Categories) == 0 || len(b.Series) == 0 {
		return empty(b.ID, b.Title)
	}
	hi, measured := 0.0, false
	for c := range b.Categories {
		sum := 0.0
		for _, se := range b.Series {
			if c < len(se.Values) && !math.IsNaN(se.Values[c]) {
				measured = true
				if b.Stacked {
					sum += se.Values[c]
				} else {
					hi = math.Max(hi, se.Values[c])
				}
			}
		}
		hi = math.Max(hi, sum)
	}
	if !measured {
		return empty(b.ID, b.Title)
	}
	yt, y0, y1 := niceTicks(0, hi, 5)
	ysc := scale{y0, y1, height - bottom, top + 8}
	var s svg
	s.open(b.ID, b.Title, "bars")
	s.yAxis(ysc, yt, b.YUnit)
	slot := (width - right - left) / float64(len(b.Categories))
	per := len(b.Series)
	if b.Stacked {
		per = 1
	}
	barW := math.Min(slot*0.8/float64(per), 60)
	for c, cat := range b.Categories {
		cx := left + slot*(float64(c)+0.5)
		x0 := cx - barW*float64(per)/2
		base := 0.0
		for i, se := range b.Series {
			if c >= len(se.Values) || math.IsNaN(se.Values[c]) { // no value: no bar
				continue
			}
			v := se.Values[c]
			x := x0 + barW*float64(i)
			lo := 0.0
			if b.Stacked {
				x, lo = x0, base
				base += v
			}
			yTop, yBot := ysc.at(lo+v), ysc.at(lo)
			s.f(`<rect class="s%d fill bar" x="%s" y="%s" width="%s" height="%s" data-series="%s" data-category="%s" data-value="%s"><title>%s, %s: %s</title></rect>`,
				i%palette, num(x), num(yTop), num(barW*0.92), num(math.Max(yBot-yTop, 0)), esc(se.Name), esc(cat), raw(v), esc(cat), esc(se.Name), esc(Format(v, b.YUnit)))
		}
		s.f(`<text class="tick" x="%s" y="%s" text-anchor="middle">%s</text>`, num(cx), num(height-bottom+16), esc(shorten(cat, int(slot/7))))
	}
	s.f(`<line class="axis" x1="%s" x2="%s" y1="%s" y2="%s"/>`, num(left), num(width-right), num(height-bottom), num(height-bottom))
	var names []string
	for _, se := range b.Series {
		names = append(names, se.Name)
	}
	s.legend(names)
	s.f(`</svg>`)
	return template.HTML(s.b.String())
}

// empty stands for a chart the run has no data for.
func empty(id, title string) template.HTML {
	return template.HTML(fmt.Sprintf(`<p class="nodata" id="%s">%s: no data in this run.</p>`, esc(id), esc(title)))
}

func minmax(v []float64) (lo, hi float64) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, x := range v {
		lo, hi = math.Min(lo, x), math.Max(hi, x)
	}
	return lo, hi
}

// distinct are the distinct values of v in order, thinned to at most n.
func distinct(v []float64, n int) []float64 {
	seen := map[float64]bool{}
	var out []float64
	for _, x := range v {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	for len(out) > n {
		var half []float64
		for i := 0; i < len(out); i += 2 {
			half = append(half, out[i])
		}
		out = half
	}
	return out
}

// shorten cuts a category name to n characters in its middle, keeping its start (a metric's
// name) and its end (what tells pods apart); the bar's tooltip has it whole.
func shorten(s string, n int) string {
	r := []rune(s)
	if n < 5 || len(r) <= n {
		return s
	}
	head := (n - 1) / 2
	return string(r[:head]) + "…" + string(r[len(r)-(n-1-head):])
}
