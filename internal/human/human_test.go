package human

import (
	"math"
	"testing"
)

func TestFormats(t *testing.T) {
	for got, want := range map[string]string{
		Seconds(0):          "0",
		Seconds(1.234):      "1.23s",
		Seconds(0.192):      "192ms",
		Seconds(80e-6):      "80µs",
		Bytes(2 << 30):      "2.0 GiB",
		Bytes(512):          "512 B",
		Percent(0.925):      "92%",
		Percent(0.00042):    "0.042%",
		Percent(1e-9):       "<0.0001%",
		Factor(5.789):       "5.8x",
		Factor(12.4):        "12x",
		Factor(math.Inf(1)): "from nothing",
	} {
		if got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
}
