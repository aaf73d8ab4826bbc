#!/usr/bin/env bash
# Builds kube-apiserver and the kubelet at KUBE_VERSION from the Go module proxy into the
# cache directory (NODECTL_KUBE_CACHE, default /var/cache/nodectl/kube-v$KUBE_VERSION), once:
# Debian ships neither. The build module is made here, in a temporary directory, never in the
# project's go.mod: it requires k8s.io/kubernetes and replaces each of its staging modules
# (read from its own go.mod, every "=> ./staging/..." line) with the matching v0 release.
set -euo pipefail
export PATH=/usr/local/go/bin:$PATH
V=${KUBE_VERSION:-1.37.2}
CACHE=${NODECTL_KUBE_CACHE:-/var/cache/nodectl/kube-v$V}
if [ -x "$CACHE/kube-apiserver" ] && [ -x "$CACHE/kubelet" ]; then
	exit 0
fi
echo "build-kube: building kube-apiserver and kubelet v$V into $CACHE (once; about 20 minutes cold on 2 vCPUs)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
go mod init nodectl.local/kube-build >/dev/null 2>&1
gomod=$(go mod download -json "k8s.io/kubernetes@v$V" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
go mod edit -require "k8s.io/kubernetes@v$V"
staging=$(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/.*#\1#p' "$gomod")
[ -n "$staging" ] || { echo "build-kube: no staging modules in $gomod" >&2; exit 1; }
for m in $staging; do
	go mod edit -replace "$m=$m@v0.${V#1.}"
done
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=v$V -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$V" | cut -d. -f2)"
mkdir -p "$work/out"
for cmd in kube-apiserver kubelet; do
	GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$work/out/$cmd" "k8s.io/kubernetes/cmd/$cmd"
done
mkdir -p "$CACHE"
mv "$work/out/kube-apiserver" "$work/out/kubelet" "$CACHE/"
du -sh "$CACHE"
