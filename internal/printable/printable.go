// Package printable keeps names that anybody on a node may choose (a process's name, a
// cgroup's directory) from acting on a person's terminal: control characters are shown as
// escapes, never sent as they are.
package printable

import (
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// Escape is s with every control character, backslash and byte that is not UTF-8 escaped, as
// the kernel prints a task's name in /proc/<pid>/status: `\n`, `\t`, `\\`, else `\xNN`. A
// process's name may hold a newline, which would start a line of its own in a text report.
func Escape(s string) string {
	if !needsEscape(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case isControl(r):
			writeControl(&b, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

func needsEscape(s string) bool {
	for _, r := range s {
		if r == utf8.RuneError || r == '\\' || r == '\n' || r == '\t' || isControl(r) {
			return true
		}
	}
	return false
}

// isControl: C0 controls, DEL and the C1 controls a terminal may obey (U+009B starts a CSI
// sequence as ESC [ does).
func isControl(r rune) bool { return r < 0x20 || r >= 0x7f && r <= 0x9f }

// writeControl writes r's escape: `\xNN` for one byte, `\u00NN` for a C1 control.
func writeControl(w io.Writer, r rune) {
	if r < 0x80 {
		fmt.Fprintf(w, `\x%02x`, r)
		return
	}
	fmt.Fprintf(w, `\u%04x`, r)
}

// Writer passes text to w with control characters escaped, but for the line breaks and tabs
// of the text itself (and carriage returns when keepCR: a progress line redrawn in place).
// Names inside the text cannot bring a newline (a cgroup's cannot hold one, and process names
// are Escaped where they are read), so what remains to keep off the terminal is the rest: an
// escape sequence in a cgroup's name that would clear the screen or retitle the window.
func Writer(w io.Writer, keepCR bool) io.Writer { return &writer{w: w, keepCR: keepCR} }

type writer struct {
	w      io.Writer
	keepCR bool
	held   []byte // the start of a UTF-8 sequence a write ended in
	buf    []byte
}

func (x *writer) Write(p []byte) (int, error) {
	in := p
	if len(x.held) > 0 {
		in = append(x.held, p...)
		x.held = nil
	}
	out := x.buf[:0]
	for i := 0; i < len(in); {
		c := in[i]
		if c < utf8.RuneSelf {
			if isControl(rune(c)) && c != '\n' && c != '\t' && !(x.keepCR && c == '\r') {
				out = fmt.Appendf(out, `\x%02x`, c)
			} else {
				out = append(out, c)
			}
			i++
			continue
		}
		if !utf8.FullRune(in[i:]) {
			x.held = append(x.held[:0], in[i:]...)
			break
		}
		r, n := utf8.DecodeRune(in[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			out = fmt.Appendf(out, `\x%02x`, c)
		case isControl(r):
			out = fmt.Appendf(out, `\u%04x`, r)
		default:
			out = append(out, in[i:i+n]...)
		}
		i += n
	}
	x.buf = out
	if _, err := x.w.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}
