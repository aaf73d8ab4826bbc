// Package human writes measurements as a person reads them: the analyzer's explanations and
// every renderer of a report (text, HTML) say a time, a size, a share and a ratio alike.
package human

import (
	"fmt"
	"math"
)

// Seconds writes a duration in seconds with the unit that keeps it short: "1.23s", "192ms",
// "80µs".
func Seconds(s float64) string {
	switch {
	case s == 0:
		return "0"
	case s >= 1:
		return fmt.Sprintf("%.2fs", s)
	case s >= 1e-3:
		return fmt.Sprintf("%.3gms", s*1e3)
	default:
		return fmt.Sprintf("%.3gµs", s*1e6)
	}
}

// Bytes writes a size in binary units: "2.0 GiB", "512 B".
func Bytes(b float64) string {
	for _, u := range []struct {
		name string
		size float64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if b >= u.size {
			return fmt.Sprintf("%.1f %s", b/u.size, u.name)
		}
	}
	return fmt.Sprintf("%.0f B", b)
}

// Percent writes a ratio as a percentage, small ones (a p-value) with two significant digits.
func Percent(r float64) string {
	switch {
	case r == 0 || r >= 0.01:
		return fmt.Sprintf("%.0f%%", r*100)
	case r >= 1e-6:
		return fmt.Sprintf("%.2g%%", r*100)
	}
	return "<0.0001%"
}

// Factor writes a ratio as "5.8x"; a rise from zero is "from nothing".
func Factor(r float64) string {
	if math.IsInf(r, 1) {
		return "from nothing"
	}
	if r >= 10 {
		return fmt.Sprintf("%.0fx", r)
	}
	return fmt.Sprintf("%.1fx", r)
}
