//go:build !linux

package journald

import "errors"

var errNoBind = errors.New("bind mounts need Linux")

func bindMount(string, string) error { return errNoBind }

func unmount(string) error { return errNoBind }
