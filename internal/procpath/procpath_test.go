package procpath

import (
	"strings"
	"testing"
)

func TestProcPath(t *testing.T) {
	for _, p := range []string{"/var/swap", "/var/my swap\tfile\\x", "/a\nb"} {
		e := Escape(p)
		if strings.ContainsAny(e, " \t\n") || Unescape(e) != p {
			t.Errorf("%q escapes to %q, back to %q", p, e, Unescape(e))
		}
	}
	if got := Escape("/a b"); got != `/a\040b` {
		t.Errorf("Escape(%q) = %q, want %q", "/a b", got, `/a\040b`)
	}
	for in, want := range map[string]string{`/a\040b`: "/a b", `/a\134b`: `/a\b`, `/plain`: "/plain", `/end\04`: `/end\04`, `/a\9999`: `/a\9999`} {
		if got := Unescape(in); got != want {
			t.Errorf("Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}
