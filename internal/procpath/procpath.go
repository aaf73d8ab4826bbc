// Package procpath escapes and unescapes paths as the kernel prints them in /proc/swaps and
// mountinfo.
package procpath

import (
	"fmt"
	"strconv"
	"strings"
)

// Escape is p as the kernel prints a path in /proc/swaps and mountinfo: space, tab,
// newline and backslash as \ooo (octal), so a line's fields stay separated by white space.
func Escape(p string) string {
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		switch c := p[i]; c {
		case ' ', '\t', '\n', '\\':
			fmt.Fprintf(&b, "\\%03o", c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// Unescape undoes Escape: each \ooo becomes its byte; a backslash not followed
// by three octal digits stays as it is.
func Unescape(p string) string {
	if !strings.Contains(p, `\`) {
		return p
	}
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		if p[i] == '\\' && i+4 <= len(p) {
			if n, err := strconv.ParseUint(p[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(p[i])
	}
	return b.String()
}
