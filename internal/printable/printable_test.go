package printable

import (
	"bytes"
	"testing"
)

func TestEscape(t *testing.T) {
	for in, want := range map[string]string{
		"java":                        "java",
		"<b>\nFORGED \"x'":            `<b>\nFORGED "x'`,
		"a\\b\tc":                     `a\\b\tc`,
		"\x1b[2Jclear":                `\x1b[2Jclear`,
		"bad\xffutf8":                 `bad\xffutf8`,
		"c1\u009b31m":                 `c1\u009b31m`,
		"naïve 名前":                    "naïve 名前",
		"del\x7f":                     `del\x7f`,
		"evil <img src=x> & \"q\" ,=": "evil <img src=x> & \"q\" ,=",
	} {
		if got := Escape(in); got != want {
			t.Errorf("Escape(%q) = %q, want %q", in, got, want)
		}
	}
}

// The writer keeps lines, tabs and (when asked) carriage returns, escapes the other controls,
// and decodes a UTF-8 sequence split across writes whole.
func TestWriter(t *testing.T) {
	var b bytes.Buffer
	w := Writer(&b, false)
	for _, p := range []string{"a\tb\n", "\x1b]0;title\x07", "\r", "名"[:1], "名"[1:], "\xc2", "\x9b", "\xff\n"} {
		if n, err := w.Write([]byte(p)); err != nil || n != len(p) {
			t.Fatalf("Write(%q) = %d, %v", p, n, err)
		}
	}
	if want := "a\tb\n" + `\x1b]0;title\x07\x0d` + "名" + `\u009b\xff` + "\n"; b.String() != want {
		t.Errorf("wrote %q, want %q", b.String(), want)
	}
	b.Reset()
	Writer(&b, true).Write([]byte("\rprogress\x1b"))
	if want := "\rprogress" + `\x1b`; b.String() != want {
		t.Errorf("with carriage returns kept: %q, want %q", b.String(), want)
	}
}
