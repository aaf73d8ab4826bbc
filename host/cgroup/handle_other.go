//go:build !linux

package cgroup

import "errors"

// byHandle needs Linux; the resolver walks instead.
func byHandle(string, uint64) (string, error) { return "", errors.ErrUnsupported }

func rootDir(string) (int, error) { return -1, errors.ErrUnsupported }

func byHandleExistsAt(int, uint64) error { return errors.ErrUnsupported }
