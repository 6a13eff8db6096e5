#!/usr/bin/env bash
# Builds static physd binaries for Raspberry Pi-class gateways and x86, and
# Debian packages of them:
#   deploy/release.sh [VERSION]
#   → dist/physd-VERSION-linux-{arm64,armv6,armv7,amd64}(.sha256)
#   → dist/physd_DEBVERSION_{arm64,armhf,amd64}.deb(.sha256)
# The armhf package carries the armv6 binary, so one package serves Raspberry
# Pi OS (32-bit, ARMv6 hard-float, Pi Zero/1) and Debian armhf (ARMv7).
set -euo pipefail
# physd builds with go1.27.3 (go.mod); machines that pin GOTOOLCHAIN=local need it named.
export GOTOOLCHAIN=go1.27.3
cd "$(dirname "$0")/.."
version=${1:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
# Stamp the commit (physd version) even where GOFLAGS=-buildvcs=false; a
# tree without git builds without it.
vcs=-buildvcs=false
git rev-parse --git-dir >/dev/null 2>&1 && vcs=-buildvcs=true
mkdir -p dist
for target in linux/arm64 linux/arm/6 linux/arm/7 linux/amd64; do
  IFS=/ read -r goos goarch goarm <<<"$target"
  name="physd-$version-$goos-$goarch${goarm:+v$goarm}"
  CGO_ENABLED=0 GOOS=$goos GOARCH=$goarch GOARM=${goarm:-} \
    go build $vcs -trimpath -ldflags "-s -w -X main.version=$version" -o "dist/$name" ./cmd/physd
  (cd dist && sha256sum "$name" > "$name.sha256")
  echo "dist/$name $(du -h "dist/$name" | cut -f1)"
done
for pair in arm64:arm64 armhf:armv6 amd64:amd64; do
  deb=$(deploy/deb/build.sh "${pair%%:*}" "$version" "dist/physd-$version-linux-${pair#*:}" dist)
  (cd dist && sha256sum "$(basename "$deb")" > "$(basename "$deb").sha256")
  echo "$deb $(du -h "$deb" | cut -f1)"
done
