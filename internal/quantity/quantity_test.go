package quantity

import "testing"

func TestFormatRoundTrip(t *testing.T) {
	for _, v := range []string{"250m", "1", "1500m"} {
		m, err := ParseCPU(v)
		if err != nil {
			t.Fatal(err)
		}
		if back := FormatCPU(m); back != v {
			t.Errorf("FormatCPU(ParseCPU(%q)) = %q", v, back)
		}
	}
	if got := FormatSize(512 << 20); got != "512Mi" {
		t.Errorf("FormatSize = %q", got)
	}
}
