// Package badvalue is the error of a bad setting below the CLI. A package that checks its
// configuration names the setting as its configuration calls it (a field) and the value; only
// the CLI knows which flag set the field, so it names the flag instead (Name). One package's
// errors then read right in `nodectl stress --hog ...` and in an agent given a config file.
package badvalue

import (
	"errors"
	"fmt"
	"strings"
)

// Error is a bad value of one setting.
type Error struct {
	Field string // the setting, as its configuration names it: "Hogs", "CPULimits", "Runtime"
	Value string // the value as given; "" when the setting as a whole is wrong
	Err   error  // why
	// Flag is the command-line flag that set the field, filled in by the CLI; when set, the
	// message names it instead of the field.
	Flag string
}

// New is a bad value of field.
func New(field, value string, err error) *Error { return &Error{Field: field, Value: value, Err: err} }

// Errorf is a bad value of field, why formatted as fmt.Errorf does (%w wraps).
func Errorf(field, value, format string, args ...any) *Error {
	return New(field, value, fmt.Errorf(format, args...))
}

func (e *Error) Error() string {
	name := e.Field
	if e.Flag != "" {
		name = e.Flag
	}
	if e.Value == "" {
		return name + ": " + e.Err.Error()
	}
	return name + " " + e.Value + ": " + e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// Name returns err with every Error in its tree whose field flags knows naming that flag. The
// messages of errors wrapping one were made when they were (fmt.Errorf), so the result carries
// the rewritten message and unwraps to err: errors.Is and errors.As see what they saw before.
func Name(err error, flags map[string]string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	renamed := false
	var walk func(error)
	walk = func(e error) {
		if be, ok := e.(*Error); ok {
			if f, ok := flags[be.Field]; ok && be.Flag != f {
				old := be.Error()
				be.Flag = f
				msg = strings.Replace(msg, old, be.Error(), 1)
				renamed = true
			}
		}
		switch u := e.(type) {
		case interface{ Unwrap() []error }:
			for _, c := range u.Unwrap() {
				walk(c)
			}
		case interface{ Unwrap() error }:
			if c := u.Unwrap(); c != nil {
				walk(c)
			}
		}
	}
	walk(err)
	if !renamed {
		return err
	}
	return &named{msg: msg, err: err}
}

// named is an error whose message names flags; it unwraps to the original.
type named struct {
	msg string
	err error
}

func (n *named) Error() string { return n.msg }
func (n *named) Unwrap() error { return n.err }

// Is reports whether err is a bad value of field.
func Is(err error, field string) bool {
	var be *Error
	return errors.As(err, &be) && be.Field == field
}
