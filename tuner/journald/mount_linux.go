package journald

import "golang.org/x/sys/unix"

func bindMount(source, target string) error {
	return unix.Mount(source, target, "", unix.MS_BIND, "")
}

func unmount(target string) error {
	return unix.Unmount(target, unix.MNT_DETACH)
}
