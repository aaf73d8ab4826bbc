package agentsrc

import (
	"strings"
	"testing"
	"time"
)

func TestParseTime(t *testing.T) {
	now := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"now":                       now,
		"15m":                       now.Add(-15 * time.Minute),
		"-15m":                      now.Add(-15 * time.Minute),
		"2026-12-01T02:00:00Z":      now.Add(-time.Hour),
		"2026-12-01T02:00:00.5Z":    now.Add(-time.Hour + 500*time.Millisecond),
		"2026-12-01T04:00:00+01:00": now,
	} {
		got, err := ParseTime("from", in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("ParseTime(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := ParseTime("at", "yesterday", now); err == nil || !strings.Contains(err.Error(), `--at "yesterday"`) {
		t.Errorf("a bad time gave %v, want the flag and the value named", err)
	}
}

func TestParseWindow(t *testing.T) {
	now := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	w, err := ParseWindow("30m", "20m", 5*time.Minute, "/a", now)
	if err != nil {
		t.Fatal(err)
	}
	if !w.From.Equal(now.Add(-30*time.Minute)) || !w.To.Equal(now.Add(-20*time.Minute)) ||
		!w.BaselineFrom.Equal(now.Add(-35*time.Minute)) || w.Cgroup != "/a" {
		t.Errorf("window %+v", w)
	}
	for _, tc := range []struct {
		from, to string
		baseline time.Duration
		want     string
	}{
		{"", "now", time.Minute, "--from is required"},
		{"10m", "20m", time.Minute, "is not after --from"},
		{"10m", "now", 0, "--baseline 0s"},
		{"10m", "later", time.Minute, `--to "later"`},
	} {
		if _, err := ParseWindow(tc.from, tc.to, tc.baseline, "", now); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseWindow(%q, %q, %v): %v, want %q", tc.from, tc.to, tc.baseline, err, tc.want)
		}
	}
}
