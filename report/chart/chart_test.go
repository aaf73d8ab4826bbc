package chart

import (
	"encoding/xml"
	"math"
	"strconv"
	"strings"
	"testing"
)

// element is any SVG element with its attributes, for reading a chart back.
type element struct {
	XMLName xml.Name
	Attrs   []xml.Attr `xml:",any,attr"`
	Kids    []element  `xml:",any"`
	Text    string     `xml:",chardata"`
}

func (e element) attr(name string) string {
	for _, a := range e.Attrs {
		if a.Name.Local == name {
			return a.Value
		}
	}
	return ""
}

func (e element) walk(fn func(element)) {
	fn(e)
	for _, k := range e.Kids {
		k.walk(fn)
	}
}

func parse(t *testing.T, markup string) element {
	t.Helper()
	var root element
	if err := xml.Unmarshal([]byte(markup), &root); err != nil {
		t.Fatalf("the chart is not well-formed XML: %v\n%s", err, markup)
	}
	return root
}

// A line chart keeps each series' numbers on its polyline, and its phases and marks on theirs,
// exactly as given.
func TestLineReadsBack(t *testing.T) {
	l := Line{ID: "probe", Title: "victim cpu_work", XLabel: "time (s)", XUnit: Seconds, YUnit: Seconds,
		Series: []Series{{Name: "cpu_work", X: []float64{0, 1.5, 3}, Y: []float64{0.012, 0.0311, 0.009}}, {Name: "fsync", X: []float64{0, 3}, Y: []float64{0.2, math.NaN()}}},
		Bands:  []Band{{From: 0, To: 1, Label: "baseline"}, {From: 1, To: 3, Label: "stress"}},
		Marks:  []Mark{{X: 2, Label: "collapse"}}}
	root := parse(t, string(l.SVG()))
	if root.attr("id") != "probe" || root.attr("data-chart") != "line" {
		t.Errorf("root %v", root.Attrs)
	}
	got := map[string]string{}
	var bands []string
	var marks []string
	root.walk(func(e element) {
		switch {
		case e.XMLName.Local == "polyline":
			got[e.attr("data-series")] = e.attr("data-points")
		case e.attr("data-band") != "":
			bands = append(bands, e.attr("data-band")+":"+e.attr("data-from")+"-"+e.attr("data-to"))
		case e.attr("data-mark") != "":
			marks = append(marks, e.attr("data-mark")+"@"+e.attr("data-x"))
		}
	})
	if got["cpu_work"] != "0,0.012 1.5,0.0311 3,0.009" || got["fsync"] != "0,0.2" {
		t.Errorf("series read back %q", got)
	}
	if strings.Join(bands, " ") != "baseline:0-1 stress:1-3" || strings.Join(marks, " ") != "collapse@2" {
		t.Errorf("bands %q, marks %q", bands, marks)
	}
	if !strings.Contains(string(l.SVG()), ">50 ms<") {
		t.Errorf("no tick written in milliseconds:\n%s", l.SVG())
	}
}

// A stacked bar chart keeps each slice's value; the tallest stack fits under the top tick.
func TestBarsReadBack(t *testing.T) {
	b := Bars{ID: "wake", Title: "wake p50", YUnit: Seconds, Categories: []string{"50m", "1"}, Stacked: true,
		Series: []BarSeries{{Name: "throttled", Values: []float64{7.5, 0}}, {Name: "other", Values: []float64{1.2, 1.1}}}}
	root := parse(t, string(b.SVG()))
	vals := map[string]float64{}
	var tops []float64
	root.walk(func(e element) {
		if e.attr("data-value") != "" {
			v, err := strconv.ParseFloat(e.attr("data-value"), 64)
			if err != nil {
				t.Fatal(err)
			}
			vals[e.attr("data-category")+"/"+e.attr("data-series")] = v
			y, _ := strconv.ParseFloat(e.attr("y"), 64)
			tops = append(tops, y)
		}
	})
	want := map[string]float64{"50m/throttled": 7.5, "50m/other": 1.2, "1/throttled": 0, "1/other": 1.1}
	for k, v := range want {
		if vals[k] != v {
			t.Errorf("%s = %v, want %v (all %v)", k, vals[k], v, vals)
		}
	}
	for _, y := range tops {
		if y < top {
			t.Errorf("a bar reaches y %v, above the plot", y)
		}
	}
}

func TestFormat(t *testing.T) {
	for _, c := range []struct {
		v    float64
		u    Unit
		want string
	}{
		{0.0123, Seconds, "12.3 ms"}, {0.0000025, Seconds, "2.5 µs"}, {2.5, Seconds, "2.5 s"}, {600, Seconds, "10 min"},
		{1.5 * (1 << 30), Bytes, "1.5 GiB"}, {512, Bytes, "512 B"}, {0.35, Ratio, "35%"}, {120, Count, "120"}, {3, PerSec, "3/s"},
	} {
		if got := Format(c.v, c.u); got != c.want {
			t.Errorf("Format(%v, %s) = %q, want %q", c.v, c.u, got, c.want)
		}
	}
}

// Nothing to draw is said, not drawn.
func TestEmpty(t *testing.T) {
	if got := string((Line{ID: "x", Title: "PSI"}).SVG()); !strings.Contains(got, "no data") {
		t.Errorf("empty line chart: %s", got)
	}
	nothing := Bars{ID: "y", Title: "fsync", Categories: []string{"baseline", "stress"}, Series: []BarSeries{{Name: "traced", Values: []float64{math.NaN(), math.NaN()}}}}
	if got := string(nothing.SVG()); !strings.Contains(got, "no data") {
		t.Errorf("bars of no measurement: %s", got)
	}
}

// A legend of long names (cgroup paths) stays inside the chart: the names are cut in their
// middle, keeping the end that tells them apart, and each is whole in its tooltip.
func TestLongLegendFits(t *testing.T) {
	names := []string{"/nodectl/test-agent-14220/hog-1", "/nodectl/test-agent-14220/hog-0", "<kernel>", "/nodectl/test-agent-14220/victim", "/"}
	b := Bars{ID: "culprits", Title: "wait", YUnit: Seconds, Stacked: true, Categories: []string{"baseline", "window"}}
	for _, n := range names {
		b.Series = append(b.Series, BarSeries{Name: n, Values: []float64{1, 2}})
	}
	var tips, shown []string
	parse(t, string(b.SVG())).walk(func(e element) {
		if e.XMLName.Local != "g" || e.attr("class") != "legend" {
			return
		}
		for _, k := range e.Kids {
			switch k.XMLName.Local {
			case "title":
				tips = append(tips, k.Text)
			case "rect":
				if x, _ := strconv.ParseFloat(k.attr("x"), 64); x < left {
					t.Errorf("legend swatch at x=%g, left of the plot (%g)", x, left)
				}
			case "text":
				shown = append(shown, k.Text)
			}
		}
	})
	if strings.Join(tips, ",") != strings.Join([]string{"/", "/nodectl/test-agent-14220/victim", "<kernel>", "/nodectl/test-agent-14220/hog-0", "/nodectl/test-agent-14220/hog-1"}, ",") {
		t.Errorf("legend tooltips %q, want every name whole", tips)
	}
	if !strings.HasSuffix(shown[len(shown)-1], "hog-1") || !strings.Contains(shown[len(shown)-1], "…") {
		t.Errorf("legend shows %q; want long names cut in the middle, keeping their end", shown)
	}
}
