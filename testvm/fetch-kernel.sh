#!/usr/bin/env bash
# Unpacks a Debian kernel package (and its modules) into the cache, once, without installing it:
# the host's /boot and /lib/modules stay as they were. PKG may be a meta-package
# (linux-image-cloud-amd64): it is resolved to the versioned image it depends on. Prints the
# directory (boot/vmlinuz-*, lib/modules/RELEASE/) on stdout.
set -euo pipefail
pkg=${1:?usage: fetch-kernel.sh PACKAGE}
cache=${NODECTL_VM_CACHE:-/var/cache/nodectl/vm-kernels}
# The package lists may be empty on a fresh machine: read them once before giving up.
if ! apt-cache show "$pkg" >/dev/null 2>&1; then
	apt-get update -qq >&2
fi
resolved=$pkg
for _ in 1 2 3; do
	dep=$(apt-cache depends "$resolved" 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*\)$/\1/p' | head -1)
	[ -n "$dep" ] || break
	resolved=$dep
done
version=$(apt-cache policy "$resolved" 2>/dev/null | sed -n 's/^ *Candidate: \(.*\)$/\1/p')
if [ -z "$version" ] || [ "$version" = "(none)" ]; then
	echo "fetch-kernel: no package $resolved (from $pkg) in the package lists; run apt-get update" >&2
	exit 1
fi
dir=$cache/$resolved
if ls "$dir"/boot/vmlinuz-* "$dir"/lib/modules/*/modules.dep >/dev/null 2>&1; then
	echo "$dir"
	exit 0
fi
echo "fetch-kernel: unpacking $resolved $version into $dir" >&2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
chmod 1777 "$work" # apt-get download drops to the _apt user
(cd "$work" && apt-get download -qq "$resolved=$version" >&2)
mkdir -p "$work/root"
dpkg-deb -x "$work"/*.deb "$work/root"
# modules.dep is made at install time, not shipped: make it for the unpacked tree.
release=$(basename "$work"/root/lib/modules/*)
depmod -b "$work/root" "$release"
mkdir -p "$cache"
rm -rf "$dir"
mv "$work/root" "$dir"
echo "$dir"
