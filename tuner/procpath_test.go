package tuner

import (
	"strings"
	"testing"
)

func TestProcPath(t *testing.T) {
	for _, p := range []string{"/var/swap", "/var/my swap\tfile\\x", "/a\nb"} {
		e := EscapeProcPath(p)
		if strings.ContainsAny(e, " \t\n") || UnescapeProcPath(e) != p {
			t.Errorf("%q escapes to %q, back to %q", p, e, UnescapeProcPath(e))
		}
	}
	if got := EscapeProcPath("/a b"); got != `/a\040b` {
		t.Errorf("EscapeProcPath(%q) = %q, want %q", "/a b", got, `/a\040b`)
	}
	for in, want := range map[string]string{`/a\040b`: "/a b", `/a\134b`: `/a\b`, `/plain`: "/plain", `/end\04`: `/end\04`, `/a\9999`: `/a\9999`} {
		if got := UnescapeProcPath(in); got != want {
			t.Errorf("UnescapeProcPath(%q) = %q, want %q", in, got, want)
		}
	}
}
